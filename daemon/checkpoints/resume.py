"""Which checkpoint a run resumes from: a pure choice over what the layout listed."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..model import Attempt, CheckpointInfo


def pending_resumes(attempts: Iterable[Attempt]) -> set[str]:
    """Checkpoint paths that attempts not yet ended resume from (never to be pruned)."""
    return {a.resume_from for a in attempts if not a.state.is_terminal and a.resume_from}


def choose_resume(
    checkpoints: Iterable[CheckpointInfo], verified: Callable[[CheckpointInfo], bool]
) -> CheckpointInfo | None:
    """The newest checkpoint that is complete and passes ``verified``, else ``None``.

    Tried newest first (by step, then time), so a checkpoint that fails
    verification falls back to the one before it; ``verified`` is called only
    for complete checkpoints and at most until one passes.
    """
    for ckpt in sorted(checkpoints, key=lambda c: (c.step, c.mtime), reverse=True):
        if ckpt.complete and verified(ckpt):
            return ckpt
    return None
