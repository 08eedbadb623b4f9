"""Finding checkpoint layouts (plugins in the entry-point group ``b300.checkpoint_layouts``,
loaded by :class:`b300.plugin_registry.PluginRegistry`), and recognising a folder's layout."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..interfaces import CheckpointLayout
from ..plugin_registry import CHECKPOINT_LAYOUTS, PluginRegistry
from .walk import real_root, top_entries


def available_layouts(plugins: PluginRegistry | None = None) -> Mapping[str, CheckpointLayout]:
    """Every layout plugin that loads and fits the protocol, by entry-point name.

    ``plugins`` is the caller's registry (the daemon's); without one a fresh registry
    loads the group. A plugin that fails is logged and skipped (b300.plugin_registry).
    """
    return (plugins or PluginRegistry()).plugins(CHECKPOINT_LAYOUTS)


def load_layout(name: str, plugins: PluginRegistry | None = None) -> CheckpointLayout:
    """The layout plugin registered as ``name`` (a spec's ``[checkpoint] layout``).

    Raises UsageError when no plugin of that name loaded (the message lists those that
    did, or says why that one did not).
    """
    return (plugins or PluginRegistry()).get(CHECKPOINT_LAYOUTS, name)


#: When two formats are equally likely, the first named here wins.
_PREFERENCE = ("deepspeed", "megatron", "hf", "dcp", "lightning", "generic")
_AUTO_DIRS = {
    "deepspeed": re.compile(r"global_step\d{1,18}", re.ASCII),
    "megatron": re.compile(r"iter_\d{1,18}|release", re.ASCII),
    "step": re.compile(r"(?:step_|step-|checkpoint-)\d{1,18}", re.ASCII),
}
_DCP_SIGNS = re.compile(r"\.metadata|__\d+\.metadata|__\d+_\d+\.distcp", re.ASCII)
_HF_SIGNS = frozenset({"trainer_state.json", "model.safetensors", "model.safetensors.index.json",
                       "pytorch_model.bin", "pytorch_model.bin.index.json", "training_args.bin", "config.json"})


def _names(path: str) -> set[str]:
    try:
        with os.scandir(path) as it:
            return {e.name for e in it}
    except OSError:
        return set()


def recognise(root: str) -> tuple[str | None, str]:
    """Which built-in layout the folder ``root`` looks like, and why, from one look at its names.

    ``(None, why)`` when it looks like none. Counts the folders (or ``.ckpt``
    files) each format would name and peeks at their top-level names where two
    formats share a naming (``checkpoint-N``: HF Trainer or DCP; ``step_N``: DCP
    or generic).
    """
    root_real = real_root(root)
    if root_real is None:
        return None, "the folder is missing"
    votes = dict.fromkeys(_PREFERENCE, 0)
    trackers: list[str] = []
    for name, path, is_dir in top_entries(root_real):
        if not is_dir:
            if name.endswith(".ckpt"):
                votes["lightning"] += 1
            elif name == "latest":
                trackers.append("deepspeed")
            elif name == "latest_checkpointed_iteration.txt":
                trackers.append("megatron")
            continue
        if _AUTO_DIRS["deepspeed"].fullmatch(name):
            votes["deepspeed"] += 1
        elif _AUTO_DIRS["megatron"].fullmatch(name):
            votes["megatron"] += 1
        elif _AUTO_DIRS["step"].fullmatch(name):
            inside = _names(path)
            if any(_DCP_SIGNS.fullmatch(n) for n in inside):
                votes["dcp"] += 1
            elif inside & _HF_SIGNS:
                votes["hf"] += 1
            elif "DONE" in inside or ".done" in inside or name.startswith("step_"):
                votes["generic"] += 1
            else:
                votes["hf"] += 1
    for t in trackers:
        votes[t] += 1
    best = max(_PREFERENCE, key=lambda n: (votes[n], -_PREFERENCE.index(n)))
    if votes[best] == 0:
        return None, "no checkpoint of any known layout in it"
    seen = ", ".join(f"{n} {votes[n]}" for n in _PREFERENCE if votes[n])
    return best, f"looks like {best} ({seen})"


def explain_nothing(layout: str, root: str) -> str:
    """One line for a folder where ``layout`` found no checkpoint: what it looks like instead."""
    chosen, why = recognise(root)
    if real_root(root) is None:
        return f"no checkpoint of layout {layout} found: {why}"
    if chosen is None or chosen == layout:
        return f"no checkpoint of layout {layout} found ({why})"
    return f"no checkpoint of layout {layout} found; {why}"
