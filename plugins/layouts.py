"""Built-in checkpoint layouts (entry-point group ``b300.checkpoint_layouts``).

Each implements :class:`b300.interfaces.CheckpointLayout`: it lists the
checkpoints under a root with their step and time and tells one the
framework's own loader would load from one still being written, cut off by a
crash or torn. The verdicts come from the checkpoint's contents
(:mod:`b300.checkpoints.rules`), never from timestamps. Each looks at the root
with one ``scandir`` and at each candidate checkpoint with one walk
(:func:`b300.checkpoints.walk.walk_checkpoint`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from b300.checkpoints.rules import (
    dcp_problem,
    deepspeed_problem,
    hf_trainer_problem,
    lightning_ckpt,
    megatron_dist_problem,
    megatron_legacy_problem,
)
from b300.checkpoints.walk import CheckpointDir, FileEntry, real_root, top_entries, utc, walk_checkpoint
from b300.interfaces import CheckpointLayout
from b300.model import CheckpointInfo

# re.ASCII: int() would accept other scripts' digits, a name no framework writes.
_DCP_DIR = re.compile(r"(?:step_|step-|checkpoint-|iter_)(\d{1,18})", re.ASCII)
_MEGATRON_DIR = re.compile(r"iter_(\d{1,18})", re.ASCII)
_DEEPSPEED_DIR = re.compile(r"global_step(\d{1,18})", re.ASCII)
_HF_DIR = re.compile(r"checkpoint-(\d{1,18})", re.ASCII)
_GENERIC_DIR = re.compile(r"step_(\d{1,18})", re.ASCII)
_LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=(\d{1,18})(?:[-_.]|$)", re.ASCII)
_MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
_TRACKER_MAX_BYTES = 4096
_Verdict = Callable[[CheckpointDir, int], str]


def _list(root: str, pattern: re.Pattern[str], why_incomplete: _Verdict, layout: str,
          extra: dict[str, int] | None = None) -> list[CheckpointInfo]:
    """Checkpoints whose directory name matches ``pattern`` (or is in ``extra``, name -> step);
    '' from ``why_incomplete`` = complete."""
    root_real = real_root(root)
    if root_real is None:
        return []
    found: list[CheckpointInfo] = []
    for name, path, is_dir in top_entries(root_real):
        match = pattern.fullmatch(name)
        if not is_dir or (match is None and name not in (extra or {})):
            continue
        step = int(match.group(1)) if match else (extra or {})[name]
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
                layout=layout,
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


def _no_files(ckpt: CheckpointDir) -> str:
    return "no files" if not ckpt.files else ""


def _is_megatron_dist(ckpt: CheckpointDir) -> bool:
    return ckpt.file("metadata.json") is not None or ckpt.file("common.pt") is not None


class DcpLayout:
    """PyTorch Distributed Checkpoint: ``step_<N>/`` (or ``step-N``, ``checkpoint-N``)
    holding ``__<rank>_<n>.distcp`` files and ``.metadata``.

    Complete when ``.metadata`` (DCP renames it into place after every rank's
    data) can be read and every storage file it names is there with at least
    the bytes it records; for a save without collectives, every rank's
    ``__<rank>.metadata`` and the files each names. A folder that holds
    megatron-core's ``metadata.json`` or ``common.pt`` (``iter_N``) is judged by
    megatron-core's rule, which needs ``metadata.json`` too.
    """

    name = "dcp"

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]:
        return _list(root, _DCP_DIR, _dcp_verdict, self.name)


def _dcp_verdict(ckpt: CheckpointDir, _step: int) -> str:
    why: str = megatron_dist_problem(ckpt) if _is_megatron_dist(ckpt) else dcp_problem(ckpt)
    return why


class MegatronLayout:
    """Megatron: ``iter_NNNNNNN/`` (and ``release/``) under one root.

    - megatron-core ``dist_checkpointing`` folders (``metadata.json``/``common.pt``):
      ``metadata.json`` present and the DCP rule for the ``torch_dist`` backend;
    - Megatron-LM's legacy per-rank folders (``mp_rank_TT[_PPP]/model_optim_rng.pt``):
      ``latest_checkpointed_iteration.txt`` names this iteration or a later one (or
      ``release`` for ``release/``), and every tensor/pipeline rank's file is there
      and complete. Megatron-LM writes the tracker after the barrier that follows
      every rank's save, so a legacy folder beyond it is still being written.
    """

    name = "megatron"

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]:
        text = _read_tracker(root, _MEGATRON_TRACKER)
        release = text == "release"
        latest = int(text) if text is not None and re.fullmatch(r"\d{1,18}", text, re.ASCII) else None
        tracker = _MEGATRON_TRACKER

        def verdict(ckpt: CheckpointDir, step: int) -> str:
            why: str
            if _is_megatron_dist(ckpt):
                why = megatron_dist_problem(ckpt)
                return why
            is_release = os.path.basename(ckpt.path) == "release"
            if is_release and not release:
                return f"{tracker} does not say release"
            if not is_release:
                if latest is None:
                    return f"no valid {tracker} pointer" + (" (it says release)" if release else "")
                if step > latest:
                    return f"newer than {tracker} ({latest}): being written or cut off"
            why = megatron_legacy_problem(ckpt)
            return why

        return _list(root, _MEGATRON_DIR, verdict, self.name, extra={"release": 0})


class DeepSpeedLayout:
    """DeepSpeed: ``global_stepN/`` holding every rank's files (see
    :func:`b300.checkpoints.rules.deepspeed_problem`); ``latest`` is not trusted, as rank 0
    writes it before the other ranks have finished."""

    name = "deepspeed"

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]:
        return _list(root, _DEEPSPEED_DIR, lambda ckpt, _s: deepspeed_problem(ckpt), self.name)


class HfTrainerLayout:
    """Hugging Face transformers ``Trainer``: ``checkpoint-N/`` with ``trainer_state.json``
    (written last) and the weights it resumes from."""

    name = "hf"

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]:
        return _list(root, _HF_DIR, lambda ckpt, _s: hf_trainer_problem(ckpt), self.name)


class LightningLayout:
    """PyTorch Lightning: ``*.ckpt`` files (each one ``torch.save`` zip) directly under the root.

    A file is complete when its zip directory is there and its pickle holds a
    ``state_dict`` (read without unpickling); the step is the ``global_step``
    it records (else ``step=N`` in its name). ``last.ckpt`` is listed like any other.
    """

    name = "lightning"

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]:
        root_real = real_root(root)
        if root_real is None:
            return []
        found: list[CheckpointInfo] = []
        for name, path, is_dir in top_entries(root_real):
            if is_dir or not name.endswith(".ckpt"):
                continue
            try:
                st = os.stat(path)
            except OSError:
                continue
            step, why = lightning_ckpt(path)
            if step is None:
                match = _LIGHTNING_STEP.search(name)
                step = int(match.group(1)) if match else 0
            entry = FileEntry(name, st.st_size, st.st_mtime)
            found.append(CheckpointInfo(path=path, step=step, mtime=utc(entry.mtime), complete=not why,
                                        size_bytes=entry.size, files=1, why_incomplete=why, layout=self.name))
        found.sort(key=lambda c: (c.step, c.path))
        return found


class GenericLayout:
    """A directory per step, ``step_<N>/``, complete once it holds ``DONE`` or ``.done``."""

    name = "generic"

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]:
        return _list(root, _GENERIC_DIR, _generic_verdict, self.name)


def _generic_verdict(ckpt: CheckpointDir, _step: int) -> str:
    if ckpt.file("DONE") is None and ckpt.file(".done") is None:
        return "no DONE or .done marker"
    return ""


class AutoLayout:
    """``layout = "auto"``: recognises the format from the root (see
    :func:`b300.checkpoints.layouts.recognise`) and lists with that layout; every
    checkpoint's ``layout`` says which was chosen."""

    name = "auto"

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]:
        from b300.checkpoints.layouts import recognise

        chosen, _why = recognise(root)
        if chosen is None:
            return []
        found: list[CheckpointInfo] = BUILTIN_LAYOUTS[chosen]().list_checkpoints(root)
        return found


BUILTIN_LAYOUTS: dict[str, Callable[[], CheckpointLayout]] = {
    "dcp": DcpLayout, "megatron": MegatronLayout, "deepspeed": DeepSpeedLayout,
    "hf": HfTrainerLayout, "lightning": LightningLayout, "generic": GenericLayout,
}
