"""All training-health detectors of one attempt, fed together (pure; clock passed in).

The daemon keeps one :class:`TrainingMonitor` per running attempt. Each cycle it
polls the attempt's tailers, passes the records to :meth:`~TrainingMonitor.observe`,
calls :meth:`~TrainingMonitor.evaluate` with the cycle's ``now`` and turns the findings
into events and alerts; :meth:`~TrainingMonitor.snapshot` gives the figures for the
metrics. :meth:`~TrainingMonitor.to_state` is plain JSON, so a restarted daemon either
restores it or rebuilds it by re-reading the files' recent records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .checkpoint_stall import CheckpointStallMonitor
from .findings import Finding
from .loss import LossMonitor
from .mfu import mfu_from_tflops, model_flops_utilization
from .protocol import ExitIntent, ProgressRecord
from .stragglers import StragglerMonitor
from .thresholds import RunThresholds
from .throughput import ThroughputMonitor

#: Records older than the attempt's start by more than this belong to an earlier attempt.
START_SKEW_S = 30.0


@dataclass(frozen=True, slots=True)
class MfuInputs:
    """What MFU needs from the spec and config: N, the attempt's GPUs, the peak per GPU,
    and the sequence length when the job counts samples rather than tokens."""

    params: int | None
    gpus: int
    peak_flops_per_gpu: float
    tokens_per_sample: int | None = None


@dataclass(frozen=True, slots=True)
class TrainingSnapshot:
    """The attempt's figures now, for metrics and ``b300ctl``. Rates are per second over the
    monitor's rate window; None where the job does not report what they need."""

    step: int | None
    last_record_time: float | None
    loss: float | None
    tokens_per_s: float | None
    samples_per_s: float | None
    steps_per_s: float | None
    mfu: float | None
    stragglers: frozenset[str]
    open_checkpoints: int
    exit_intent: ExitIntent | None


class TrainingMonitor:
    """The detectors of one attempt of ``run``. ``attempt_start``: unix seconds the attempt
    started (records from before it, left in an appended file, are skipped)."""

    def __init__(self, run: str, thresholds: RunThresholds, *, attempt_start: float | None = None,
                 mfu: MfuInputs | None = None, rate_window_s: float = 300.0) -> None:
        self.run = run
        self.thresholds = thresholds
        self.attempt_start = attempt_start
        self.mfu_inputs = mfu
        self.rate_window_s = rate_window_s
        self.loss = LossMonitor(run, thresholds.loss)
        self.throughput = ThroughputMonitor(run, thresholds.throughput)
        self.stragglers = StragglerMonitor(run, thresholds.straggler)
        self.checkpoints = CheckpointStallMonitor(run, thresholds.checkpoint_stall)
        self._last: ProgressRecord | None = None
        self._last_loss: float | None = None
        self._tflops: float | None = None
        self._exit_intent: ExitIntent | None = None

    def observe(self, records: Iterable[ProgressRecord]) -> int:
        """Feed records (any order of hosts, time order per file); how many were taken."""
        taken = 0
        for record in records:
            if self.attempt_start is not None and record.time < self.attempt_start - START_SKEW_S:
                continue
            taken += 1
            self.loss.observe(record)
            self.throughput.observe(record)
            self.stragglers.observe(record)
            self.checkpoints.observe(record)
            if record.exit_intent is not None:
                self._exit_intent = record.exit_intent
            if record.loss is not None:
                self._last_loss = record.loss
            if record.tflops_per_gpu is not None:
                self._tflops = record.tflops_per_gpu
            if self._last is None or (record.step, record.time) >= (self._last.step, self._last.time):
                self._last = record
        return taken

    def evaluate(self, now: datetime) -> list[Finding]:
        """Every detector's findings as of ``now`` (each reported once)."""
        return [*self.loss.evaluate(now), *self.throughput.evaluate(now),
                *self.stragglers.evaluate(now), *self.checkpoints.evaluate(now)]

    @property
    def exit_intent(self) -> ExitIntent | None:
        """The last exit intent this attempt wrote (for :func:`.restarts.classify_exit`)."""
        return self._exit_intent

    def snapshot(self, now: datetime) -> TrainingSnapshot:
        rate = self.throughput.rate(now, self.rate_window_s)
        unit = self.throughput.unit
        tokens = rate if unit == "tokens" else None
        samples = rate if unit == "samples" else None
        steps = rate if unit == "steps" else None
        inputs = self.mfu_inputs
        if tokens is None and samples is not None and inputs and inputs.tokens_per_sample:
            tokens = samples * inputs.tokens_per_sample
        return TrainingSnapshot(
            step=self._last.step if self._last else None,
            last_record_time=self._last.time if self._last else None,
            loss=self._last_loss, tokens_per_s=tokens, samples_per_s=samples, steps_per_s=steps,
            mfu=self._mfu(tokens), stragglers=self.stragglers.stragglers(),
            open_checkpoints=self.checkpoints.open_saves(), exit_intent=self._exit_intent)

    def _mfu(self, tokens_per_s: float | None) -> float | None:
        inputs = self.mfu_inputs
        if inputs is None:
            return None
        if self._tflops is not None:
            return mfu_from_tflops(self._tflops, inputs.peak_flops_per_gpu)
        if inputs.params is None or tokens_per_s is None or inputs.gpus < 1:
            return None
        return model_flops_utilization(inputs.params, tokens_per_s, inputs.gpus, inputs.peak_flops_per_gpu)

    # -- state ---------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """JSON-safe state (the thresholds are not in it: they come from the config)."""
        last = self._last
        return {
            "v": 1, "loss": self.loss.to_state(), "throughput": self.throughput.to_state(),
            "stragglers": self.stragglers.to_state(), "checkpoints": self.checkpoints.to_state(),
            "last": None if last is None else [last.step, last.time],
            "last_loss": self._last_loss, "tflops": self._tflops,
            "exit_intent": None if self._exit_intent is None else
            {"restart": self._exit_intent.restart, "why": self._exit_intent.why}}

    @classmethod
    def from_state(cls, run: str, thresholds: RunThresholds, state: dict[str, Any], *,
                   attempt_start: float | None = None, mfu: MfuInputs | None = None,
                   rate_window_s: float = 300.0) -> TrainingMonitor:
        monitor = cls(run, thresholds, attempt_start=attempt_start, mfu=mfu, rate_window_s=rate_window_s)
        monitor.loss = LossMonitor.from_state(run, thresholds.loss, state.get("loss", {}))
        monitor.throughput = ThroughputMonitor.from_state(run, thresholds.throughput,
                                                          state.get("throughput", {}))
        monitor.stragglers = StragglerMonitor.from_state(run, thresholds.straggler,
                                                         state.get("stragglers", {}))
        monitor.checkpoints = CheckpointStallMonitor.from_state(run, thresholds.checkpoint_stall,
                                                                state.get("checkpoints", {}))
        if state.get("last") is not None:
            step, when = state["last"]
            monitor._last = ProgressRecord(step=int(step), time=float(when))
        monitor._last_loss = state.get("last_loss")
        monitor._tflops = state.get("tflops")
        intent = state.get("exit_intent")
        if intent is not None:
            monitor._exit_intent = ExitIntent(bool(intent["restart"]), str(intent.get("why", "")))
        return monitor
