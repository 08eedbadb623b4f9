"""Thresholds of the training-health detectors, as pydantic v2 models (strict, frozen).

Two places set them (keys documented in ``docs/design/progress.md``):

- the daemon-wide ``[training]`` table of the config file: :class:`TrainingConfig`;
- keys added to a spec's ``[health]`` table: :class:`TrainingSpec` (Megatron log,
  model size for MFU, "do not restart" exit codes) with optional
  ``[health.signals.<detector>]`` tables overriding single daemon-wide thresholds for
  that run (:meth:`TrainingConfig.for_run` merges them).

Strict: ``window = true`` or ``window = "200"`` is an error, not 1 or 200; unknown keys
are errors. :func:`load_training_config` and :func:`load_training_spec` turn the first
validation error into one line naming the key, as the rest of the config does.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    field_validator,
    model_validator,
)

from ..errors import ConfigError, SpecError
from ..grammar.duration import DurationError, duration_seconds
from ..grammar.types import validate

_MODEL = ConfigDict(strict=True, extra="forbid", frozen=True)


def _seconds(value: Any) -> Any:
    """``90``, ``"90s"``, ``"15m"``, ``"1.5h"``, ``"2d"`` -> seconds (the project's one grammar,
    :mod:`b300.grammar.duration`)."""
    try:
        return duration_seconds(value)
    except DurationError:
        raise ValueError("must be a duration like 90, '90s', '15m', '1.5h' or '2d'") from None


Seconds = Annotated[float, BeforeValidator(_seconds)]
# TOML gives lists; strict mode takes only tuples, so the container is lax, its items strict.
_ExitCodes = Annotated[tuple[Annotated[StrictInt, Field(ge=1, le=255)], ...], Field(strict=False)]
_Outcomes = Annotated[tuple[str, ...], Field(strict=False)]


class LossSpikeThresholds(BaseModel):
    """A loss above ``median + mad_k * 1.4826 * MAD`` of the last ``window`` losses, and at
    least ``min_rise`` (a fraction) above that median, is a spike; judged once the window
    holds ``min_points``. ``nan``: a NaN or infinite loss is a finding."""

    model_config = _MODEL
    #: Losses the median and MAD are taken over.
    window: int = Field(default=200, ge=10, le=100_000)
    #: Losses needed before a spike is judged.
    min_points: int = Field(default=50, ge=5, le=100_000)
    #: Robust sigmas (1.4826 * MAD) above the median that make a spike.
    mad_k: float = Field(default=8.0, gt=0, le=1000)
    #: A spike is also at least this fraction above the median.
    min_rise: float = Field(default=0.10, ge=0, le=100)
    #: A NaN or infinite loss is a finding.
    nan: bool = True

    @model_validator(mode="after")
    def _points_fit(self) -> LossSpikeThresholds:
        if self.min_points > self.window:
            raise ValueError(f"min_points ({self.min_points}) must not exceed window ({self.window})")
        return self


class ThroughputThresholds(BaseModel):
    """Throughput over the last ``sustain`` below ``below`` times the median over the
    ``baseline`` before it (needing ``min_baseline`` of data) is a drop. A job that stops
    reporting counts as zero only after ``stall_factor`` times its usual reporting gap."""

    model_config = _MODEL
    #: A drop: throughput below this fraction of the baseline's median.
    below: float = Field(default=0.7, gt=0, lt=1)
    #: For this long.
    sustain: Seconds = Field(default=600.0, gt=0)
    #: The span before it whose median is the baseline.
    baseline: Seconds = Field(default=3600.0, gt=0)
    #: Data needed in the baseline before a drop is judged.
    min_baseline: Seconds = Field(default=600.0, gt=0)
    #: A job that stops reporting counts as zero after this many times its usual reporting gap.
    stall_factor: float = Field(default=3.0, ge=1, le=100)

    @model_validator(mode="after")
    def _baseline_fits(self) -> ThroughputThresholds:
        if self.min_baseline > self.baseline:
            raise ValueError("min_baseline must not exceed baseline")
        return self


class StragglerThresholds(BaseModel):
    """A host whose step time is at least ``ratio`` times the median of the other hosts' and
    ``min_excess`` seconds above it (and, with 3 or more other hosts, ``mad_k`` robust
    sigmas above it) for ``steps``
    consecutive steps is a straggler. Steps with fewer than ``min_hosts`` hosts reporting
    are not judged; at most ``max_pending_steps`` steps wait for slow reporters."""

    model_config = _MODEL
    #: A straggler's step time is at least this many times the other hosts' median.
    ratio: float = Field(default=1.3, gt=1, le=100)
    #: And at least this many seconds above it.
    min_excess: float = Field(default=0.05, ge=0, le=3600)  # seconds
    #: With 3 or more other hosts, also this many robust sigmas above it.
    mad_k: float = Field(default=3.5, gt=0, le=1000)
    #: For this many consecutive steps.
    steps: int = Field(default=10, ge=1, le=100_000)
    #: Steps with fewer hosts reporting are not judged.
    min_hosts: int = Field(default=2, ge=2, le=100_000)
    #: At most this many steps wait for slow reporters.
    max_pending_steps: int = Field(default=64, ge=1, le=10_000)


class CheckpointStallThresholds(BaseModel):
    """A ``ckpt_begin`` without its ``ckpt_end`` is stalled after ``timeout``; once three
    saves of the attempt were timed, after ``factor`` times their median instead (but
    never less than ``min_timeout``), so the limit follows the checkpoint's real size."""

    model_config = _MODEL
    #: A save begun and not ended after this is stalled (until three saves were timed).
    timeout: Seconds = Field(default=1800.0, gt=0)
    #: Then: this many times the median save time.
    factor: float = Field(default=5.0, gt=1, le=1000)
    #: But never less than this.
    min_timeout: Seconds = Field(default=300.0, gt=0)
    #: Saves whose duration the median is taken over.
    history: int = Field(default=20, ge=3, le=1000)


