"""The training-health step's state files: one JSON file per watched attempt.

``state_dir/training/attempt-<id>.json`` holds what a restarted daemon needs to go on
reading an attempt's progress files where the last one stopped (the detectors' state,
the tailers' offsets, what was recorded already). Written atomically (a temporary
file renamed over the old one); a file that cannot be read, or of another version, is
ignored (the watch starts again from backfill). Nothing here raises for the disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

STATE_VERSION = 1
#: The most directory entries one sweep looks at.
_SWEEP_LIMIT = 10_000


class StateFiles:
    """The state files under ``directory`` (None: no state kept, every call does nothing)."""

    def __init__(self, directory: Path | None) -> None:
        self._dir = directory

    def path(self, attempt_id: int) -> Path | None:
        return self._dir / f"attempt-{attempt_id}.json" if self._dir else None

    def save(self, attempt_id: int, state: dict[str, Any], saved: str) -> str:
        """Write ``state`` (stamped with :data:`STATE_VERSION`) unless its text is ``saved``,
        the text written last; returns the text now on disk (``saved`` when not written)."""
        path = self.path(attempt_id)
        if path is None:
            return saved
        text = json.dumps({"v": STATE_VERSION, **state}, allow_nan=True, separators=(",", ":"))
        if text == saved:
            return saved
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("training.state_not_saved", path=str(path), error=str(exc))
            return saved
        return text

    def load(self, attempt_id: int) -> dict[str, Any] | None:
        """The attempt's state, or None (no file, unreadable, another version)."""
        path = self.path(attempt_id)
        if path is None:
            return None
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION or "monitor" not in state:
            return None
        return state

    def remove(self, attempt_id: int) -> None:
        path = self.path(attempt_id)
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)

    def sweep(self, keep: Callable[[int], bool]) -> None:
        """Remove the state files of attempts ``keep`` refuses (ended while no daemon ran)."""
        if self._dir is None or not self._dir.is_dir():
            return
        for i, entry in enumerate(self._dir.iterdir()):
            if i >= _SWEEP_LIMIT:
                break
            name = entry.name
            if name.startswith("attempt-") and name.endswith(".json"):
                num = name[len("attempt-"):-len(".json")]
                if num.isdigit() and not keep(int(num)):
                    entry.unlink(missing_ok=True)
