"""Carrying out a prune plan, out of band (never inside the training job), with a dry run.

Before anything is deleted the checkpoint the plan prunes against (its newest
verified one) is verified again; if that fails nothing is deleted. Deletion never
leaves the checkpoint root and never follows a symlink (a symlinked checkpoint
loses the link only).

A checkpoint directory is first renamed to ``.b300-deleting-<name>`` (one atomic
rename: no layout lists that name) and only then removed, so a crash midway
never leaves a half-deleted checkpoint that looks complete; the next prune
finishes such leftovers (:func:`finish_interrupted_deletes`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

from ..interfaces import ReplicationTarget
from ..model import CheckpointInfo
from ..safety.faults import crashpoint
from .replicate import replica_records, verify_replica
from .retention import CheckpointState, PrunePlan, RetentionPolicy, plan_prune
from .walk import inside, real_root, top_entries

NEWEST_VERIFIED = "newest verified"
TRASH_PREFIX = ".b300-deleting-"


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune deleted (or, in a dry run, would delete) and why it stopped, if it did."""

    deleted: tuple[str, ...]
    dry_run: bool
    refused: str = ""


def anchor_of(plan: PrunePlan) -> str | None:
    """The path the plan prunes against (its newest verified checkpoint), if any."""
    return next((p for p, why in plan.keep.items() if NEWEST_VERIFIED in why), None)


def prune_local(
    plan: PrunePlan, root: str, *, dry_run: bool, verify: Callable[[str], bool]
) -> PruneResult:
    """Delete ``plan.delete`` under ``root``; ``verify(path)`` re-checks the anchor first."""
    paths = tuple(c.path for c in plan.delete)
    if dry_run or not paths:
        return PruneResult(paths, dry_run=True)
    anchor = anchor_of(plan)
    if anchor is None or not verify(anchor):
        return PruneResult((), dry_run=False, refused=f"anchor {anchor} does not verify; nothing deleted")
    root_real = real_root(root)
    if root_real is None:
        return PruneResult((), dry_run=False, refused=f"checkpoint root {root} is missing")
    deleted = []
    for path in paths:
        _delete_inside(path, root_real)
        deleted.append(path)
        crashpoint("prune_one_deleted")
    return PruneResult(tuple(deleted), dry_run=False)


def _delete_inside(path: str, root_real: str) -> None:
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    if not inside(parent, root_real) or os.path.realpath(path) == root_real:
        raise ValueError(f"refusing to delete {path!r}: not a checkpoint under {root_real!r}")
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        trash = os.path.join(os.path.dirname(path), TRASH_PREFIX + os.path.basename(path))
        if os.path.lexists(trash):  # left by an earlier interrupted prune of the same name
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(path, trash)
        crashpoint("prune_renamed")
        shutil.rmtree(trash, ignore_errors=True)


def finish_interrupted_deletes(root: str) -> tuple[str, ...]:
    """Remove the ``.b300-deleting-*`` directories an interrupted prune left in ``root``."""
    root_real = real_root(root)
    if root_real is None:
        return ()
    done = []
    for name, path, is_dir in top_entries(root_real):
        if name.startswith(TRASH_PREFIX) and is_dir and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            done.append(path)
    return tuple(done)


def plan_remote_prune(
    target: ReplicationTarget, policy: RetentionPolicy, now: datetime, *, pending_resume: Collection[str] = ()
) -> PrunePlan:
    """The same retention rules over a target's replicas (records exist only for verified copies).

    ``pending_resume`` holds replica names (checkpoint directory names).
    """
    states = [
        CheckpointState(CheckpointInfo(path=r.name, step=r.step, mtime=r.mtime, complete=True,
                                       size_bytes=r.manifest.size_bytes, files=len(r.manifest.files)),
                        verified=True)
        for r in replica_records(target)
    ]
    return plan_prune(states, policy, now, pending_resume=pending_resume)


def prune_remote(target: ReplicationTarget, plan: PrunePlan, *, dry_run: bool) -> PruneResult:
    """Delete the plan's replicas from ``target`` after reading its anchor back intact."""
    names = tuple(c.path for c in plan.delete)
    if dry_run or not names:
        return PruneResult(names, dry_run=True)
    anchor = anchor_of(plan)
    if anchor is None or verify_replica(anchor, target):
        return PruneResult((), dry_run=False, refused=f"replica {anchor} does not verify; nothing deleted")
    for name in names:
        target.delete_replica(name)
        crashpoint("remote_prune_one_deleted")
    return PruneResult(names, dry_run=False)
