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
    prune_remote = false          # prune replicas on the targets by the same rules (default: as prune)
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

These are the records; the table's grammar is :mod:`b300.config.tables.checkpoints`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..errors import ConfigError
from ..safety.permissions import check_secret_file
from .retention import RetentionPolicy

#: Plugin options that are secrets: refused inline, read from ``<name>_file``.
SECRET_OPTIONS = frozenset({"aws_secret_access_key", "password", "passphrase"})


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
    #: None: as ``prune`` (nothing is deleted anywhere unless the config asks for it).
    prune_remote: bool | None = None
    retention: RetentionPolicy = field(default_factory=lambda: RetentionPolicy(
        keep_last=3, hourly_for=timedelta(hours=24), daily_for=timedelta(days=7)))
    replication_concurrency: int = 4
    bandwidth_limit: float | None = None  # bytes per second
    replicas_per_pass: int = 4
    targets: tuple[TargetConfig, ...] = ()
    #: Folders that hold the runs' checkpoint folders. deploy/install.sh makes them the unit's
    #: ReadWritePaths; when set, a spec whose checkpoint folder is outside them is refused.
    roots: tuple[str, ...] = ()

    @property
    def prunes_remote(self) -> bool:
        """Whether replicas on the targets are pruned: ``prune_remote``, else as ``prune``."""
        return self.prune if self.prune_remote is None else self.prune_remote