class RestartLoopThresholds(BaseModel):
    """Stop a run after ``attempts`` ended attempts in a row that did not advance its newest
    checkpoint step. Attempts that ended with an outcome in ``ignore_outcomes`` (a
    preemption is not the run's fault) neither count nor break the row."""

    model_config = _MODEL
    #: Stop a run after this many ended attempts in a row without a newer checkpoint.
    attempts: int = Field(default=3, ge=1, le=1000)
    #: Outcomes that neither count nor break the row.
    ignore_outcomes: _Outcomes = ("PREEMPTED",)


#: Dense BF16 tensor-core peak of one B300 (HGX B300, SXM), 2.25 PFLOP/s: the HGX B300
#: figures list 4.5 PFLOP/s for FP16/BF16 with 2:4 sparsity, and dense is half of that
#: (per-GPU tables at glennklockwood.com/garden/processors/B300 and verda.com's GB300
#: NVL72 article, read 2026). Two significant figures, and sources disagree (GB300:
#: 2.5; one article: ~3.5): a documented default, not a fact; configure your parts'.
B300_DENSE_BF16_FLOPS = 2.25e15


class PeakFlops(BaseModel):
    """The peak FLOP/s of one GPU that MFU divides by, and what it is (shown with MFU)."""

    model_config = _MODEL
    #: Peak FLOP/s of one GPU, for MFU (default: B300 dense BF16); set your parts' and number
    #: format.
    per_gpu: float = Field(default=B300_DENSE_BF16_FLOPS, gt=0, le=1e18)
    #: What per_gpu is, shown beside MFU.
    label: str = Field(default="B300 dense BF16, 2.25 PFLOP/s (half the 4.5 PFLOP/s sparse figure)",
                       min_length=1, max_length=200)


class SignalOverrides(BaseModel):
    """``[health.signals.*]`` of a spec: the thresholds this run sets itself (only the keys
    given replace the daemon's)."""

    model_config = _MODEL
    loss: LossSpikeThresholds | None = None
    throughput: ThroughputThresholds | None = None
    straggler: StragglerThresholds | None = None
    checkpoint_stall: CheckpointStallThresholds | None = None
    restart_loop: RestartLoopThresholds | None = None


class TrainingSpec(BaseModel):
    """The keys issue 17 adds to a spec's ``[health]`` table.

    ``megatron_log``: read Megatron-LM's iteration lines from the job's output;
    ``model_params``: N of the model, for MFU; ``tokens_per_sample``: the sequence
    length, turning samples into tokens where a job counts only samples (Megatron);
    ``no_restart_exit_codes``: exit codes after which the run is not resubmitted."""

    model_config = _MODEL
    megatron_log: bool = False
    model_params: int | None = Field(default=None, gt=0, le=10**15)
    tokens_per_sample: int | None = Field(default=None, gt=0, le=10**9)
    no_restart_exit_codes: _ExitCodes = ()
    signals: SignalOverrides = SignalOverrides()

    @field_validator("no_restart_exit_codes")
    @classmethod
    def _sorted_codes(cls, codes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(set(codes)))

    def conflicts_with_retryable(self, retryable: tuple[int, ...]) -> str | None:
        """A one-line complaint if an exit code is both "retry" and "do not restart"."""
        both = sorted(set(self.no_restart_exit_codes) & set(retryable))
        if both:
            return (f"exit code {both[0]} is in both retryable_exit_codes and "
                    f"no_restart_exit_codes")
        return None


