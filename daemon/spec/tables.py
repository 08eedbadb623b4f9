"""A job spec's grammar: one pydantic model per TOML table (strict, unknown keys refused,
frozen; see :mod:`b300.grammar.types`). Imported by :func:`b300.spec.parse_spec` when it
first runs, so code that only reads a :class:`~b300.spec.jobspec.JobSpec` does not pay for
building the models."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from ..grammar.duration import short_repr
from ..grammar.types import NAME, AbsPath, Duration, Table, Text, expected, matches, one_of, problem
from ..training.thresholds import SignalOverrides
from .jobspec import CHECKPOINT_SIGNALS, LAYOUTS, ON_NO_SPARE, RESERVED_ENV_PREFIXES, SIGNAL_TARGETS

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED.
_TIME_LIMIT = r"\d{1,6}|\d{1,6}:\d{1,2}(:\d{1,2})?|\d{1,4}-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED"


def _env_key(key: str) -> str:
    if not _ENV_KEY.fullmatch(key):
        raise expected("a valid variable name")
    if key.startswith(RESERVED_ENV_PREFIXES):
        raise problem(f"uses a reserved prefix ({', '.join(RESERVED_ENV_PREFIXES)})")
    return key


def _signal(value: str) -> str:
    """``USR1``, ``SIGUSR1`` and ``usr1`` are all ``USR1``."""
    signal = value.upper().removeprefix("SIG")
    if signal not in CHECKPOINT_SIGNALS:
        raise problem(f"must be one the job can trap: {', '.join(CHECKPOINT_SIGNALS)} "
                      f"(got {short_repr(value, 20)})")
    return signal


TimeLimit = Annotated[str, matches(_TIME_LIMIT, "a Slurm time limit like '04:00:00' or '2-00:00:00'")]


def _not_blank(command: str) -> str:
    if not command.strip():
        raise problem("is empty")
    return command


def _slurm_name(what: str) -> AfterValidator:
    return matches(NAME, f"a Slurm {what} name")


class JobTable(Table):
    command: Annotated[Text, AfterValidator(_not_blank)] | None = None
    script: Text | None = None  # a file, read and inlined as the command when the spec is loaded
    nodes: Annotated[int, Field(ge=1, le=100_000)]
    gpus_per_node: Annotated[int, Field(ge=0, le=64)] = 8
    ntasks_per_node: Annotated[int, Field(ge=1, le=1024)] | None = None
    partition: Annotated[str, _slurm_name("partition")] | None = None
    account: Annotated[str, _slurm_name("account")] | None = None
    qos: Annotated[str, _slurm_name("QOS")] | None = None
    time_limit: TimeLimit | None = None
    workdir: AbsPath | None = None
    output: AbsPath | None = None
    requeue: bool = False
    spare_nodes: Annotated[int, Field(ge=0, le=1024)] = 0
    environment: dict[Annotated[str, AfterValidator(_env_key)], Text] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _command_or_script(self) -> JobTable:
        if (self.command is None) == (self.script is None):
            raise problem("give exactly one of command or script")
        return self


class CheckpointTable(Table):
    dir: AbsPath | None = None
    layout: Annotated[str, one_of(*LAYOUTS)] = "generic"
    interval: Duration = 3600.0
    signal: Annotated[str, AfterValidator(_signal)] | None = None  # opt-in: see CheckpointPolicy
    signal_to: Annotated[str, one_of(*SIGNAL_TARGETS)] = "batch"

    @model_validator(mode="after")
    def _signal_needs(self) -> CheckpointTable:
        if "signal_to" in self.model_fields_set and self.signal is None:
            raise problem("signal_to needs signal (the signal the job checkpoints on)")
        if self.signal is not None and self.dir is None:
            raise problem("signal needs dir (the daemon signals only when the checkpoints there are late)")
        return self


class RetriesTable(Table):
    infra: Annotated[int, Field(ge=0, le=1000)] = 3
    preemption: Annotated[int, Field(ge=0, le=10000)] = 10
    retryable_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(default_factory=list)


class HealthTable(Table):
    progress_file: AbsPath | None = None
    hang_timeout: Duration = 1800.0
    startup_timeout: Duration = 3600.0
    # Training health (b300.training.thresholds.TrainingSpec; docs/design/progress.md).
    megatron_log: bool = False
    model_params: Annotated[int, Field(ge=1, le=10**15)] | None = None
    tokens_per_sample: Annotated[int, Field(ge=1, le=10**9)] | None = None
    no_restart_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(default_factory=list)
    signals: SignalOverrides | None = None


class ElasticTable(Table):
    min_nodes: Annotated[int, Field(ge=1, le=100_000)]
    max_nodes: Annotated[int, Field(ge=1, le=100_000)]
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    port: Annotated[int, Field(ge=1024, le=65535)] = 29400
    nproc_per_node: Annotated[int, Field(ge=1, le=64)] = 1
    on_no_spare: Annotated[str, one_of(*ON_NO_SPARE)] = "shrink"

    @model_validator(mode="after")
    def _range(self) -> ElasticTable:
        if self.min_nodes > self.max_nodes:
            raise problem(f"min_nodes ({self.min_nodes}) is more than max_nodes ({self.max_nodes})")
        return self


class SpecFile(Table):
    name: Annotated[str, matches(NAME, "a valid name (letters, digits, '.', '_', '-'; at most 64)")]
    job: JobTable
    checkpoint: CheckpointTable = Field(default_factory=CheckpointTable)
    retries: RetriesTable = Field(default_factory=RetriesTable)
    health: HealthTable = Field(default_factory=HealthTable)
    elastic: ElasticTable | None = None

    @model_validator(mode="after")
    def _no_restart_not_retryable(self) -> SpecFile:
        both = sorted(set(self.health.no_restart_exit_codes) & set(self.retries.retryable_exit_codes))
        if both:
            raise problem(f"exit code {both[0]} is in both [retries] retryable_exit_codes and "
                          "[health] no_restart_exit_codes")
        return self
