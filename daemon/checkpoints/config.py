"""``[checkpoints]`` of the daemon's config: the watch pass, retention, and offsite targets.

::

    [checkpoints]
    check_interval = "60s"        # list, fingerprint and check the schedule this often
    allow_signals = true          # false: never signal a job, even one whose spec opts in
    signal_grace = "5m"           # a signalled job has this long to checkpoint before the
                                  # overdue alert; a job that ends within it died of the signal
    manifests_per_pass = 2        # checksum manifests made per run per pass
    maintain_interval = "10m"     # replicate, then prune, this often
    prune = false                 # delete local checkpoints by the rules below (else plan only)
    prune_remote = true           # prune replicas on the targets by the same rules
    keep_last = 3
    keep_hourly_for = "24h"       # "0" turns a rule off
    keep_daily_for = "7d"
    replication_concurrency = 4   # files in flight per target
    bandwidth_limit = "200MB"     # per second, all targets together; "" = unlimited
    replicas_per_pass = 4         # checkpoints copied per pass at most (the newest first)

    [[checkpoints.targets]]       # one table per offsite target
    name = "lustre-b"             # shown in b300ctl checkpoints; unique
    kind = "filesystem"           # a b300.replication_targets plugin: filesystem | sftp | s3
    path = "/mnt/offsite/{run}"   # the plugin's own options; "{run}" becomes the run id

Every target must put ``{run}`` into one of its string options so that two
runs' ``iter_0001000`` never land on the same replica. Secrets never sit in
this file: an option ``X_file`` names a file (mode 0600 or 0640) whose content
is passed to the plugin as ``X`` (``aws_secret_access_key_file``, ``password_file``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..errors import ConfigError, UsageError
from ..permissions import check_secret_file
from ..validate import get_bool, get_int, get_str, parse_duration, reject_unknown
from .retention import RetentionPolicy

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}")
_OPTION = re.compile(r"[a-z][a-z0-9_]{0,63}")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?)?[bB]?(?:/s)?\s*$")
_UNITS = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}
#: Plugin options that are secrets: refused inline, read from ``<name>_file``.
SECRET_OPTIONS = frozenset({"aws_secret_access_key", "password", "passphrase"})
_COMMON = {"check_interval", "allow_signals", "signal_grace", "manifests_per_pass", "maintain_interval",
           "prune", "prune_remote", "keep_last", "keep_hourly_for", "keep_daily_for",
           "replication_concurrency", "bandwidth_limit", "replicas_per_pass", "targets", "roots"}
#: A checkpoint root goes into the systemd unit's ReadWritePaths (space-separated, unquoted).
_ROOT = re.compile(r"/[A-Za-z0-9._/@+:=,-]{0,4000}")


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """One offsite target: the plugin ``kind`` and its options, ``{run}`` not yet filled in."""

    name: str
    kind: str
    options: tuple[tuple[str, Any], ...]
    secret_files: tuple[tuple[str, str], ...] = ()  # (option, file it is read from)

    def options_for(self, run_id: str) -> dict[str, Any]:
        """The plugin's keyword arguments for one run (secrets read now, so a rotated key is seen)."""
        opts = {k: v.replace("{run}", run_id) if isinstance(v, str) else v for k, v in self.options}
        for option, path in self.secret_files:
            check_secret_file(path, f"checkpoint target {self.name!r}: {option}_file")
            try:
                with open(path, encoding="utf-8") as fh:
                    opts[option] = fh.read().strip()
            except OSError as exc:
                raise ConfigError(f"checkpoint target {self.name!r}: cannot read {path}: "
                                  f"{exc.strerror}") from None
        opts["name"] = self.name
        return opts


@dataclass(frozen=True, slots=True)
class CheckpointsConfig:
    """[checkpoints]: the daemon's checkpoint pass (b300.checkpoints.checkpoint_pass) and upkeep
    (b300.checkpoints.upkeep)."""

    check_interval_s: float = 60.0
    allow_signals: bool = True
    signal_grace_s: float = 300.0
    manifests_per_pass: int = 2
    maintain_interval_s: float = 600.0
    prune: bool = False
    prune_remote: bool = True
    retention: RetentionPolicy = field(default_factory=lambda: RetentionPolicy(
        keep_last=3, hourly_for=timedelta(hours=24), daily_for=timedelta(days=7)))
    replication_concurrency: int = 4
    bandwidth_limit: float | None = None  # bytes per second
    replicas_per_pass: int = 4
    targets: tuple[TargetConfig, ...] = ()
    #: Folders that hold the runs' checkpoint folders. deploy/install.sh makes them the unit's
    #: ReadWritePaths; when set, a spec whose checkpoint folder is outside them is refused.
    roots: tuple[str, ...] = ()