class RunThresholds(BaseModel):
    """The thresholds in force for one run: the daemon's, with the spec's overrides."""

    model_config = _MODEL
    loss: LossSpikeThresholds
    throughput: ThroughputThresholds
    straggler: StragglerThresholds
    checkpoint_stall: CheckpointStallThresholds
    restart_loop: RestartLoopThresholds


class TrainingConfig(BaseModel):
    """The daemon's ``[training]`` table.

    ``rate_window``: the span tokens/s and MFU are measured over for metrics;
    ``backfill_bytes``: how much of a progress file a restarted daemon re-reads;
    ``max_read_bytes``: the most read from one file per cycle; ``megatron_tz``: the IANA
    zone of the nodes' clocks for Megatron's timestamps (default: the daemon's).

    ``straggler_action``: what a confirmed straggler leads to: ``"alert"`` (the default:
    an event and an alert, nothing else) or ``"drain"`` (also drain the node in Slurm, so
    no new job lands on it; the run keeps going and its next attempt runs without it),
    at most one straggler drain per run per ``straggler_drain_every``, and never one that
    would leave the run's partition too few usable nodes for it. Daemon-wide on purpose:
    a spec cannot ask for drains."""

    model_config = _MODEL
    #: Read the jobs' progress files and run the training-health detectors.
    enabled: bool = True
    loss: LossSpikeThresholds = LossSpikeThresholds()
    throughput: ThroughputThresholds = ThroughputThresholds()
    straggler: StragglerThresholds = StragglerThresholds()
    checkpoint_stall: CheckpointStallThresholds = CheckpointStallThresholds()
    restart_loop: RestartLoopThresholds = RestartLoopThresholds()
    peak: PeakFlops = PeakFlops()
    #: Tokens/s and MFU in /metrics are measured over this span.
    rate_window: Seconds = Field(default=300.0, gt=0)
    #: How much of a progress file a restarted daemon re-reads.
    backfill_bytes: int = Field(default=1 << 20, ge=0, le=1 << 30)
    #: The most read from one progress file per cycle.
    max_read_bytes: int = Field(default=1 << 20, ge=1 << 12, le=1 << 30)
    #: IANA zone of the nodes' clocks for Megatron's timestamps (default: the daemon's).
    megatron_tz: str | None = Field(default=None, min_length=1, max_length=64)
    #: alert: an event and an alert; drain: also drain the straggler's node (the run keeps going).
    straggler_action: Literal["alert", "drain"] = "alert"
    #: At most one straggler drain per run in this span.
    straggler_drain_every: Seconds = Field(default=86400.0, gt=0)

    @field_validator("megatron_tz")
    @classmethod
    def _known_zone(cls, name: str | None) -> str | None:
        if name is not None:
            try:
                zoneinfo.ZoneInfo(name)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"unknown time zone {name[:64]!r}") from None
        return name

    def for_run(self, spec: TrainingSpec) -> RunThresholds:
        """The daemon's thresholds with the keys ``spec.signals`` sets replaced (checked again
        together, so an override cannot break a rule between two keys)."""
        merged: dict[str, BaseModel] = {}
        for name in RunThresholds.model_fields:
            base: BaseModel = getattr(self, name)
            override: BaseModel | None = getattr(spec.signals, name)
            if override is not None:
                changed = override.model_dump(include=override.model_fields_set)
                base = type(base).model_validate({**base.model_dump(), **changed})
            merged[name] = base
        return RunThresholds.model_validate(merged)


def load_training_config(table: Mapping[str, Any], where: str = "config") -> TrainingConfig:
    """Validate the ``[training]`` table; ConfigError with one line naming the key
    (:func:`b300.grammar.types.validate`, the one error line of every config table)."""
    return validate(TrainingConfig, dict(table), where, ConfigError, prefix=("training",))


def load_training_spec(health: Mapping[str, Any], where: str = "spec") -> TrainingSpec:
    """Validate the issue-17 keys of a spec's ``[health]`` table (the others are left to the
    spec loader: ``progress_file``, ``hang_timeout``, ``startup_timeout``)."""
    mine = {k: v for k, v in health.items() if k in TrainingSpec.model_fields}
    return validate(TrainingSpec, mine, where, SpecError, prefix=("health",))
