"""What the daemon knows about checkpoints beyond the files: verification, marks, replicas.

:class:`CheckpointStore` works on the same database as :class:`SqlStore` (it
uses its sessions, so writes commit atomically with their events) and hands
out frozen :class:`StoredCheckpoint` records; its rows never leave this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlmodel import Session, col, select

from ..checkpoints.entries import StoredCheckpoint
from ..errors import NotFoundError
from ..events import Kind
from ..interfaces import NewEvent
from ..model import CheckpointInfo
from .checkpoint_tables import CheckpointReplicaRow, CheckpointRow
from .sessions import Sessions


class CheckpointStore:
    """Checkpoint bookkeeping in the store's database (tables of revision 0201); implements
    :class:`b300.interfaces.CheckpointRepository` (``store.checkpoints``)."""

    def __init__(self, sessions: Sessions) -> None:
        self._sessions = sessions

    def record_listing(self, run_id: str, checkpoints: Sequence[CheckpointInfo], now: datetime) -> None:
        """Upsert what a layout listed for the run.

        A checkpoint whose size, file count or time changed since it was
        verified loses its verdict (it must be verified again). Rows of
        checkpoints no longer listed are marked deleted.
        """
        listed = {c.path: c for c in checkpoints}
        with self._sessions.write() as session:
            query = select(CheckpointRow).where(CheckpointRow.run_id == run_id)
            rows = {r.path: r for r in session.exec(query)}
            for path, info in listed.items():
                row = rows.get(path)
                if row is None:
                    session.add(CheckpointRow(run_id=run_id, path=path, step=info.step, mtime=info.mtime,
                                              complete=info.complete, size_bytes=info.size_bytes,
                                              files=info.files, save_s=info.save_s, updated_at=now))
                    continue
                if info.save_s is not None and row.save_s != info.save_s:
                    row.save_s = info.save_s
                    session.add(row)
                changed = (row.size_bytes, row.files, row.mtime, row.complete) != (
                    info.size_bytes, info.files, info.mtime, info.complete)
                if changed:
                    row.step, row.mtime, row.complete = info.step, info.mtime, info.complete
                    row.size_bytes, row.files = info.size_bytes, info.files
                    row.verified, row.verified_at = None, None
                if changed or row.deleted_at is not None:
                    row.deleted_at = None
                    row.updated_at = now
                    session.add(row)
            for path, row in rows.items():
                if path not in listed and row.deleted_at is None:
                    row.deleted_at = now
                    row.updated_at = now
                    session.add(row)

    def record_verification(self, run_id: str, path: str, ok: bool, now: datetime,
                            problems: Sequence[str] = ()) -> None:
        """Store a verification verdict; a failure is also a ``checkpoint.corrupt`` event."""
        with self._sessions.write() as session:
            row = _row(session, run_id, path)
            row.verified, row.verified_at, row.updated_at = ok, now, now
            session.add(row)
            if not ok:
                self._sessions.add_events(session, [NewEvent(
                    Kind.CHECKPOINT_CORRUPT, data={"path": path, "problems": list(problems)[:20]})], now,
                    run_id=run_id)

    def set_marked(self, run_id: str, path: str, marked: bool, now: datetime, actor: str = "daemon") -> None:
        """Mark a checkpoint to keep it whatever retention says (or unmark it)."""
        with self._sessions.write() as session:
            row = _row(session, run_id, path)
            row.marked, row.updated_at = marked, now
            session.add(row)
            self._sessions.add_events(session, [NewEvent(
                Kind.CHECKPOINT_MARKED if marked else Kind.CHECKPOINT_UNMARKED, actor=actor,
                data={"path": path})],
                now, run_id=run_id)

    def record_replica(self, run_id: str, path: str, target: str, ok: bool, now: datetime, *,
                       bytes_sent: int = 0, error: str = "") -> None:
        """Store the outcome of copying a checkpoint to ``target``, with a ``checkpoint.replicated``
        or ``checkpoint.replication_failed`` event."""
        with self._sessions.write() as session:
            row = _row(session, run_id, path)
            assert row.id is not None
            rep = _replica_row(session, row.id, target)
            if rep is None:
                rep = CheckpointReplicaRow(checkpoint_id=row.id, target=target, ok=ok, updated_at=now)
            rep.ok, rep.bytes_sent, rep.error, rep.updated_at = ok, bytes_sent, error, now
            rep.pruned_at = None
            session.add(rep)
            self._sessions.add_events(session, [NewEvent(
                Kind.CHECKPOINT_REPLICATED if ok else Kind.CHECKPOINT_REPLICATION_FAILED,
                data={"path": path, "target": target, "bytes_sent": bytes_sent, "error": error})],
                now, run_id=run_id)

    def record_replicas_pruned(self, run_id: str, paths: Sequence[str], target: str, now: datetime,
                               actor: str = "daemon") -> None:
        """Record that ``target``'s retention deleted the replicas of ``paths`` (one
        ``checkpoint.replica_pruned`` event). The copies still count as made."""
        if not paths:
            return
        with self._sessions.write() as session:
            for path in paths:
                row = _find_row(session, run_id, path)
                rep = None if row is None or row.id is None else _replica_row(session, row.id, target)
                if rep is not None:
                    rep.pruned_at, rep.updated_at = now, now
                    session.add(rep)
            self._sessions.add_events(session, [NewEvent(
                Kind.CHECKPOINT_REPLICA_PRUNED, actor=actor, data={"target": target, "paths": list(paths)})],
                now, run_id=run_id)

    def record_pruned(self, run_id: str, paths: Sequence[str], now: datetime, actor: str = "daemon") -> None:
        """Record that ``paths`` were deleted by a prune (one ``checkpoint.pruned`` event)."""
        if not paths:
            return
        with self._sessions.write() as session:
            for path in paths:
                row = _row(session, run_id, path)
                row.deleted_at, row.updated_at = now, now
                session.add(row)
            self._sessions.add_events(session, [NewEvent(
                Kind.CHECKPOINT_PRUNED, actor=actor, data={"paths": list(paths)})], now, run_id=run_id)

    def checkpoints(self, run_id: str, *, include_deleted: bool = False) -> list[StoredCheckpoint]:
        """The run's checkpoints by step, oldest first, with their replicas."""
        with self._sessions.read() as session:
            query = select(CheckpointRow).where(CheckpointRow.run_id == run_id)
            if not include_deleted:
                query = query.where(col(CheckpointRow.deleted_at).is_(None))
            rows = session.exec(query.order_by(col(CheckpointRow.step), col(CheckpointRow.path))).all()
            return _with_replicas(session, rows)

    def checkpoints_of(self, run_ids: Sequence[str]) -> dict[str, list[StoredCheckpoint]]:
        """:meth:`checkpoints` (not deleted) of each named run: a query per 500 runs and
        one per 500 checkpoints for their replicas, instead of two per run."""
        out: dict[str, list[StoredCheckpoint]] = {r: [] for r in run_ids}
        ids = list(out)
        with self._sessions.read() as session:
            for i in range(0, len(ids), 500):  # bounded IN lists
                rows = session.exec(
                    select(CheckpointRow)
                    .where(col(CheckpointRow.run_id).in_(ids[i:i + 500]),
                           col(CheckpointRow.deleted_at).is_(None))
                    .order_by(col(CheckpointRow.run_id), col(CheckpointRow.step), col(CheckpointRow.path))
                ).all()
                for row, record in zip(rows, _with_replicas(session, rows), strict=True):
                    out[row.run_id].append(record)
        return out


