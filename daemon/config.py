"""The daemon's configuration file (TOML), validated into a frozen ``Config``.

::

    [daemon]
    state_dir = "/var/lib/b300"          # SQLite database, lock file
    database_url = ""                    # default: sqlite:///<state_dir>/state.db
    socket = ""                          # default: <state_dir>/b300d.sock
    job_log_dir = ""                     # default: <state_dir>/job-logs; jobs' stdout/stderr
                                         # when a spec sets no output (must be on a filesystem
                                         # the compute nodes share)
    poll_interval = "15s"
    submit_grace = "60s"                 # how long an unconfirmed sbatch may still appear
    max_backoff = "5m"
    log_format = "auto"                  # auto | json | console
    log_level = "info"
    admin_group = ""                     # members may change things through b300ctl

    [slurm]
    backend = "cli"                      # cli | pyslurm | auto (pyslurm only when it is
                                         # built for the controller's Slurm release)
    conf = ""                            # SLURM_CONF for the Slurm tools
    bin_dir = ""                         # where sbatch & co. live (default: PATH)
    command_timeout = "30s"
    accounting_grace = "60s"             # how long a job Slurm calls ended may lack its
                                         # accounting record (slurmdbd slow or down) before
                                         # the controller's view alone is taken
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoints.config import CheckpointsConfig, parse_checkpoints_config
from .drift.config import DriftConfig, parse_drift_config
from .errors import ConfigError
from .liveness.config import LivenessConfig, load_liveness_config
from .ops_config import (
    AlertsConfig,
    MetricsConfig,
    ReportConfig,
    parse_alerts_config,
    parse_metrics_config,
    parse_report_config,
)
from .validate import get_bool, get_int, get_str, get_table, parse_duration, reject_unknown

DEFAULT_CONFIG = "/etc/b300/b300.toml"
_ABS = re.compile(r"/[^\x00\n]*")
_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True, slots=True)
class Config:
    path: str
    state_dir: str
    database_url: str
    socket: str
    job_log_dir: str = ""
    poll_interval_s: float = 15.0
    submit_grace_s: float = 60.0
    max_backoff_s: float = 300.0
    log_format: str = "auto"
    log_level: str = "info"
    admin_group: str = ""
    slurm_backend: str = "cli"
    slurm_conf: str | None = None
    slurm_bin_dir: str | None = None
    slurm_timeout_s: float = 30.0
    accounting_grace_s: float = 60.0
    lease_name: str = "default"  # daemons sharing a database and a lease name are one HA pair
    lease_ttl_s: float = 15.0  # a holder that stops renewing is replaced after this long
    drift: DriftConfig | None = None  # [drift]: see b300.drift.config
    recovery: RecoveryConfig = field(default_factory=lambda: RecoveryConfig())
    liveness: LivenessConfig = field(default_factory=LivenessConfig)  # [liveness]: b300.liveness
    checkpoints: CheckpointsConfig = field(default_factory=lambda: CheckpointsConfig())
    report: ReportConfig = field(default_factory=ReportConfig)  # [report]: see b300.ops_config
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)


@dataclass(frozen=True, slots=True)
class RecoveryConfig:
    """[recovery]: how failed attempts are handled (see b300.recovery)."""

    enabled: bool = True
    settle_s: float = 60.0            # wait this long for Slurm to name a failed node
    blackhole_failures: int = 3       # drain a node that failed this many different runs...
    blackhole_window_s: float = 86400.0  # ...within this window
    node_trigger: bool = True         # strigger on node down wakes the daemon at once


def _recovery(table: Mapping[str, Any], where: str) -> RecoveryConfig:
    reject_unknown(table, {"enabled", "settle", "blackhole_failures", "blackhole_window",
                           "node_trigger"}, where, ConfigError)
    return RecoveryConfig(
        enabled=get_bool(table, "enabled", where, ConfigError, default=True),
        settle_s=parse_duration(table.get("settle", 60), "settle", where, ConfigError),
        blackhole_failures=get_int(table, "blackhole_failures", where, ConfigError, default=3,
                                   lo=1, hi=1000) or 3,
        blackhole_window_s=parse_duration(table.get("blackhole_window", 86400),
                                          "blackhole_window", where, ConfigError),
        node_trigger=get_bool(table, "node_trigger", where, ConfigError, default=True),
    )


def _liveness(table: Mapping[str, Any], path: str) -> LivenessConfig:
    try:
        return load_liveness_config(table)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def trigger_program(cfg: Config) -> str:
    """The program slurmctld's node-down trigger runs (the daemon writes it at start)."""
    return os.path.join(cfg.state_dir, "node-down-trigger")


def writable_paths(cfg: Config) -> list[str]:
    """The folders the daemon writes to, for the systemd unit's ``ReadWritePaths``
    (``b300d --print-paths``; ``deploy/install.sh`` turns them into a drop-in)."""
    paths = [cfg.state_dir, os.path.dirname(cfg.socket), cfg.job_log_dir, *cfg.checkpoints.roots]
    return list(dict.fromkeys(os.path.normpath(p) for p in paths if p))


def config_path(explicit: str | None) -> str:
    """The config file to read: ``--config``, else ``$B300_CONFIG``, else the default."""
    return explicit or os.environ.get("B300_CONFIG") or DEFAULT_CONFIG


