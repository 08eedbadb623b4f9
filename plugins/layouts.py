"""Built-in checkpoint layouts (entry-point group ``b300.checkpoint_layouts``).

Each implements :class:`b300.interfaces.CheckpointLayout`: it lists the
checkpoints under a root with their step and time and tells a complete one from
one still being written or cut off by a crash. Each looks at the root with one
``scandir`` and at each candidate checkpoint with one walk
(:func:`b300.checkpoints.walk.walk_checkpoint`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from b300.checkpoints.walk import CheckpointDir, real_root, top_entries, utc, walk_checkpoint
from b300.model import CheckpointInfo

# re.ASCII: int() would accept other scripts' digits, a name no framework writes.
_DCP_DIR = re.compile(r"(?:step_|step-|checkpoint-|iter_)(\d{1,18})", re.ASCII)
_MEGATRON_DIR = re.compile(r"iter_(\d{1,18})", re.ASCII)
_DEEPSPEED_DIR = re.compile(r"global_step(\d{1,18})", re.ASCII)
_GENERIC_DIR = re.compile(r"step_(\d{1,18})", re.ASCII)
_MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
_DEEPSPEED_TRACKER = "latest"
_TRACKER_MAX_BYTES = 4096
_Verdict = Callable[[CheckpointDir, int], str]


def _list(root: str, pattern: re.Pattern[str], why_incomplete: _Verdict) -> list[CheckpointInfo]:
    """Checkpoints whose directory name matches ``pattern``; '' from ``why_incomplete`` = complete."""
    root_real = real_root(root)
    if root_real is None:
        return []
    found: list[CheckpointInfo] = []
    for name, path, is_dir in top_entries(root_real):
        match = pattern.fullmatch(name)
        if match is None or not is_dir:
            continue
        step = int(match.group(1))
        ckpt = walk_checkpoint(path, root_real)
        why = why_incomplete(ckpt, step)
        found.append(
            CheckpointInfo(
                path=path,
                step=step,
                mtime=utc(ckpt.newest_mtime),
                complete=not why,
                size_bytes=ckpt.size_bytes,
                files=len(ckpt.files),
                why_incomplete=why,
                save_s=_save_s(ckpt) if not why else None,
            )
        )
    found.sort(key=lambda c: (c.step, c.path))
    return found


def _save_s(ckpt: CheckpointDir) -> float | None:
    """First file written to the last (the completion marker), from their mtimes; None for one file."""
    if len(ckpt.files) < 2:
        return None
    times = [float(f.mtime) for f in ckpt.files]
    return max(times) - min(times)


def _read_tracker(root: str, name: str) -> str | None:
    """The stripped text of a small pointer file in the root, ``None`` if absent/unreadable."""
    root_real = real_root(root)
    if root_real is None:
        return None
    for entry_name, path, is_dir in top_entries(root_real):
        if entry_name != name or is_dir:
            continue
        try:
            with open(path, "rb") as fh:
                return fh.read(_TRACKER_MAX_BYTES).decode("utf-8", "replace").strip()
        except OSError:
            return None
    return None


def _torn_files(ckpt: CheckpointDir) -> str:
    if not ckpt.files:
        return "no files"
    empty = [f.rel for f in ckpt.files if f.size == 0]
    if empty:
        return f"{len(empty)} empty file(s), e.g. {empty[0]!r}"
    return ""


class DcpLayout:
    """PyTorch Distributed Checkpoint: ``step_<N>/`` (or ``step-N``, ``checkpoint-N``,
    ``iter_N``) holding ``__<rank>_<n>.distcp`` files and ``.metadata``.

    DCP writes ``.metadata`` last, after every rank's data, so a checkpoint is
    complete when ``.metadata`` is there and non-empty, there is data, every
    ``.distcp`` file is non-empty and none is newer than ``.metadata`` (which
    would be a save rewriting the same directory).
    """

    name = "dcp"

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]:
        return _list(root, _DCP_DIR, _dcp_verdict)


def _dcp_verdict(ckpt: CheckpointDir, _step: int) -> str:
    meta = ckpt.file(".metadata")
    if meta is None:
        return "no .metadata (being written or cut off)"
    if meta.size == 0:
        return ".metadata is empty"
    data = [f for f in ckpt.files if f.rel.endswith(".distcp")]
    if not data:
        return "no .distcp files"
    empty = [f.rel for f in data if f.size == 0]
    if empty:
        return f"{len(empty)} empty .distcp file(s), e.g. {empty[0]!r}"
    newer = [f.rel for f in data if f.mtime > meta.mtime]
    if newer:
        return f"{newer[0]!r} is newer than .metadata (being rewritten)"
    return ""


class _PointerLayout:
    """Frameworks that write a pointer file naming the newest finished checkpoint.

    Directories up to the pointer's step are complete (unless a file is empty);
    newer ones are still being written or were cut off by a crash.
    """

    name = ""
    _pattern: re.Pattern[str]
    _tracker: str

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]:
        latest = self._latest_step(_read_tracker(root, self._tracker))
        tracker = self._tracker

        def verdict(ckpt: CheckpointDir, step: int) -> str:
            if latest is None:
                return f"no valid {tracker} pointer"
            if step > latest:
                return f"newer than {tracker} ({latest}): being written or cut off"
            return _torn_files(ckpt)

        return _list(root, self._pattern, verdict)

    def _latest_step(self, text: str | None) -> int | None:
        raise NotImplementedError


class MegatronLayout(_PointerLayout):
    """Megatron-LM: ``iter_NNNNNNN/`` and ``latest_checkpointed_iteration.txt``."""

    name = "megatron"
    _pattern = _MEGATRON_DIR
    _tracker = _MEGATRON_TRACKER

    def _latest_step(self, text: str | None) -> int | None:
        if text is None or not re.fullmatch(r"\d{1,18}", text, re.ASCII):
            return None
        return int(text)


class DeepSpeedLayout(_PointerLayout):
    """DeepSpeed: ``global_stepN/`` and a ``latest`` file holding ``global_stepN``."""

    name = "deepspeed"
    _pattern = _DEEPSPEED_DIR
    _tracker = _DEEPSPEED_TRACKER

    def _latest_step(self, text: str | None) -> int | None:
        match = _DEEPSPEED_DIR.fullmatch(text or "")
        return int(match.group(1)) if match else None


class GenericLayout:
    """A directory per step, ``step_<N>/``, complete once it holds ``DONE`` or ``.done``."""

    name = "generic"

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]:
        return _list(root, _GENERIC_DIR, _generic_verdict)


def _generic_verdict(ckpt: CheckpointDir, _step: int) -> str:
    if ckpt.file("DONE") is None and ckpt.file(".done") is None:
        return "no DONE or .done marker"
    return ""
