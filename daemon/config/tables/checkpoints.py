"""The ``[checkpoints]`` table and its ``[[checkpoints.targets]]`` (records and the whole
example: :mod:`b300.checkpoints.policy`)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, PlainValidator, model_validator

from ...checkpoints.policy import SECRET_OPTIONS, CheckpointsConfig, TargetConfig
from ...checkpoints.retention import RetentionPolicy
from ...errors import ConfigError
from ...grammar.duration import short_repr
from ...grammar.types import NAME, Duration, PluginName, Span, Table, expected, matches, problem, validate

_OPTION = re.compile(r"[a-z][a-z0-9_]{0,63}")
_ABS = re.compile(r"/[^\x00\n]*")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?)?[bB]?(?:/s)?\s*")
_UNITS = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}
#: A checkpoint root goes into the systemd unit's ReadWritePaths (space-separated, unquoted).
_ROOT = re.compile(r"/[A-Za-z0-9._/@+:=,-]{0,4000}")


def size_rate(value: object) -> float | None:
    """Bytes per second from ``"200MB"``, ``"1.5GiB/s"`` or a number; ``""`` or 0 = unlimited."""
    if isinstance(value, bool):  # before the 0 test: False == 0 in Python
        raise problem(f"must be a rate like '200MB' (per second), got {value!r}")
    if value in ("", 0):
        return None
    if isinstance(value, int | float):
        rate = float(value)
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)):
        rate = float(m.group(1)) * _UNITS[m.group(2).lower() if m.group(2) else None]
    else:
        raise problem(f"must be a rate like '200MB' (per second), got {short_repr(value, 40)}")
    if not rate >= 1024:  # NaN too
        raise problem(f"must be at least 1 KiB per second, got {value!r}")
    return rate


def _option(value: object) -> str | int | float | bool:
    if isinstance(value, str):
        if "\x00" in value:
            raise problem("contains a NUL byte")
        return value
    if isinstance(value, int | float | bool):
        return value
    raise expected("a string, number or boolean")


def _root(value: str) -> str:
    if not _ROOT.fullmatch(value) or "/../" in f"{value}/" or value.rstrip("/") == "":
        raise problem(f"must be an absolute path of letters, digits and ._/@+:=,- (it goes into the "
                      f"systemd unit), got {short_repr(value, 80)}")
    return value


def _array_of_tables(value: object) -> object:
    if not isinstance(value, list):
        raise problem(f"must be an array of tables ([[checkpoints.targets]]), got {short_repr(value)}")
    return value


def _secret(option: str) -> str | None:
    """The secret an option ``X_file`` holds the file of, if X is one."""
    name = option.removesuffix("_file")
    return name if name != option and name in SECRET_OPTIONS else None


class TargetTable(Table, extra="allow"):
    """One ``[[checkpoints.targets]]``: ``name``, ``kind``, and the plugin's own options."""

    __pydantic_extra__: dict[str, Annotated[str | int | float | bool, PlainValidator(_option)]] = Field(
        init=False)
    name: Annotated[str, matches(NAME, "a name of letters, digits, _ . -")] = Field(
        description="shown in b300ctl checkpoints; unique")
    kind: PluginName = Field(description="a b300.replication_targets plugin: filesystem, sftp or s3")

    @model_validator(mode="before")
    @classmethod
    def _option_names(cls, data: Any) -> Any:
        for key in data if isinstance(data, dict) else ():
            if key in ("name", "kind"):
                continue
            if not _OPTION.fullmatch(key):
                raise problem(f"option {key[:40]!r} is not a valid option name")
            if key in SECRET_OPTIONS:
                raise problem(f"{key} must not be written in the config; "
                              f"put it in a file readable by the daemon only and set {key}_file")
        return data

    @model_validator(mode="after")
    def _secret_files_and_run(self) -> TargetTable:
        for key, value in self.options():
            if _secret(key) and not (isinstance(value, str) and _ABS.fullmatch(value)):
                raise problem(f"{key} must be an absolute path, got {short_repr(value)}")
        if not any(isinstance(v, str) and "{run}" in v for k, v in self.options() if not _secret(k)):
            raise problem(f"({self.name}): one option (path or prefix) must contain {{run}}, "
                          "so that runs do not overwrite each other's replicas")
        return self

    def options(self) -> list[tuple[str, str | int | float | bool]]:
        return list((self.__pydantic_extra__ or {}).items())


