"""Where a new attempt of a run resumes: the newest verified checkpoint, or a path an
operator named and that is checked before any job is submitted.

Reads the run's checkpoint folder through its layout plugin (I/O); the choice
itself is :func:`b300.checkpoints.resume.choose_resume`.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from ..model import CheckpointInfo
from ..plugin_registry import PluginRegistry
from ..spec import JobSpec
from .layouts import load_layout
from .manifest import read_manifest, verify
from .resume import choose_resume


def newest_verified(spec: JobSpec, plugins: PluginRegistry | None = None
                    ) -> tuple[str | None, list[dict[str, object]]]:
    """The newest complete checkpoint whose manifest (if made yet) verifies, and what
    was looked at on the way (``{"path", "ok", "why"}`` each, for the event log).
    ``plugins``: the caller's registry (without one, a fresh one finds the layout)."""
    if not spec.checkpoint.dir:
        return None, []
    root = spec.checkpoint.dir
    checked: list[dict[str, object]] = []

    def verified(ckpt: CheckpointInfo) -> bool:
        if read_manifest(ckpt.path) is None:
            checked.append({"path": ckpt.path, "ok": True, "why": "complete; no manifest yet"})
            return True
        result = verify(ckpt.path, root=root)
        checked.append({"path": ckpt.path, "ok": result.ok, "why": "; ".join(result.problems[:3])})
        return result.ok

    found = load_layout(spec.checkpoint.layout, plugins).list_checkpoints(root)
    for ckpt in found:
        if not ckpt.complete:
            checked.append({"path": ckpt.path, "ok": False, "why": ckpt.why_incomplete})
    choice = choose_resume(found, verified)
    return (choice.path if choice else None), checked


def check_resume_path(spec: JobSpec, run_id: str, path: str, *, force: bool,
                      plugins: PluginRegistry | None = None) -> None:
    """Refuse (UsageError, one line) a ``--from-checkpoint`` path that is not a complete
    checkpoint of the run's layout under its checkpoint folder, or whose manifest (when
    it has one) does not verify. ``force`` skips those checks, never the existence one.
    ``plugins``: the caller's registry (without one, a fresh one finds the layout)."""
    if not os.path.exists(path):
        raise UsageError(f"--from-checkpoint {path}: no such file or directory")
    if force:
        return
    root = spec.checkpoint.dir
    hint = "; --force to use it anyway"
    if not root:
        raise UsageError(f"--from-checkpoint {path}: run {run_id} has no [checkpoint] dir "
                         f"to check it against{hint}")
    layout = spec.checkpoint.layout
    real = os.path.realpath(path)
    match = [c for c in load_layout(layout, plugins).list_checkpoints(root)
             if os.path.realpath(c.path) == real]
    if not match:
        raise UsageError(f"--from-checkpoint {path}: not a checkpoint of run {run_id} "
                         f"(layout {layout} under {root}){hint}")
    ckpt = match[-1]
    if not ckpt.complete:
        raise UsageError(f"--from-checkpoint {path}: incomplete ({ckpt.why_incomplete}){hint}")
    if read_manifest(ckpt.path) is not None:
        result = verify(ckpt.path, root=root)
        if not result.ok:
            raise UsageError(f"--from-checkpoint {path}: fails verification "
                             f"({'; '.join(result.problems[:3])}){hint}")