def _with_replicas(session: Session, rows: Sequence[CheckpointRow]) -> list[StoredCheckpoint]:
    """``rows`` as records, with their replicas read in bounded IN lists."""
    ids = [r.id for r in rows]
    replicas: dict[int, dict[str, bool]] = {}
    pruned: dict[int, set[str]] = {}
    for i in range(0, len(ids), 500):  # bounded IN lists
        for rep in session.exec(select(CheckpointReplicaRow).where(
                col(CheckpointReplicaRow.checkpoint_id).in_(ids[i:i + 500]))):
            replicas.setdefault(rep.checkpoint_id, {})[rep.target] = rep.ok
            if rep.pruned_at is not None:
                pruned.setdefault(rep.checkpoint_id, set()).add(rep.target)
    return [_to_record(r, replicas.get(r.id or 0, {}), frozenset(pruned.get(r.id or 0, ())))
            for r in rows]


def _find_row(session: Session, run_id: str, path: str) -> CheckpointRow | None:
    return session.exec(select(CheckpointRow).where(
        CheckpointRow.run_id == run_id, CheckpointRow.path == path)).first()


def _row(session: Session, run_id: str, path: str) -> CheckpointRow:
    row = _find_row(session, run_id, path)
    if row is None:
        raise NotFoundError(f"checkpoint {path!r} of run '{run_id}' is not known")
    return row


def _replica_row(session: Session, checkpoint_id: int, target: str) -> CheckpointReplicaRow | None:
    return session.exec(select(CheckpointReplicaRow).where(
        CheckpointReplicaRow.checkpoint_id == checkpoint_id, CheckpointReplicaRow.target == target)).first()


def _to_record(row: CheckpointRow, replicas: dict[str, bool],
               pruned: frozenset[str] = frozenset()) -> StoredCheckpoint:
    info = CheckpointInfo(path=row.path, step=row.step, mtime=row.mtime, complete=row.complete,
                          size_bytes=row.size_bytes, files=row.files, save_s=row.save_s)
    return StoredCheckpoint(run_id=row.run_id, info=info, verified=row.verified, verified_at=row.verified_at,
                            marked=row.marked, replicas=dict(sorted(replicas.items())),
                            deleted_at=row.deleted_at, replicas_pruned=pruned)
