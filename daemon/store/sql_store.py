"""The state store on SQLite or PostgreSQL, through SQLModel/SQLAlchemy sessions.

:class:`SqlStore` implements :class:`b300.interfaces.Store`; the table rows of
:mod:`b300.store.tables` never leave this module, callers get the frozen
records of :mod:`b300.model`. Engines are built and migrated by
:func:`b300.store.open_store`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from ..errors import NotFoundError, UsageError
from ..events import Kind
from ..interfaces import AttemptUpdate, NewEvent
from ..model import Attempt, AttemptState, Run, RunState
from .checkpoint_store import CheckpointStore
from .drift_store import DriftStore
from .log_store import LogStore, require_aware
from .sessions import Sessions
from .tables import (
    AttemptRow,
    RunRow,
    join_nodes,
    to_attempt,
    to_run,
)

_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_ACTIVE_STATES = [s.value for s in AttemptState if not s.is_terminal]


class SqlStore(LogStore):
    """:class:`b300.interfaces.Store` on a SQLAlchemy engine (see that contract).

    Built by :func:`open_store`. Thread-safe: every call runs in its own
    session and transaction. Beyond the protocol it has :attr:`url` (password
    hidden) and can be used as a context manager that closes it.

    Where the contract is silent: events passed to a run-, attempt- or
    node-scoped method get that run/attempt/node filled in when they leave
    it ``None`` (``begin_attempt``'s events cannot know the new attempt's id);
    ``events(run_id=...)`` of a run with no events is ``[]``, not an error.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sessions = Sessions(engine)
        self._url = engine.url
        #: Checkpoint bookkeeping and version-drift state, in the same database and
        #: transactions (their writes commit atomically with their events).
        self.checkpoints = CheckpointStore(self._sessions)
        self.drift = DriftStore(self._sessions)

    @property
    def daemon_identity(self) -> str | None:
        """Stamped on every event appended through this store (the daemon sets it
        to its identity and lease epoch once active)."""
        return self._sessions.daemon_identity

    @daemon_identity.setter
    def daemon_identity(self, value: str | None) -> None:
        self._sessions.daemon_identity = value

    @property
    def url(self) -> str:
        """The database URL with its password masked, for messages and logs."""
        return self._url.render_as_string(hide_password=True)

    # -- runs ---------------------------------------------------------------

    def create_run(
        self, run_id: str, name: str, spec_toml: str, now: datetime, events: Sequence[NewEvent] = ()
    ) -> Run:
        """Record a new run in state SUBMITTING.

        Raises UsageError for a duplicate id or one not matching
        ``^[a-z0-9][a-z0-9-]{0,62}$`` (it ends up in Slurm job names and paths).
        """
        if not _RUN_ID.fullmatch(run_id):
            raise UsageError(
                f"invalid run id {run_id!r}: use 1-63 lowercase letters, digits and '-',"
                " starting with a letter or digit"
            )
        require_aware(now)
        with self._sessions.write() as session:
            if session.get(RunRow, run_id) is not None:
                raise UsageError(f"run '{run_id}' already exists")
            row = RunRow(
                id=run_id,
                name=name,
                spec_toml=spec_toml,
                state=RunState.SUBMITTING.value,
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            # Backstop for two creators racing on PostgreSQL.
            _flush_or(session, UsageError(f"run '{run_id}' already exists"))
            self._sessions.add_events(session, events, now, run_id=run_id)
            return to_run(row, 0)

    def get_run(self, run_id: str) -> Run:
        with self._sessions.read() as session:
            row = _get_run_row(session, run_id)
            return to_run(row, _attempt_counts(session, run_id).get(run_id, 0))

    def list_runs(self, states: Iterable[RunState] | None = None) -> list[Run]:
        """Runs, newest first (ties by id), optionally only those in ``states``."""
        query = select(RunRow)
        if states is not None:
            query = query.where(col(RunRow.state).in_([RunState(s).value for s in states]))
        query = query.order_by(col(RunRow.created_at).desc(), col(RunRow.id).desc())
        with self._sessions.read() as session:
            rows = session.exec(query).all()
            counts = _attempt_counts(session)
            return [to_run(row, counts.get(row.id, 0)) for row in rows]

    def set_run_state(
        self, run_id: str, state: RunState, now: datetime, events: Sequence[NewEvent] = (),
        *, actor: str = "daemon",
    ) -> Run:
        """Set the run's state (any transition; the store does not judge them); a change
        is recorded as a ``run.state`` event (``from``/``to``, by ``actor``) after ``events``
        and moves ``updated_at``; setting the state it has only appends ``events``."""
        require_aware(now)
        with self._sessions.write() as session:
            row = _get_run_row(session, run_id)
            events = list(events)
            if row.state != RunState(state).value:
                events.append(NewEvent(Kind.RUN_STATE, actor=actor, data={
                    "from": row.state, "to": RunState(state).value}))
                row.state = RunState(state).value
                row.updated_at = now
                session.flush()
            self._sessions.add_events(session, events, now, run_id=run_id)
            return to_run(row, _attempt_counts(session, run_id).get(run_id, 0))

    # -- attempts -----------------------------------------------------------

    def begin_attempt(
        self,
        run_id: str,
        now: datetime,
        *,
        excluded_nodes: Sequence[str] = (),
        resume_from: str | None = None,
        events: Sequence[NewEvent] = (),
    ) -> Attempt:
        """Record the intent to submit the run's next attempt (state SUBMITTING).

        Numbered one more than the run's last, tagged ``b300-<run_id>-a<n>``.
        Raises UsageError while the run has a non-terminal attempt, also when
        two callers race: the run row is locked first (``FOR UPDATE`` on
        PostgreSQL; SQLite write transactions are ``BEGIN IMMEDIATE``), and the
        unique (run_id, number) constraint backs that up.
        """
        require_aware(now)
        excluded = join_nodes(excluded_nodes)
        with self._sessions.write() as session:
            _get_run_row(session, run_id, for_update=True)
            active = session.exec(
                select(AttemptRow)
                .where(col(AttemptRow.run_id) == run_id)
                .where(col(AttemptRow.state).in_(_ACTIVE_STATES))
                .order_by(col(AttemptRow.number))
                .limit(1)
            ).first()
            if active is not None:
                raise UsageError(
                    f"run '{run_id}' already has attempt {active.number} in state {active.state}"
                )
            last = session.exec(
                select(func.max(AttemptRow.number)).where(col(AttemptRow.run_id) == run_id)
            ).one()
            number = (last or 0) + 1
            row = AttemptRow(
                run_id=run_id,
                number=number,
                tag=f"b300-{run_id}-a{number}",
                state=AttemptState.SUBMITTING.value,
                excluded_nodes=excluded,
                resume_from=resume_from,
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            _flush_or(session, UsageError(f"run '{run_id}' had another attempt begun meanwhile"))
            self._sessions.add_events(session, events, now, run_id=run_id, attempt_id=row.id)
            return to_attempt(row)

    def confirm_attempt(
        self, attempt_id: int, slurm_job_id: int, now: datetime, events: Sequence[NewEvent] = ()
    ) -> Attempt:
        """Record that the attempt reached Slurm as ``slurm_job_id`` (state PENDING).

        Only a SUBMITTING attempt can be confirmed (UsageError otherwise), so a
        second sbatch for the same intent cannot overwrite the first job id.
        """
        require_aware(now)
        with self._sessions.write() as session:
            row = _get_attempt_row(session, attempt_id)
            if row.state != AttemptState.SUBMITTING.value:
                raise UsageError(
                    f"attempt {attempt_id} ({row.tag}) is {row.state}, not SUBMITTING;"
                    " it cannot be confirmed"
                )
            row.slurm_job_id = slurm_job_id
            row.state = AttemptState.PENDING.value
            row.updated_at = now
            session.flush()
            self._sessions.add_events(session, events, now, run_id=row.run_id, attempt_id=attempt_id)
            return to_attempt(row)

    def update_attempt(
        self,
        attempt_id: int,
        now: datetime,
        *,
        state: AttemptState | None = None,
        nodes: Sequence[str] | None = None,
        excluded_nodes: Sequence[str] | None = None,
        reason: str | None = None,
        exit_code: int | None = None,
        signal: int | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        outcome: str | None = None,
        evidence: dict[str, Any] | None = None,
        events: Sequence[NewEvent] = (),
    ) -> Attempt:
        """Change the given fields (``None`` leaves a field as it is); ``updated_at`` = now."""
        require_aware(now, start, end)
        joined_nodes = None if nodes is None else join_nodes(nodes)
        with self._sessions.write() as session:
            row = _get_attempt_row(session, attempt_id)
            if state is not None:
                row.state = AttemptState(state).value
            if joined_nodes is not None:
                row.nodes = joined_nodes
            if excluded_nodes is not None:
                row.excluded_nodes = join_nodes(excluded_nodes)
            if reason is not None:
                row.reason = reason
            if exit_code is not None:
                row.exit_code = exit_code
            if signal is not None:
                row.signal = signal
            if start is not None:
                row.started_at = start
            if end is not None:
                row.ended_at = end
            if outcome is not None:
                row.outcome = outcome
            if evidence is not None:
                row.evidence = json.dumps(evidence, sort_keys=True, default=str)
            row.updated_at = now
            session.flush()
            self._sessions.add_events(session, events, now, run_id=row.run_id, attempt_id=attempt_id)
            return to_attempt(row)

    def update_attempts(self, updates: Sequence[AttemptUpdate], now: datetime) -> list[Attempt]:
        """Apply every update, and the run states they bring, in ONE transaction; a run
        whose state changes gets a ``run.state`` event (``from``/``to``)."""
        require_aware(now, *[t for u in updates for t in (u.start, u.end)])
        if not updates:
            return []
        with self._sessions.write() as session:
            # Every row in two queries and one flush (a burst of a thousand changes was a
            # thousand round trips of get + flush + event flush).
            rows = _rows_by_id(session, AttemptRow, [u.attempt_id for u in updates])
            missing = [u.attempt_id for u in updates if u.attempt_id not in rows]
            if missing:
                raise NotFoundError(f"unknown attempt {missing[0]}")
            runs = _rows_by_id(session, RunRow, [r.run_id for r in rows.values()])
            done: list[AttemptRow] = []
            for u in updates:
                row = rows[u.attempt_id]
                if u.state is not None:
                    row.state = AttemptState(u.state).value
                if u.nodes is not None:
                    row.nodes = join_nodes(u.nodes)
                if u.reason is not None:
                    row.reason = u.reason
                if u.exit_code is not None:
                    row.exit_code = u.exit_code
                if u.signal is not None:
                    row.signal = u.signal
                if u.start is not None:
                    row.started_at = u.start
                if u.end is not None:
                    row.ended_at = u.end
                row.updated_at = now
                events = list(u.events)
                if u.run_state is not None:
                    run = runs[row.run_id]
                    if run.state != RunState(u.run_state).value:
                        events.append(NewEvent(Kind.RUN_STATE, data={
                            "from": run.state, "to": RunState(u.run_state).value}))
                        run.state = RunState(u.run_state).value
                        run.updated_at = now
                self._sessions.add_events(session, events, now, run_id=row.run_id, attempt_id=row.id,
                                          flush=False)
                done.append(row)
            session.flush()
            return [to_attempt(row) for row in done]

    def get_attempt(self, attempt_id: int) -> Attempt:
        with self._sessions.read() as session:
            return to_attempt(_get_attempt_row(session, attempt_id))

    def attempts(self, run_id: str) -> list[Attempt]:
        """The run's attempts in order of number (NotFoundError for an unknown run)."""
        with self._sessions.read() as session:
            _get_run_row(session, run_id)
            rows = session.exec(
                select(AttemptRow)
                .where(col(AttemptRow.run_id) == run_id)
                .order_by(col(AttemptRow.number))
            ).all()
            return [to_attempt(row) for row in rows]

    def attempts_of(self, run_ids: Sequence[str]) -> dict[str, list[Attempt]]:
        """Each named run's attempts in order of number; unknown runs map to ``[]``."""
        out: dict[str, list[Attempt]] = {r: [] for r in run_ids}
        ids = list(out)
        with self._sessions.read() as session:
            for i in range(0, len(ids), 500):  # bounded IN lists
                rows = session.exec(
                    select(AttemptRow)
                    .where(col(AttemptRow.run_id).in_(ids[i:i + 500]))
                    .order_by(col(AttemptRow.run_id), col(AttemptRow.number))
                ).all()
                for row in rows:
                    out[row.run_id].append(to_attempt(row))
        return out

    def active_attempts(self) -> list[Attempt]:
        """Every non-terminal attempt of every run (SUBMITTING included), by id."""
        with self._sessions.read() as session:
            rows = session.exec(
                select(AttemptRow)
                .where(col(AttemptRow.state).in_(_ACTIVE_STATES))
                .order_by(col(AttemptRow.id))
            ).all()
            return [to_attempt(row) for row in rows]

    def attempts_since(self, since: datetime) -> list[Attempt]:
        """Every attempt that ended at or after ``since`` or has not ended, by id."""
        with self._sessions.read() as session:
            rows = session.exec(
                select(AttemptRow)
                .where(sa.or_(col(AttemptRow.ended_at).is_(None), col(AttemptRow.ended_at) >= since))
                .order_by(col(AttemptRow.id))
            ).all()
            return [to_attempt(row) for row in rows]

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Close every pooled connection; the store must not be used afterwards."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- row access ----------------------------------------------------------------


def _get_run_row(session: Session, run_id: str, *, for_update: bool = False) -> RunRow:
    row = session.get(RunRow, run_id, with_for_update=for_update or None)
    if row is None:
        raise NotFoundError(f"unknown run '{run_id}'")
    return row


def _rows_by_id(session: Session, table: Any, ids: Sequence[Any]) -> dict[Any, Any]:
    """Rows of ``table`` by primary key, in bounded IN lists."""
    wanted = list(dict.fromkeys(ids))
    found: dict[Any, Any] = {}
    key = col(table.id)
    for i in range(0, len(wanted), 500):
        for row in session.exec(select(table).where(key.in_(wanted[i:i + 500]))).all():
            found[row.id] = row
    return found


def _get_attempt_row(session: Session, attempt_id: int) -> AttemptRow:
    row = session.get(AttemptRow, attempt_id)
    if row is None:
        raise NotFoundError(f"unknown attempt {attempt_id}")
    return row


def _attempt_counts(session: Session, run_id: str | None = None) -> dict[str, int]:
    query = select(AttemptRow.run_id, func.count()).group_by(col(AttemptRow.run_id))
    if run_id is not None:
        query = query.where(col(AttemptRow.run_id) == run_id)
    return {rid: count for rid, count in session.exec(query).all()}


def _flush_or(session: Session, error: UsageError) -> None:
    try:
        session.flush()
    except sa_exc.IntegrityError as exc:
        raise error from exc
