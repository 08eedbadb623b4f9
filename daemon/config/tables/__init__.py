"""The config file's grammar: one pydantic model per TOML table, and the whole file.

Every table is a :class:`~b300.grammar.types.Table` (strict, unknown keys refused,
frozen); :func:`config_from_toml` validates a parsed file and converts it to the
:class:`~b300.config.settings.Config` the daemon reads. Imported by
:func:`b300.config.load_config` when it first runs, not with :mod:`b300.config`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from ...errors import ConfigError
from ...grammar.types import Table, problem, validate
from ...liveness.timing import LivenessConfig
from ...spares.pool_config import SparesConfig
from ...training.thresholds import TrainingConfig
from ...triage.checks import TriageConfig
from ..settings import Config, RecoveryConfig
from .checkpoints import CheckpointsTable, checkpoints_config
from .daemon import DaemonTable, RecoveryTable, SlurmTable
from .drift import DriftTable, drift_config
from .drill import DrillTable, drill_config
from .ops import AlertsTable, MetricsTable, ReportTable, alerts_config, metrics_config, report_config


class ConfigFile(Table):
    daemon: DaemonTable = Field(default_factory=DaemonTable)
    slurm: SlurmTable = Field(default_factory=SlurmTable)
    recovery: RecoveryTable = Field(default_factory=RecoveryTable)
    liveness: LivenessConfig = Field(default_factory=LivenessConfig)  # strict, frozen: its own record
    training: TrainingConfig = Field(default_factory=TrainingConfig)  # strict, frozen: its own record
    checkpoints: CheckpointsTable = Field(default_factory=CheckpointsTable)
    drift: DriftTable | None = None  # leave out: no drift scans
    report: ReportTable = Field(default_factory=ReportTable)
    metrics: MetricsTable = Field(default_factory=MetricsTable)
    alerts: AlertsTable = Field(default_factory=AlertsTable)
    drill: DrillTable = Field(default_factory=DrillTable)  # b300ctl drill
    spares: SparesConfig = Field(default_factory=SparesConfig)  # the daemon-held spare pools
    triage: TriageConfig = Field(default_factory=TriageConfig)  # drained nodes checked, returned

    @model_validator(mode="after")
    def _alert_mail_has_smtp(self) -> ConfigFile:
        if self.alerts.mail_to and not self.report.smtp_host:
            raise problem("[alerts] mail_to needs the SMTP settings of [report] (smtp_host)")
        return self


def config_from_toml(doc: dict[str, Any], path: str) -> Config:
    """The :class:`Config` of a parsed TOML file; ConfigError (one line) if it is not one."""
    f = validate(ConfigFile, doc, path, ConfigError)
    d, s, r = f.daemon, f.slurm, f.recovery
    return Config(
        path=path,
        state_dir=d.state_dir,
        database_url=d.database_url or f"sqlite:///{d.state_dir}/state.db",
        socket=d.socket or f"{d.state_dir}/b300d.sock",
        mode=d.mode,
        mode_set="mode" in d.model_fields_set,
        database_password_file=d.database_password_file,
        job_log_dir=d.job_log_dir or f"{d.state_dir}/job-logs",
        poll_interval_s=d.poll_interval,
        submit_grace_s=d.submit_grace,
        max_backoff_s=d.max_backoff,
        log_format=d.log_format,
        log_level=d.log_level,
        admin_group=d.admin_group,
        slurm_backend=s.backend,
        slurm_conf=s.conf or None,
        slurm_bin_dir=s.bin_dir or None,
        slurm_timeout_s=s.command_timeout,
        accounting_grace_s=s.accounting_grace,
        lease_name=d.lease_name,
        lease_ttl_s=d.lease_ttl,
        drift=None if f.drift is None else drift_config(f.drift),
        recovery=RecoveryConfig(enabled=r.enabled, settle_s=r.settle, blackhole_failures=r.blackhole_failures,
                                blackhole_window_s=r.blackhole_window, node_trigger=r.node_trigger),
        liveness=f.liveness,
        training=f.training,
        checkpoints=checkpoints_config(f.checkpoints),
        report=report_config(f.report),
        metrics=metrics_config(f.metrics),
        alerts=alerts_config(f.alerts),
        drill=drill_config(f.drill),
        spares=f.spares,
        triage=f.triage,
    )
