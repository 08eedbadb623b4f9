"""Version drift in the state store: findings, the daemon's drains, the latest matrix.

:class:`DriftStore` works on a :class:`~b300.store.SqlStore` (its sessions
and its event log), so findings change in the same transaction as their
``drift.*`` events. Rows never leave this module; callers get the records
of :mod:`b300.drift.scan_records`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlmodel import col, delete, select

from ..drift.scan_records import Finding, FindingKind, OpenFinding, Policy
from ..events import Kind
from ..interfaces import NewEvent
from .drift_tables import DriftDrainRow, DriftFindingRow, DriftScanRow
from .sessions import Sessions

_KEEP_SCANS = 100


class DriftStore:
    """Drift state on top of a SqlStore; thread-safe like it (a session per call)."""

    def __init__(self, sessions: Sessions) -> None:
        self._sessions = sessions

    def open_findings(self) -> list[OpenFinding]:
        """Every open finding, by node and probe."""
        with self._sessions.read() as session:
            rows = session.exec(select(DriftFindingRow).where(col(DriftFindingRow.closed_at).is_(None))
                                .order_by(col(DriftFindingRow.node), col(DriftFindingRow.probe))).all()
            return [_to_open(row) for row in rows]

    def open_drift_nodes(self) -> set[str]:
        """Nodes a run must not land on: open drift findings whose policy is drain."""
        with self._sessions.read() as session:
            rows = session.exec(select(DriftFindingRow.node)
                                .where(col(DriftFindingRow.closed_at).is_(None))
                                .where(col(DriftFindingRow.kind) == FindingKind.DRIFT.value)
                                .where(col(DriftFindingRow.policy) == Policy.DRAIN.value)).all()
            return set(rows)

    def drained_nodes(self) -> dict[str, str]:
        """Nodes the daemon drained for drift and has not resumed: node -> reason."""
        with self._sessions.read() as session:
            return {r.node: r.reason for r in session.exec(select(DriftDrainRow)).all()}

    def last_scan(self) -> tuple[datetime, datetime, dict[str, Any]] | None:
        """(started_at, finished_at, matrix) of the newest scan, or None."""
        with self._sessions.read() as session:
            row = session.exec(select(DriftScanRow).order_by(col(DriftScanRow.id).desc()).limit(1)).first()
            if row is None:
                return None
            return (row.started_at.astimezone(UTC), row.finished_at.astimezone(UTC), json.loads(row.matrix))

    def record_action_failures(self, failures: Sequence[tuple[str | None, str]], now: datetime,
                               actor: str = "daemon") -> None:
        """One ``drift.action_failed`` event per (node, error): a drain, resume or sinfo
        of a scan that failed (shown by ``b300ctl drift``)."""
        if not failures:
            return
        with self._sessions.write() as session:
            self._sessions.add_events(session, [NewEvent(Kind.DRIFT_ACTION_FAILED, node=node, actor=actor,
                                                         data={"error": error[:500]})
                                                for node, error in failures], now)

    def record_scan(
        self,
        started_at: datetime,
        now: datetime,
        nodes_scanned: int,
        matrix: dict[str, Any],
        opened: Sequence[Finding],
        closed: Sequence[OpenFinding],
        actor: str = "daemon",
    ) -> None:
        """Store the scan's matrix, open and close findings, with their events, at once."""
        events = [NewEvent(Kind.DRIFT_FINDING, node=f.node, actor=actor, data=_data(f)) for f in opened]
        events += [NewEvent(Kind.DRIFT_CLEARED, node=o.finding.node, actor=actor,
                            data={**_data(o.finding), "finding_id": o.id}) for o in closed]
        with self._sessions.write() as session:
            for o in closed:
                finding = session.get(DriftFindingRow, o.id)
                if finding is not None and finding.closed_at is None:
                    finding.closed_at = now
            session.add_all([DriftFindingRow(node=f.node, probe=f.probe, kind=f.kind.value, expected=f.expected,
                                             found=f.found, policy=f.policy.value, opened_at=now)
                             for f in opened])
            row = DriftScanRow(started_at=started_at, finished_at=now, nodes_scanned=nodes_scanned,
                               matrix=json.dumps(matrix, sort_keys=True))
            session.add(row)
            session.flush()
            assert row.id is not None
            session.exec(delete(DriftScanRow).where(col(DriftScanRow.id) <= row.id - _KEEP_SCANS))
            self._sessions.add_events(session, events, now)

    def mark_drained(self, node: str, reason: str, now: datetime, actor: str = "daemon") -> None:
        """Remember that the daemon drained ``node`` for drift (event ``drift.drained``)."""
        with self._sessions.write() as session:
            row = session.get(DriftDrainRow, node)
            if row is None:
                session.add(DriftDrainRow(node=node, reason=reason, drained_at=now))
            else:
                row.reason, row.drained_at = reason, now
            session.flush()
            self._sessions.add_events(session, [NewEvent(Kind.DRIFT_DRAINED, node=node, actor=actor,
                                                        data={"reason": reason})], now)

    def release(self, node: str, now: datetime, *, resumed: bool, actor: str = "daemon") -> None:
        """Forget the daemon's drain of ``node``; ``resumed`` says whether Slurm was told to resume it."""
        with self._sessions.write() as session:
            row = session.get(DriftDrainRow, node)
            if row is None:
                return
            session.delete(row)
            session.flush()
            self._sessions.add_events(session, [NewEvent(Kind.DRIFT_CLEARED, node=node, actor=actor,
                                                        data={"resumed": resumed, "reason": row.reason})], now)


def _data(f: Finding) -> dict[str, Any]:
    return {"probe": f.probe, "kind": f.kind.value, "expected": f.expected, "found": f.found,
            "policy": f.policy.value}


def _to_open(row: DriftFindingRow) -> OpenFinding:
    assert row.id is not None
    finding = Finding(row.node, row.probe, FindingKind(row.kind), row.expected, row.found, Policy(row.policy))
    return OpenFinding(row.id, finding, row.opened_at.astimezone(UTC))