class CheckpointsTable(Table):
    #: How often checkpoint folders are listed, manifests made and each run's schedule checked.
    check_interval: Duration = 60.0
    #: false: never signal a job, whatever its spec's [checkpoint] signal says.
    allow_signals: bool = True
    #: Time a signalled job has to write a checkpoint before the alert; a job that ends within it
    #: died of the signal (SIGNALLED).
    signal_grace: Duration = 300.0
    #: Checksum manifests made per check pass (0: none).
    manifests_per_pass: Annotated[int, Field(ge=0, le=1000)] = 2
    #: How often checkpoints are copied to the targets and, with prune, pruned.
    maintain_interval: Duration = 600.0
    #: true: delete checkpoints the retention rules do not keep; false: plan only (b300ctl
    #: checkpoints shows the plan).
    prune: bool = False
    #: Prune the copies on the targets by the same rules; not set: the same as prune (so nothing
    #: is deleted anywhere unless the config says so).
    prune_remote: bool | None = None
    #: Newest checkpoints always kept.
    keep_last: Annotated[int, Field(ge=1, le=100000)] = 3
    #: Keep the newest checkpoint of each hour this far back (0: off).
    keep_hourly_for: Span = timedelta(hours=24)
    #: Keep the newest checkpoint of each day this far back (0: off).
    keep_daily_for: Span = timedelta(days=7)
    #: Files in flight per target.
    replication_concurrency: Annotated[int, Field(ge=1, le=64)] = 4
    #: Replication bandwidth per second, all targets and threads together, e.g. "500MB" ("" or 0:
    #: unlimited).
    bandwidth_limit: Annotated[float | None, PlainValidator(size_rate)] = None
    #: Checkpoint copies per pass, newest first.
    replicas_per_pass: Annotated[int, Field(ge=1, le=10000)] = 4
    #: Offsite copies: [[checkpoints.targets]] tables.
    targets: Annotated[list[TargetTable], BeforeValidator(_array_of_tables)] = Field(default_factory=list)
    #: Folders holding the runs' checkpoint folders: the systemd unit may write only there
    #: (install.sh puts them in its drop-in); a spec whose folder is outside them is refused.
    roots: list[Annotated[str, AfterValidator(_root)]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _signal_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "signal" in data:
            raise problem("signal has moved to the job spec: a job that checkpoints on a signal says so "
                          "with [checkpoint] signal = \"USR1\" (signal_to = \"batch\" or \"all\"); "
                          "here only allow_signals = true/false and signal_grace remain")
        return data

    @model_validator(mode="after")
    def _unique_target_names(self) -> CheckpointsTable:
        names = [t.name for t in self.targets]
        if dup := next((n for n in names if names.count(n) > 1), None):
            raise problem(f"two targets are named {dup!r}")
        return self


def checkpoints_config(t: CheckpointsTable) -> CheckpointsConfig:
    targets = tuple(
        TargetConfig(name=x.name, kind=x.kind,
                     options=tuple((k, v) for k, v in x.options() if not _secret(k)),
                     secret_files=tuple((s, str(v)) for k, v in x.options() if (s := _secret(k))))
        for x in t.targets)
    return CheckpointsConfig(
        check_interval_s=t.check_interval, allow_signals=t.allow_signals, signal_grace_s=t.signal_grace,
        manifests_per_pass=t.manifests_per_pass, maintain_interval_s=t.maintain_interval, prune=t.prune,
        prune_remote=t.prune_remote,
        retention=RetentionPolicy(keep_last=t.keep_last, hourly_for=t.keep_hourly_for,
                                  daily_for=t.keep_daily_for),
        replication_concurrency=t.replication_concurrency, bandwidth_limit=t.bandwidth_limit,
        replicas_per_pass=t.replicas_per_pass, targets=targets,
        roots=tuple(dict.fromkeys(r.rstrip("/") for r in t.roots)))


def parse_checkpoints_config(table: object, where: str) -> CheckpointsConfig:
    """A ``[checkpoints]`` table of the file ``where``, validated alone (tests, tools)."""
    return checkpoints_config(validate(CheckpointsTable, table, where, ConfigError, prefix=("checkpoints",)))
