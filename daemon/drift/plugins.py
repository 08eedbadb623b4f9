"""Finding the drift probes: entry-point group ``b300.probes``.

A plugin that fails to import, to build or to look like a
:class:`~b300.interfaces.DriftProbe` is logged and skipped; it never takes
the daemon down.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib.metadata import EntryPoint, entry_points

import structlog

from ..interfaces import DriftProbe

log = structlog.get_logger(__name__)
GROUP = "b300.probes"


def load_probes(wanted: Sequence[str] | None = None,
                found: Iterable[EntryPoint] | None = None) -> dict[str, DriftProbe]:
    """The probes by name (all registered ones, or only ``wanted``), in name order.

    ``found`` replaces the installed entry points (for tests). Names in
    ``wanted`` that no plugin provides are logged.
    """
    probes: dict[str, DriftProbe] = {}
    for ep in sorted(found if found is not None else entry_points(group=GROUP), key=lambda e: e.name):
        if wanted is not None and ep.name not in wanted:
            continue
        try:
            obj = ep.load()
            probe = obj() if isinstance(obj, type) else obj
            if not isinstance(probe, DriftProbe) or probe.default_policy not in ("drain", "warn"):
                raise TypeError("does not implement DriftProbe (name, default_policy, command, parse)")
            if probe.name != ep.name:
                raise TypeError(f"names itself {probe.name!r}")
        except Exception as exc:
            log.error("drift.probe_skipped", probe=ep.name, value=ep.value,
                      error=f"{type(exc).__name__}: {exc}")
            continue
        probes[ep.name] = probe
    for name in sorted(set(wanted or ()) - set(probes)):
        log.error("drift.probe_missing", probe=name)
    return probes
