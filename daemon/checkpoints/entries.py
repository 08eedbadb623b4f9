"""What the store knows of a checkpoint beyond its files (plain records, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..model import CheckpointInfo
from .retention import CheckpointState


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as last listed, with ``verified`` None until checked against its manifest."""

    run_id: str
    info: CheckpointInfo
    verified: bool | None
    verified_at: datetime | None
    marked: bool
    replicas: dict[str, bool]
    deleted_at: datetime | None = None
    replicas_pruned: frozenset[str] = frozenset()  # targets whose retention deleted the copy

    @property
    def replicated_to(self) -> frozenset[str]:
        return frozenset(t for t, ok in self.replicas.items() if ok)

    def state(self, info: CheckpointInfo | None = None) -> CheckpointState:
        """The record retention plans over, for ``info`` (a fresh listing of this
        checkpoint) when given, else for the stored one."""
        return CheckpointState(info or self.info, verified=bool(self.verified), marked=self.marked,
                               replicated_to=self.replicated_to)


def plan_state(info: CheckpointInfo, stored: StoredCheckpoint | None) -> CheckpointState:
    """What retention plans over for a checkpoint just listed, with what the store knows of it."""
    return CheckpointState(info) if stored is None else stored.state(info)
