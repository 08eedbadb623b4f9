"""The drift probes: plugins in the entry-point group ``b300.probes``, loaded by
:class:`b300.plugin_registry.PluginRegistry` (a plugin that fails to import, to build or
to look like a :class:`~b300.interfaces.DriftProbe` is logged and skipped there; it never
takes the daemon down)."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from ..interfaces import DriftProbe
from ..plugin_registry import DRIFT_PROBES, PluginRegistry

log = structlog.get_logger(__name__)


def load_probes(wanted: Sequence[str] | None = None,
                plugins: PluginRegistry | None = None) -> dict[str, DriftProbe]:
    """The probes by name (every loaded one, or only those in ``wanted``), in name order.

    ``plugins`` is the caller's registry (the daemon's); without one a fresh registry
    loads the group. A name in ``wanted`` that no loaded plugin provides is logged
    (``drift.probe_missing``, with why) and left out: the scan runs the others.
    """
    registry = plugins or PluginRegistry()
    loaded = registry.load(DRIFT_PROBES)
    if wanted is None:
        return dict(loaded.plugins)
    for name in sorted(set(wanted) - set(loaded.plugins)):
        log.error("drift.probe_missing", probe=name,
                  why=loaded.skipped.get(name, "no plugin of that name is installed"))
    return {name: probe for name, probe in loaded.plugins.items() if name in wanted}
