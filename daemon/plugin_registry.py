"""One loader for every plugin group, in the spirit of pluggy's ``PluginManager``.

A :class:`PluginGroup` names an entry-point group and what its plugins must be: the
protocol of :mod:`b300.interfaces` they implement, and whether the registry hands out the
plugin object itself (checkpoint layouts, drift probes: a class built with no arguments,
or a ready object) or a factory that callers build with options (replication targets,
Slurm backends). The four groups are declared here, once.

A :class:`PluginRegistry` loads a group the first time it is asked for it and keeps the
result for its own life: the daemon builds one at start and passes it in, a test or a
command builds its own (no module-level cache). A plugin object is built once per registry
and shared by every thread that asks for it, so layouts and probes must keep no state.

The failure policy is the same for every group: a plugin that fails to import, to build,
or to match its group (a protocol member missing, a ``name`` that is not its entry-point
name, a group's own rule), or whose name another distribution claims too, is logged once
(``plugin.skipped`` with the group, the plugin, its entry point, its distribution and why)
and skipped; it never takes the daemon down. Asking for a skipped or unknown plugin by
name raises the group's error (a :class:`~b300.errors.UsageError`), one line naming it and
why, or what is available.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar, cast

import structlog

from .errors import ConfigError, UsageError
from .interfaces import CheckpointLayout, DriftProbe, ReplicationTarget, SlurmClient

log = structlog.get_logger(__name__)
P = TypeVar("P")
#: This package's distribution: its plugins are the built-ins (see :func:`_one_claim`).
OWN_DISTRIBUTION = "b300-orchestrator"

#: A replication target plugin: called with the target's options as keyword arguments.
ReplicationTargetFactory = Callable[..., ReplicationTarget]
#: A Slurm backend plugin: called with ``slurm_conf``, ``bin_dir`` and ``timeout`` as keyword
#: arguments (the built-in ``pyslurm`` one with ``slurm_conf``, ``timeout`` and ``fallback``,
#: the cli client it hands some calls to; see :func:`b300.slurm.make_slurm_client`).
SlurmBackendFactory = Callable[..., SlurmClient]


@dataclass(frozen=True, slots=True)
class PluginGroup(Generic[P]):
    """An entry-point group and what its plugins must be.

    ``protocol`` is the runtime-checkable protocol a plugin (``factory=False``) or what its
    factory builds (``factory=True``) implements; ``P`` is what the registry hands out: the
    plugin, or its factory (declared with the group, since a protocol class cannot be a
    type parameter's value). ``rule`` is a group's own check of a plugin object, returning
    why it fails (None: it passes). ``what`` names a plugin in messages; ``error`` is what
    asking for a missing one raises.
    """

    entry_points: str
    what: str
    protocol: type
    error: type[UsageError] = UsageError
    factory: bool = False
    rule: Callable[[Any], str | None] | None = None


@dataclass(frozen=True, slots=True)
class LoadedGroup(Generic[P]):
    """A group as one registry loaded it: the plugins by name, and why the others were skipped."""

    plugins: Mapping[str, P]
    skipped: Mapping[str, str]


def _probe_rule(probe: Any) -> str | None:
    if probe.default_policy not in ("drain", "warn"):
        return f"default_policy must be 'drain' or 'warn', got {probe.default_policy!r}"
    return None


CHECKPOINT_LAYOUTS: PluginGroup[CheckpointLayout] = PluginGroup(
    "b300.checkpoint_layouts", "checkpoint layout", CheckpointLayout)
DRIFT_PROBES: PluginGroup[DriftProbe] = PluginGroup(
    "b300.probes", "drift probe", DriftProbe, ConfigError, rule=_probe_rule)
REPLICATION_TARGETS: PluginGroup[ReplicationTargetFactory] = PluginGroup(
    "b300.replication_targets", "replication target kind", ReplicationTarget, factory=True)
SLURM_BACKENDS: PluginGroup[SlurmBackendFactory] = PluginGroup(
    "b300.slurm_backends", "Slurm backend", SlurmClient, ConfigError, factory=True)


class PluginRegistry:
    """Plugins found through entry points, loaded once per group and kept (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: dict[PluginGroup[Any], LoadedGroup[Any]] = {}

    def load(self, group: PluginGroup[P]) -> LoadedGroup[P]:
        """The group's plugins (loading and checking them on first use) and the skipped ones."""
        with self._lock:
            loaded = self._loaded.get(group)
            if loaded is None:
                loaded = self._loaded[group] = _load(group)
            return cast(LoadedGroup[P], loaded)

    def plugins(self, group: PluginGroup[P]) -> Mapping[str, P]:
        """Every plugin of the group that loaded, by entry-point name, in name order."""
        return self.load(group).plugins

    def get(self, group: PluginGroup[P], name: str) -> P:
        """The plugin registered as ``name``; the group's error (one line) when it was
        skipped (and why) or no plugin has that name (and which ones there are)."""
        loaded = self.load(group)
        if name in loaded.plugins:
            return loaded.plugins[name]
        if name in loaded.skipped:
            raise group.error(f"{group.what} {name!r} did not load: {loaded.skipped[name]}")
        known = ", ".join(loaded.plugins) or "none"
        raise group.error(f"unknown {group.what} {name!r} (available: {known})")


def _load(group: PluginGroup[P]) -> LoadedGroup[P]:
    plugins: dict[str, P] = {}
    skipped: dict[str, str] = {}
    claims: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=group.entry_points):
        claims.setdefault(ep.name, []).append(ep)
    for name in sorted(claims):
        chosen, refused = _one_claim(claims[name])
        for ep, reason in refused:
            _skip(group, ep, reason)
        if chosen is None:
            skipped[name] = refused[0][1]
            continue
        try:
            plugin, why = _admit(group, chosen, chosen.load())
        except Exception as exc:  # a third-party plugin may raise anything on import or build
            plugin, why = None, f"{type(exc).__name__}: {exc}"
        if why is None:
            plugins[name] = cast(P, plugin)
        else:
            _skip(group, chosen, why)
            skipped[name] = why
    return LoadedGroup(plugins, skipped)


def _dist(ep: EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "?"


def _one_claim(claims: list[EntryPoint]) -> tuple[EntryPoint | None, list[tuple[EntryPoint, str]]]:
    """Which of the entry points claiming one name serves it, and why the others do not.

    A built-in (this package's distribution) wins, so a third party cannot shadow it
    by accident; between third parties nobody does: which one the file system lists
    first is no way to choose.
    """
    if len(claims) == 1:
        return claims[0], []
    own = [ep for ep in claims if _dist(ep).lower().replace("_", "-") == OWN_DISTRIBUTION]
    if len(own) == 1:
        return own[0], [(ep, f"the built-in plugin {own[0].value} has that name")
                        for ep in claims if ep is not own[0]]
    why = "provided by several distributions: " + ", ".join(f"{_dist(ep)} ({ep.value})" for ep in claims)
    return None, [(ep, why) for ep in claims]


def _skip(group: PluginGroup[Any], ep: EntryPoint, why: str) -> None:
    log.warning("plugin.skipped", group=group.entry_points, plugin=ep.name, value=ep.value, dist=_dist(ep),
                why=why)


def _admit(group: PluginGroup[Any], ep: EntryPoint, obj: object) -> tuple[object, str | None]:
    """What the registry hands out for ``obj`` (an entry point's object), or why it does not."""
    protocol = group.protocol
    if group.factory:
        if not callable(obj):
            return None, f"{type(obj).__name__} is not callable (a {protocol.__name__} factory)"
        if isinstance(obj, type):
            missing = [m for m in _members(protocol)[1] if not callable(getattr(obj, m, None))]
            if missing:
                return None, (f"{obj.__name__} does not implement {protocol.__name__} "
                              f"(missing: {', '.join(missing)})")
        return _checked_factory(group, ep.name, obj), None
    plugin = obj() if isinstance(obj, type) else obj
    why = _mismatch(protocol, plugin)
    if why is None and getattr(plugin, "name", ep.name) != ep.name:
        why = f"names itself {getattr(plugin, 'name', None)!r}, not its entry-point name {ep.name!r}"
    if why is None and group.rule is not None:
        why = group.rule(plugin)
    return plugin, why


def _checked_factory(group: PluginGroup[Any], name: str,
                     factory: Callable[..., object]) -> Callable[..., object]:
    """``factory`` whose every product is checked against the group's protocol."""

    def build(**options: Any) -> object:
        built = factory(**options)
        why = _mismatch(group.protocol, built)
        if why is not None:
            raise group.error(f"{group.what} {name!r}: {why}")
        return built

    return build


def _mismatch(protocol: type, obj: object) -> str | None:
    """Why ``obj`` does not implement ``protocol`` (None: it does)."""
    data, methods = _members(protocol)
    missing = [m for m in data if not hasattr(obj, m)]
    missing += [m for m in methods if not callable(getattr(obj, m, None))]
    if missing or not isinstance(obj, protocol):
        return f"{type(obj).__name__} does not implement {protocol.__name__} (missing: {', '.join(missing)})"
    name = getattr(obj, "name", "") if "name" in data else "-"
    if not isinstance(name, str) or not name:
        return f"{type(obj).__name__}.name must be a non-empty string, got {name!r}"
    return None


def _members(protocol: type) -> tuple[list[str], list[str]]:
    """The public data members and methods ``protocol`` declares (with its protocol bases)."""
    data: list[str] = []
    methods: list[str] = []
    for base in reversed(protocol.__mro__):
        if base is object or base.__module__ == "typing":
            continue
        data += [n for n in inspect.get_annotations(base) if not n.startswith("_")]
        for n, v in vars(base).items():
            if n.startswith("_"):
                continue
            if isinstance(v, property):
                data.append(n)
            elif callable(v):
                methods.append(n)
    return data, methods
