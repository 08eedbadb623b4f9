"""Which replica ``b300ctl checkpoints restore`` fetches (pure: store records in, choices out).

A replica counts when the store recorded a complete, verified copy of the
checkpoint on that target (the copy is verified before its record is written,
:mod:`b300.checkpoints.replicate`) and the target's retention has not pruned it
since. The local checkpoint may be long gone: that is what a restore is for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UsageError
from .entries import StoredCheckpoint
from .replicate import replica_name

_STEPS_SHOWN = 8  # known steps listed in "no checkpoint at step N"


@dataclass(frozen=True, slots=True)
class RestoreChoice:
    """One replica to try: the checkpoint as the store knows it, the target, the replica's name."""

    checkpoint: StoredCheckpoint
    target: str

    @property
    def name(self) -> str:
        return replica_name(self.checkpoint.info)

    @property
    def step(self) -> int:
        return self.checkpoint.info.step


def has_replica(stored: StoredCheckpoint, target: str) -> bool:
    """The store recorded a verified copy on ``target`` that its retention has not deleted."""
    return bool(stored.replicas.get(target)) and target not in stored.replicas_pruned


def restore_choices(run_id: str, stored: Sequence[StoredCheckpoint], configured: Sequence[str], *,
                    target: str | None = None, step: int | None = None) -> list[RestoreChoice]:
    """The replicas to try, best first: newest step first, and for each step the targets
    in config order (only ``target`` when given; only ``step`` when given).

    Raises UsageError naming the problem: no target configured, ``target`` not
    configured, no checkpoint at ``step``, or no verified replica where asked.
    Never empty.
    """
    if not configured:
        raise UsageError("no offsite target is configured ([[checkpoints.targets]])")
    if target is not None and target not in configured:
        raise UsageError(f"unknown target {target!r} (configured: {', '.join(configured)})")
    targets = [target] if target is not None else list(configured)
    rows = sorted(stored, key=lambda c: (c.info.step, c.info.mtime), reverse=True)
    if step is not None:
        at = [c for c in rows if c.info.step == step]
        if not at:
            known = sorted({c.info.step for c in rows}, reverse=True)
            shown = ", ".join(str(s) for s in known[:_STEPS_SHOWN])
            shown += ", ..." if len(known) > _STEPS_SHOWN else ""
            raise UsageError(f"run {run_id} has no checkpoint at step {step}"
                             + (f" (known steps, newest first: {shown})" if known else " (none known)"))
        rows = at
    choices = [RestoreChoice(c, t) for c in rows for t in targets if has_replica(c, t)]
    if not choices:
        where = f"on {target}" if target is not None else f"on any target ({', '.join(targets)})"
        what = f"step {step} of run {run_id}" if step is not None else f"run {run_id}"
        raise UsageError(f"{what} has no verified replica {where}")
    return choices