def _roots(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: roots must be a list of absolute paths")
    for v in value:
        if not _ROOT.fullmatch(v) or "/../" in f"{v}/" or v.rstrip("/") == "":
            raise ConfigError(f"{where}: roots: {v[:80]!r} must be an absolute path of letters, digits "
                              "and ._/@+:=,- (it goes into the systemd unit)")
    return tuple(dict.fromkeys(v.rstrip("/") for v in value))


def parse_size_rate(value: Any, key: str, where: str) -> float | None:
    """Bytes per second from ``"200MB"``, ``"1.5GiB/s"`` or an integer; ``""`` or 0 = unlimited."""
    if isinstance(value, bool):  # before the 0 test: False == 0 in Python
        raise ConfigError(f"{where}: {key} must be a rate like '200MB' (per second), got {value!r}")
    if value in ("", 0):
        return None
    if isinstance(value, int | float):
        rate = float(value)
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        rate = float(m.group(1)) * _UNITS[m.group(2).lower() if m.group(2) else None]
    else:
        raise ConfigError(f"{where}: {key} must be a rate like '200MB' (per second), got {str(value)[:40]!r}")
    if rate < 1024:
        raise ConfigError(f"{where}: {key} must be at least 1 KiB per second, got {value!r}")
    return rate


def parse_span(value: Any, key: str, where: str, err: type[UsageError] = ConfigError) -> timedelta:
    """A retention span: a duration, or 0 / ``"0"`` to turn the rule off."""
    if not isinstance(value, bool) and value in (0, "0"):  # False == 0 is a typo, not "off"
        return timedelta(0)
    return timedelta(seconds=parse_duration(value, key, where, err))


def _target(raw: Any, i: int, where: str) -> TargetConfig:
    tw = f"{where}: targets[{i}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{tw} must be a table ([[checkpoints.targets]])")
    name = get_str(raw, "name", tw, ConfigError, pattern=_NAME, what="a name of letters, digits, _ . -")
    kind = get_str(raw, "kind", tw, ConfigError, pattern=_KIND, what="a plugin name like filesystem")
    if not name or not kind:
        raise ConfigError(f"{tw} needs a name and a kind (filesystem, sftp, s3)")
    options: list[tuple[str, Any]] = []
    secrets: list[tuple[str, str]] = []
    for key, value in raw.items():
        if key in ("name", "kind"):
            continue
        if not _OPTION.fullmatch(key):
            raise ConfigError(f"{tw}: option {key[:40]!r} is not a valid option name")
        if key in SECRET_OPTIONS:
            raise ConfigError(f"{tw}: {key} must not be written in the config; "
                              f"put it in a file readable by the daemon only and set {key}_file")
        if key.endswith("_file") and key[: -len("_file")] in SECRET_OPTIONS:
            path = get_str(raw, key, tw, ConfigError, pattern=re.compile(r"/[^\x00\n]*"),
                           what="an absolute path")
            assert path is not None
            secrets.append((key[: -len("_file")], path))
            continue
        if isinstance(value, str) and "\x00" in value:
            raise ConfigError(f"{tw}: {key} contains a NUL byte")
        if not isinstance(value, str | int | float | bool):
            raise ConfigError(f"{tw}: {key} must be a string, number or boolean")
        options.append((key, value))
    if not any(isinstance(v, str) and "{run}" in v for _k, v in options):
        raise ConfigError(f"{tw} ({name}): one option (path or prefix) must contain {{run}}, "
                          "so that runs do not overwrite each other's replicas")
    return TargetConfig(name=name, kind=kind, options=tuple(options), secret_files=tuple(secrets))


def parse_checkpoints_config(table: Mapping[str, Any], where: str) -> CheckpointsConfig:
    """Validate ``[checkpoints]``; every problem is one ConfigError line naming the key."""
    if "signal" in table:
        raise ConfigError(f"{where}: signal has moved to the job spec: a job that checkpoints on a signal "
                          "says so with [checkpoint] signal = \"USR1\" (signal_to = \"batch\" or \"all\"); "
                          "here only allow_signals = true/false and signal_grace remain")
    reject_unknown(table, _COMMON, where, ConfigError)
    raw_targets = table.get("targets", [])
    if not isinstance(raw_targets, list):
        raise ConfigError(f"{where}: targets must be an array of tables ([[checkpoints.targets]])")
    targets = tuple(_target(t, i, where) for i, t in enumerate(raw_targets))
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{where}: two targets are named {dup!r}")
    keep_last = get_int(table, "keep_last", where, ConfigError, default=3, lo=1, hi=100000) or 3
    return CheckpointsConfig(
        check_interval_s=parse_duration(table.get("check_interval", 60), "check_interval",
                                        where, ConfigError),
        allow_signals=get_bool(table, "allow_signals", where, ConfigError, default=True),
        signal_grace_s=parse_duration(table.get("signal_grace", 300), "signal_grace", where, ConfigError),
        manifests_per_pass=get_int(table, "manifests_per_pass", where, ConfigError, default=2,
                                   lo=0, hi=1000) or 0,
        maintain_interval_s=parse_duration(table.get("maintain_interval", 600), "maintain_interval",
                                           where, ConfigError),
        prune=get_bool(table, "prune", where, ConfigError, default=False),
        prune_remote=get_bool(table, "prune_remote", where, ConfigError, default=True),
        retention=RetentionPolicy(
            keep_last=keep_last,
            hourly_for=parse_span(table.get("keep_hourly_for", "24h"), "keep_hourly_for", where),
            daily_for=parse_span(table.get("keep_daily_for", "7d"), "keep_daily_for", where)),
        replication_concurrency=get_int(table, "replication_concurrency", where, ConfigError,
                                        default=4, lo=1, hi=64) or 4,
        bandwidth_limit=parse_size_rate(table.get("bandwidth_limit", ""), "bandwidth_limit", where),
        replicas_per_pass=get_int(table, "replicas_per_pass", where, ConfigError, default=4,
                                  lo=1, hi=10000) or 4,
        targets=targets,
        roots=_roots(table.get("roots", []), where),
    )
