"""Finding checkpoint layouts: plugins in the entry-point group ``b300.checkpoint_layouts``."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import structlog

from ..errors import UsageError
from ..interfaces import CheckpointLayout

log = structlog.get_logger(__name__)

GROUP = "b300.checkpoint_layouts"


def available_layouts() -> dict[str, CheckpointLayout]:
    """Every layout plugin that loads and fits the protocol, by entry-point name.

    A plugin that fails to import, to construct, or does not implement
    :class:`CheckpointLayout` is logged and skipped; it never raises here.
    """
    layouts: dict[str, CheckpointLayout] = {}
    for ep in entry_points(group=GROUP):
        layout = _load(ep.name, ep)
        if layout is not None:
            layouts.setdefault(ep.name, layout)
    return layouts


def load_layout(name: str) -> CheckpointLayout:
    """The layout plugin registered as ``name`` (a spec's ``[checkpoint] layout``).

    Raises UsageError when no plugin of that name loads (the message lists those that do).
    """
    for ep in entry_points(group=GROUP, name=name):
        layout = _load(name, ep)
        if layout is not None:
            return layout
    known = ", ".join(sorted(available_layouts())) or "none"
    raise UsageError(f"unknown checkpoint layout {name!r} (available: {known})")


def _load(name: str, ep: EntryPoint) -> CheckpointLayout | None:
    try:
        factory = ep.load()
        layout = factory()
    except Exception as exc:  # a third-party plugin may raise anything
        log.warning("checkpoint.layout_plugin_failed", plugin=name, error=f"{type(exc).__name__}: {exc}")
        return None
    if not isinstance(layout, CheckpointLayout):
        log.warning("checkpoint.layout_plugin_invalid", plugin=name, why="does not implement CheckpointLayout")
        return None
    return layout
