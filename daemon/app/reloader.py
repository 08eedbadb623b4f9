"""Config reloads (SIGHUP): what may change in a running daemon (pure), and applying it.

Settings read on every use (poll interval, log level, admin group, recovery
thresholds, ``[training]``, ``[spares]``, report and alert delivery) are applied live
(``[training]``: the running attempts' detectors take the new thresholds at the next cycle
and keep their state, :meth:`b300.training.health_step.TrainingWatch.check`; ``[spares]``: a new
pool is filled and a dropped one's reservation deleted at the next upkeep,
:meth:`b300.spares.pools.SparePools.upkeep`); the ones the daemon
built its parts from at start-up (state directory, database, socket, Slurm
client, drift SSH settings, metrics listener) need a restart, and are kept at
their old values until then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from ..config import Config, load_config
from ..errors import ConfigError, StoreError
from ..events import Kind
from ..interfaces import NewEvent, Store

#: Fields of Config a running daemon can take over without a restart.
LIVE_FIELDS = frozenset({
    "poll_interval_s", "max_backoff_s", "log_format", "log_level",
    "admin_group", "recovery", "report", "alerts", "drill", "training", "spares",
    "triage",
})


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """The config to run with after a reload, and what differed from the old one."""

    config: Config
    applied: tuple[str, ...]
    needs_restart: tuple[str, ...]


def plan_reload(old: Config, new: Config) -> ConfigChange:
    """Take the live-safe fields from ``new``; report the others as needing a restart.

    A changed ``recovery.enabled`` needs a restart (the recovery service is
    created or not at start-up); its thresholds are live.
    """
    applied: list[str] = []
    restart: list[str] = []
    live: dict[str, Any] = {}
    for f in dataclasses.fields(Config):
        if f.name == "path":
            continue
        before, after = getattr(old, f.name), getattr(new, f.name)
        if before == after:
            continue
        if f.name == "recovery" and before.enabled != after.enabled:
            restart.append("recovery.enabled")
            after = dataclasses.replace(after, enabled=before.enabled)
            if after == before:
                continue
        if f.name in LIVE_FIELDS:
            applied.append(f.name)
            live[f.name] = after
        else:
            restart.append(f.name)
    return ConfigChange(dataclasses.replace(old, **live), tuple(applied), tuple(restart))


log = structlog.get_logger(__name__)


class ConfigReloader:
    """Re-reads the config file and hands the live-safe part to whoever applies it.

    ``apply(old, change)`` runs the change in the daemon (under its action lock for
    what the poll cycle reads). A bad file keeps the old config: one error line and
    one ``config.refused`` event.
    """

    def __init__(self, path: str, current: Callable[[], Config],
                 apply: Callable[[Config, ConfigChange], None], store: Store,
                 clock: Callable[[], datetime]) -> None:
        self._path = path
        self._current = current
        self._apply = apply
        self._store = store
        self._clock = clock

    def reload(self) -> None:
        try:
            new = load_config(self._path)
        except ConfigError as exc:
            log.error("config.refused", path=self._path, reason=str(exc))
            self._record(Kind.CONFIG_REFUSED, {"reason": str(exc)})
            return
        old = self._current()
        change = plan_reload(old, new)
        self._apply(old, change)
        log.info("config.reloaded", path=self._path, changed=list(change.applied),
                 needs_restart=list(change.needs_restart))
        self._record(Kind.CONFIG_RELOADED, {"changed": list(change.applied),
                                            "needs_restart": list(change.needs_restart)})

    def _record(self, kind: Kind, data: dict[str, Any]) -> None:
        try:
            self._store.append_events([NewEvent(kind, data=data)], self._clock())
        except StoreError as exc:
            log.warning("config.event_not_recorded", kind=kind.value, error=str(exc))
