"""The store's event log, node table and HA lease view (part of :class:`b300.store.sql_store.SqlStore`).

:class:`LogStore` holds the :class:`b300.interfaces.Store` methods that append and read
events, record the nodes Slurm reports, and read the lease; ``SqlStore`` adds runs and
attempts on the same :class:`b300.store.sessions.Sessions`, so every write still commits
atomically with its events.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlmodel import col, func, select

from ..events import Kind
from ..interfaces import NewEvent
from ..model import Event, NodeObservation, NodeRecord
from .sessions import Sessions
from .tables import EventRow, NodeRow, to_event, to_node


class LogStore:
    """Events, nodes and the lease, over the sessions of the store that inherits it."""

    _sessions: Sessions

    # -- events -------------------------------------------------------------

    def append_events(self, events: Sequence[NewEvent], now: datetime) -> list[Event]:
        """Append ``events`` (all or none) stamped ``now``; returned in the order given."""
        require_aware(now)
        if not events:
            return []
        with self._sessions.write() as session:
            return [to_event(row) for row in self._sessions.add_events(session, events, now)]

    def events(
        self,
        *,
        run_id: str | None = None,
        after_id: int = 0,
        limit: int | None = None,
        node: str | None = None,
        kinds: Sequence[str] | None = None,
        since: datetime | None = None,
    ) -> list[Event]:
        """Events with id > ``after_id`` in id order, at most ``limit``, optionally
        only of one run, of one node, of some kinds, or at/after ``since``.

        Ids are committed in increasing order, so paging with the last id seen
        never skips an event.
        """
        query = select(EventRow).where(col(EventRow.id) > after_id)
        if run_id is not None:
            query = query.where(col(EventRow.run_id) == run_id)
        if node is not None:
            query = query.where(col(EventRow.node) == node)
        if kinds is not None:
            query = query.where(col(EventRow.kind).in_(list(kinds)))
        if since is not None:
            require_aware(since)
            query = query.where(col(EventRow.ts) >= since)
        query = query.order_by(col(EventRow.id))
        if limit is not None:
            query = query.limit(max(limit, 0))
        with self._sessions.read() as session:
            return [to_event(row) for row in session.exec(query).all()]

    def event_counts(self, kinds: Sequence[str]) -> dict[tuple[str | None, str], int]:
        """Events of ``kinds`` counted by (run id, kind) in the database (``GROUP BY``): for
        ``/metrics``, which needs the totals, not the events."""
        if not kinds:
            return {}
        query = (select(col(EventRow.run_id), col(EventRow.kind), func.count())
                 .where(col(EventRow.kind).in_(list(kinds)))
                 .group_by(col(EventRow.run_id), col(EventRow.kind)))
        with self._sessions.read() as session:
            return {(run_id, kind): int(n) for run_id, kind, n in session.exec(query).all()}

    # -- nodes --------------------------------------------------------------

    def sync_nodes(self, observed: Sequence[NodeObservation], now: datetime) -> list[NodeRecord]:
        """Record the nodes' current state and reason; return those that changed, by name.

        Each new or changed node gets a ``node.state`` event whose data holds
        ``state``/``reason`` and the previous ``old_state``/``old_reason``
        (``None`` for a new node). ``updated_at`` is when the state last
        changed, so an unchanged node costs no write. Nodes absent from
        ``observed`` are left as they are.
        """
        require_aware(now)
        latest = {obs.name: obs for obs in observed}  # the last report of a name wins
        with self._sessions.write() as session:
            known = {row.name: row for row in session.exec(select(NodeRow)).all()}
            changed: list[NodeRow] = []
            events: list[NewEvent] = []
            for name in sorted(latest):
                obs, row = latest[name], known.get(name)
                if row is not None and (row.state, row.reason) == (obs.state, obs.reason):
                    continue
                events.append(
                    NewEvent(
                        kind=Kind.NODE_STATE,
                        node=name,
                        data={
                            "old_state": None if row is None else row.state,
                            "old_reason": None if row is None else row.reason,
                            "state": obs.state,
                            "reason": obs.reason,
                        },
                    )
                )
                if row is None:
                    row = NodeRow(name=name, state=obs.state, reason=obs.reason, updated_at=now)
                    session.add(row)
                else:
                    row.state, row.reason, row.updated_at = obs.state, obs.reason, now
                changed.append(row)
            session.flush()
            self._sessions.add_events(session, events, now)
            return [to_node(row) for row in changed]

    def list_nodes(self) -> list[NodeRecord]:
        """Every known node, by name."""
        with self._sessions.read() as session:
            rows = session.exec(select(NodeRow).order_by(col(NodeRow.name))).all()
            return [to_node(row) for row in rows]

    # -- high availability --------------------------------------------------

    def daemon_lease(self, name: str) -> dict[str, Any] | None:
        """The lease row of ``name`` (holder, host, pid, epoch, since, expires_at) and
        ``live``: unexpired by the database's clock. None if no daemon ever held it."""
        from .lease_tables import LeaseRow

        with self._sessions.read() as session:
            row = session.get(LeaseRow, name)
            if row is None:
                return None
            if session.get_bind().dialect.name == "postgresql":
                db_now = session.exec(select(func.clock_timestamp())).one()
            else:
                db_now = datetime.now(UTC)
            expires = as_utc(row.expires_at)
            return {"holder": row.holder, "host": row.host, "pid": row.pid, "epoch": row.epoch,
                    "since": as_utc(row.acquired_at).isoformat(),
                    "renewed_at": as_utc(row.renewed_at).isoformat(),
                    "expires_at": expires.isoformat(),
                    "live": bool(row.holder) and expires > as_utc(db_now)}


def as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def require_aware(*times: datetime | None) -> None:
    # A naive time is no instant at all; storing it as UTC would shift it silently.
    for value in times:
        if value is not None and value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()} given to the store; use UTC")
