"""What both callbacks share: the rank-0 writer and the counters (standard library only)."""

from __future__ import annotations

import os
from typing import Any

from ..training.progress import ProgressWriter


def rank_zero_writer(path: str | os.PathLike[str] | None, is_rank_zero: bool) -> ProgressWriter | None:
    """A writer on the global rank 0 for ``path`` (else ``$B300_PROGRESS_FILE``); None on the
    other ranks and when no path is given anywhere (the callback then does nothing)."""
    if not is_rank_zero:
        return None
    return ProgressWriter(path) if path is not None else ProgressWriter.from_env()


def batch_length(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor-like leaf, if any."""
    for _ in range(8):  # bounded: nested containers, not a tree walk
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, list | tuple):
            batch = batch[0] if batch else None
        else:
            break
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        try:
            return int(shape[0])
        except (TypeError, ValueError):
            return None
    return None


def positive_or_none(name: str, value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return value
