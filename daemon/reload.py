"""What a SIGHUP may change in a running daemon (pure).

Settings read on every use (poll interval, log level, admin group, recovery
thresholds, report and alert delivery) are applied live; the ones the daemon
built its parts from at start-up (state directory, database, socket, Slurm
client, drift SSH settings, metrics listener) need a restart, and are kept at
their old values until then.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .config import Config

#: Fields of Config a running daemon can take over without a restart.
LIVE_FIELDS = frozenset({
    "poll_interval_s", "max_backoff_s", "log_format", "log_level",
    "admin_group", "recovery", "report", "alerts",
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
