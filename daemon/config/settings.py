"""The daemon's configuration as the rest of the code reads it: frozen records.

:func:`b300.config.load_config` builds a :class:`Config` from the file; the file's
grammar (its pydantic table models) lives in :mod:`b300.config.tables` and is
not needed to use these records, so importing them stays cheap.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..checkpoints.policy import CheckpointsConfig
from ..drift.scan_records import DriftConfig
from ..drill.crash_config import DrillConfig
from .ops import AlertsConfig, MetricsConfig, ReportConfig

if TYPE_CHECKING:
    from ..liveness.timing import LivenessConfig
    from ..spares.pool_config import SparesConfig
    from ..training.thresholds import TrainingConfig
    from ..triage.checks import TriageConfig


@dataclass(frozen=True, slots=True)
class RecoveryConfig:
    """[recovery]: how failed attempts are handled (see b300.recovery)."""

    enabled: bool = True
    settle_s: float = 60.0            # wait this long for Slurm to name a failed node
    blackhole_failures: int = 3       # drain a node that failed this many different runs...
    blackhole_window_s: float = 86400.0  # ...within this window
    node_trigger: bool = True         # strigger on node down wakes the daemon at once


def _liveness_defaults() -> LivenessConfig:
    # [liveness]'s record is itself a pydantic model (b300.liveness.timing); it is imported
    # when first needed so that importing these records does not load pydantic.
    from ..liveness.timing import LivenessConfig

    return LivenessConfig()


def _training_defaults() -> TrainingConfig:
    # [training] is a pydantic model too (b300.training.thresholds), imported when first needed.
    from ..training.thresholds import TrainingConfig

    return TrainingConfig()


def _spares_defaults() -> SparesConfig:
    # [spares] is a pydantic model too (b300.spares.pool_config), imported when first needed.
    from ..spares.pool_config import SparesConfig

    return SparesConfig()


def _triage_defaults() -> TriageConfig:
    # [triage] is a pydantic model too (b300.triage.checks), imported when first needed.
    from ..triage.checks import TriageConfig

    return TriageConfig()


@dataclass(frozen=True, slots=True)
class Config:
    """The whole file: ``[daemon]`` and ``[slurm]`` flattened, one record per other section."""

    path: str
    state_dir: str
    database_url: str
    socket: str
    mode: str = "observe"  # [daemon] mode: "observe" (never acts of its own accord) or "act"
    mode_set: bool = False  # whether the file says so (a default observe is said at start-up)
    database_password_file: str = ""  # the PostgreSQL password, read when the store is opened
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
    drift: DriftConfig | None = None  # [drift]: see b300.drift
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    liveness: LivenessConfig = field(default_factory=_liveness_defaults)  # [liveness]: b300.liveness
    training: TrainingConfig = field(default_factory=_training_defaults)  # [training]: b300.training
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)
    report: ReportConfig = field(default_factory=ReportConfig)  # [report]: see b300.config.ops
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    drill: DrillConfig = field(default_factory=DrillConfig)  # [drill]: b300ctl drill
    spares: SparesConfig = field(default_factory=_spares_defaults)  # [spares]: b300.spares
    triage: TriageConfig = field(default_factory=_triage_defaults)  # [triage]: b300.triage


def trigger_program(cfg: Config) -> str:
    """The program slurmctld's node-down trigger runs (the daemon writes it at start)."""
    return os.path.join(cfg.state_dir, "node-down-trigger")


def writable_paths(cfg: Config) -> list[str]:
    """The folders the daemon writes to, for the systemd unit's ``ReadWritePaths``
    (``b300d --print-paths``; ``deploy/install.sh`` turns them into a drop-in)."""
    paths = [cfg.state_dir, os.path.dirname(cfg.socket), cfg.job_log_dir, *cfg.checkpoints.roots]
    return list(dict.fromkeys(os.path.normpath(p) for p in paths if p))
