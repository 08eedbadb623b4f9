"""Sessions on the store's engine, shared by every table group of the store.

:class:`Sessions` is the one place that opens read and write transactions and
appends events inside them, so the run/attempt tables (:class:`SqlStore`), the
checkpoint tables (:class:`CheckpointStore`) and the drift tables
(:class:`DriftStore`) commit their changes atomically with their events without
reaching into each other's private methods.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine
from sqlmodel import Session

from ..errors import StoreError
from ..interfaces import NewEvent
from .tables import EventRow

# pg_advisory_xact_lock key serializing event inserts ("b300" in ASCII, then 2).
_EVENT_LOCK = 0x62333030_0002
#: Execution option marking write transactions (on SQLite they BEGIN IMMEDIATE).
WRITE_OPTION = "b300_write"


class Sessions:
    """Read and write transactions on one engine, and the event log inside them."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = engine.execution_options(**{WRITE_OPTION: True})
        self.url = engine.url
        #: Stamped on every event appended from now on (the active daemon's identity).
        self.daemon_identity: str | None = None

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session in one write transaction, committed on success."""
        with store_errors(self.url), Session(self._writer) as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reading; its transaction is rolled back on exit."""
        with store_errors(self.url), Session(self._engine) as session:
            yield session

    def add_events(
        self,
        session: Session,
        events: Sequence[NewEvent],
        now: datetime,
        *,
        run_id: str | None = None,
        attempt_id: int | None = None,
        flush: bool = True,
    ) -> list[EventRow]:
        """Append ``events`` in ``session``'s transaction; a ``None`` run/attempt of an
        event is filled in with ``run_id``/``attempt_id``. ``flush=False`` leaves the
        INSERTs to the caller's next flush (a batch of many)."""
        if not events:
            return []
        if session.get_bind().dialect.name == "postgresql":
            # Sequence values are handed out at INSERT but become visible at
            # COMMIT, so concurrent writers could commit id 7 after a reader
            # paging with after_id saw 8. Holding this lock to commit keeps
            # ids visible in order. It is taken after every row lock, last.
            session.connection().execute(
                sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _EVENT_LOCK}
            )
        rows = [
            EventRow(
                ts=now,
                kind=ev.kind,
                run_id=ev.run_id if ev.run_id is not None else run_id,
                attempt_id=ev.attempt_id if ev.attempt_id is not None else attempt_id,
                node=ev.node,
                actor=ev.actor,
                data=json.dumps(ev.data, sort_keys=True),
                daemon=self.daemon_identity,
            )
            for ev in events
        ]
        session.add_all(rows)
        if flush:
            session.flush()
        return rows


# -- database errors -----------------------------------------------------------


@contextmanager
def store_errors(url: URL) -> Iterator[None]:
    """Turn database failures into a one-line StoreError naming the (masked) URL."""
    try:
        yield
    except (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError) as exc:
        raise StoreError(f"state store unavailable ({masked(url)}): {_reason(exc, url)}") from exc
    except sa_exc.DBAPIError as exc:
        raise StoreError(f"state store error ({masked(url)}): {_reason(exc, url)}") from exc


def masked(url: URL) -> str:
    """The URL as text with its password replaced by ***."""
    return url.render_as_string(hide_password=True)


def _reason(exc: BaseException, url: URL) -> str:
    """The first line of the driver's message, without the password if it echoes it."""
    text = str(getattr(exc, "orig", None) or exc)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    if url.password:
        line = line.replace(str(url.password), "***")
    return line[:300]
