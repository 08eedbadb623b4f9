"""A run with one attempt RUNNING and its progress file, for the hang watch's tests on a real store."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from b300.interfaces import Store
from b300.model import Attempt, AttemptState

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def running_attempt(store: Store, progress: Path, hang_timeout: str) -> Attempt:
    """Run ``r`` (``progress`` its progress file) with one attempt RUNNING on gpu01 since T0, as job 7."""
    store.create_run("r", "r", f'name = "r"\n[job]\ncommand = "srun train"\nnodes = 1\n'
                     f'[health]\nprogress_file = "{progress}"\nhang_timeout = "{hang_timeout}"\n', T0)
    a = store.begin_attempt("r", T0)
    store.confirm_attempt(a.id, 7, T0)
    return store.update_attempt(a.id, T0, state=AttemptState.RUNNING, nodes=["gpu01"], start=T0)


def write_step(progress: Path, step: object, at: datetime) -> None:
    """The job writes ``step`` to its progress file at ``at`` (the file's mtime)."""
    progress.write_text(json.dumps({"step": step}))
    os.utime(progress, (at.timestamp(), at.timestamp()))