def load_config(path: str) -> Config:
    """Read and validate the config file; every problem is one ConfigError line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    reject_unknown(doc, {"daemon", "slurm", "drift", "recovery", "liveness", "checkpoints", "report",
                         "metrics", "alerts"}, path, ConfigError)
    d = get_table(doc, "daemon", path, ConfigError)
    dw = f"{path}: [daemon]"
    reject_unknown(d, {"state_dir", "database_url", "socket", "job_log_dir", "lease_name", "lease_ttl",
                       "poll_interval", "submit_grace", "max_backoff", "log_format", "log_level",
                       "admin_group"}, dw, ConfigError)
    state_dir = get_str(d, "state_dir", dw, ConfigError, default="/var/lib/b300", pattern=_ABS,
                        what="an absolute path")
    assert state_dir is not None
    db = get_str(d, "database_url", dw, ConfigError, default="") or f"sqlite:///{state_dir}/state.db"
    if not re.match(r"(sqlite|postgresql)(\+\w+)?://", db):
        raise ConfigError(f"{dw}: database_url must be a sqlite:/// or postgresql:// URL")
    sock = get_str(d, "socket", dw, ConfigError, default="", pattern=re.compile(r"|/[^\x00\n]{0,100}"),
                   what="an absolute path of at most 100 characters") or f"{state_dir}/b300d.sock"
    job_log_dir = get_str(d, "job_log_dir", dw, ConfigError, default="", pattern=re.compile(
        f"|{_ABS.pattern}"), what="an absolute path") or f"{state_dir}/job-logs"
    log_format = get_str(d, "log_format", dw, ConfigError, default="auto") or "auto"
    if log_format not in ("auto", "json", "console"):
        raise ConfigError(f"{dw}: log_format must be auto, json or console, got {log_format!r}")
    level = get_str(d, "log_level", dw, ConfigError, default="info") or "info"
    if level not in _LEVELS:
        raise ConfigError(f"{dw}: log_level must be one of {', '.join(_LEVELS)}, got {level!r}")
    s = get_table(doc, "slurm", path, ConfigError)
    sw = f"{path}: [slurm]"
    reject_unknown(s, {"backend", "conf", "bin_dir", "command_timeout", "accounting_grace"}, sw,
                   ConfigError)
    backend = get_str(s, "backend", sw, ConfigError, default="cli") or "cli"
    if backend not in ("auto", "cli", "pyslurm"):
        raise ConfigError(f"{sw}: backend must be auto, cli or pyslurm, got {backend!r}")
    poll = parse_duration(d.get("poll_interval", 15), "poll_interval", dw, ConfigError)
    if poll < 0.2 or poll > 3600:
        raise ConfigError(f"{dw}: poll_interval must be between 0.2 s and 1 h, got {poll:g} s")
    lease_ttl = parse_duration(d.get("lease_ttl", 15), "lease_ttl", dw, ConfigError)
    if lease_ttl < 2 or lease_ttl > 600:
        raise ConfigError(f"{dw}: lease_ttl must be between 2 s and 10 min, got {lease_ttl:g} s")
    report = parse_report_config(get_table(doc, "report", path, ConfigError), f"{path}: [report]")
    alerts = parse_alerts_config(get_table(doc, "alerts", path, ConfigError), f"{path}: [alerts]")
    if alerts.mail_to and report.smtp is None:
        raise ConfigError(f"{path}: [alerts] mail_to needs the SMTP settings of [report] (smtp_host)")
    return Config(
        path=path,
        state_dir=state_dir,
        database_url=db,
        socket=sock,
        job_log_dir=job_log_dir,
        lease_name=get_str(d, "lease_name", dw, ConfigError, default="default",
                           pattern=_GROUP, what="a name") or "default",
        lease_ttl_s=lease_ttl,
        poll_interval_s=poll,
        submit_grace_s=parse_duration(d.get("submit_grace", 60), "submit_grace", dw, ConfigError),
        max_backoff_s=parse_duration(d.get("max_backoff", 300), "max_backoff", dw, ConfigError),
        log_format=log_format,
        log_level=level,
        admin_group=get_str(d, "admin_group", dw, ConfigError, default="", pattern=re.compile(
            f"|{_GROUP.pattern}"), what="a group name") or "",
        slurm_backend=backend,
        slurm_conf=get_str(s, "conf", sw, ConfigError, default="", pattern=re.compile(
            f"|{_ABS.pattern}"), what="an absolute path") or None,
        slurm_bin_dir=get_str(s, "bin_dir", sw, ConfigError, default="", pattern=re.compile(
            f"|{_ABS.pattern}"), what="an absolute path") or None,
        slurm_timeout_s=parse_duration(s.get("command_timeout", 30), "command_timeout", sw,
                                       ConfigError),
        accounting_grace_s=parse_duration(s.get("accounting_grace", 60), "accounting_grace", sw,
                                          ConfigError),
        recovery=_recovery(get_table(doc, "recovery", path, ConfigError), f"{path}: [recovery]"),
        liveness=_liveness(get_table(doc, "liveness", path, ConfigError), path),
        checkpoints=parse_checkpoints_config(get_table(doc, "checkpoints", path, ConfigError),
                                             f"{path}: [checkpoints]"),
        drift=parse_drift_config(get_table(doc, "drift", path, ConfigError), path) if "drift" in doc else None,
        report=report,
        metrics=parse_metrics_config(get_table(doc, "metrics", path, ConfigError), f"{path}: [metrics]"),
        alerts=alerts,
    )
