"""Throughput drops of one attempt (pure; the clock is passed in).

Throughput is measured in the best unit the job reports, fixed at its first record:
tokens, else samples, else steps, from rank 0's records (or records without a rank,
as Megatron's). Between two consecutive records the rate is the counter's growth over
the time between them *less the time a checkpoint was being written* (a save is not
a slowdown; a save that never ends is the stall detector's business). A save during
which the counter kept growing was asynchronous and is not taken off.

A drop: the time-weighted mean rate over the last ``sustain`` is below ``below`` times
the time-weighted median rate of the ``baseline`` before it (so a drop never drags
its own baseline down), with at least ``min_baseline`` of data in that baseline and
data reaching back over the whole ``sustain``, at least half of which was training
(not saving). A job that stops reporting counts as zero progress only once the
training time since its last record is ``stall_factor`` times its usual gap between
records (a job that logs every 5 minutes is not idle 4 minutes after its last line).
One finding per episode; it ends when the rate recovers. Counters are cumulative, so
the records are thinned to one per 2% of the shorter window: a job logging every step
costs the same as one logging every few seconds.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .findings import Finding, FindingKind
from .protocol import CheckpointEvent, ProgressRecord
from .stats import median, weighted_median
from .thresholds import ThroughputThresholds

_UNITS = ("tokens", "samples", "steps")


class ThroughputMonitor:
    """Watches the throughput of one attempt of ``run``; see the module docstring."""

    def __init__(self, run: str, thresholds: ThroughputThresholds) -> None:
        self.run = run
        self.thresholds = thresholds
        self.unit: str | None = None
        self._samples: list[tuple[float, int]] = []
        self._open: dict[str, float] = {}
        self._pauses: list[tuple[float, float]] = []
        self._in_drop = False
        self._resolution = min(thresholds.sustain, thresholds.min_baseline) / 50

    def observe(self, record: ProgressRecord) -> None:
        if record.rank not in (0, None):
            return
        if record.event is not None:
            self._pause(record)
        if self.unit is None:
            if record.event is not None or record.exit_intent is not None:
                return  # the unit comes from a step record: an event line may lack the counters
            self.unit = next(u for u in _UNITS if _counter(record, u) is not None)
        value = _counter(record, self.unit)
        if value is None:
            return
        if self._samples and value < self._samples[-1][1]:
            # The counter started over (the job resumed and counts from 0 again).
            self._samples.clear()
        if self._samples and record.time <= self._samples[-1][0]:
            return
        # Counters are cumulative, so thinning them loses nothing but resolution: keep one
        # sample per ``_resolution`` seconds, the newest always last.
        if len(self._samples) >= 2 and record.time - self._samples[-2][0] < self._resolution:
            self._samples[-1] = (record.time, value)
        else:
            self._samples.append((record.time, value))

    def evaluate(self, now: datetime) -> list[Finding]:
        """A finding when a drop starts; nothing while it lasts or when there is too little data."""
        t = now.timestamp()
        self._prune(t)
        judged = self._judge(t)
        if judged is None:
            return []
        current, baseline = judged
        limit = self.thresholds.below * baseline
        if current >= limit:
            self._in_drop = False
            return []
        if self._in_drop:
            return []
        self._in_drop = True
        unit = f"{self.unit}/s"
        return [Finding(
            kind=FindingKind.THROUGHPUT_DROP, run=self.run, at=now, value=current, threshold=limit,
            step=self._samples[-1][1] if self.unit == "steps" else None,
            evidence=(f"{current:.4g} {unit} over the last {_minutes(self.thresholds.sustain)} is "
                      f"{current / baseline:.0%} of the median {baseline:.4g} {unit} of the "
                      f"{_minutes(self.thresholds.baseline)} before (limit {self.thresholds.below:.0%})"))]

    def rate(self, now: datetime, window_s: float) -> float | None:
        """Mean rate (``unit`` per second) over the last ``window_s``; None without data there."""
        t = now.timestamp()
        return _mean_rate(self._intervals(t, with_tail=True), t - window_s, t)

    # -- state ---------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {"unit": self.unit, "samples": [list(s) for s in self._samples],
                "open": dict(self._open), "pauses": [list(p) for p in self._pauses],
                "in_drop": self._in_drop}

    @classmethod
    def from_state(cls, run: str, thresholds: ThroughputThresholds, state: dict[str, Any]) -> ThroughputMonitor:
        monitor = cls(run, thresholds)
        monitor.unit = state.get("unit")
        monitor._samples = [(float(t), int(v)) for t, v in state.get("samples", [])]
        monitor._open = {str(k): float(v) for k, v in state.get("open", {}).items()}
        monitor._pauses = [(float(a), float(b)) for a, b in state.get("pauses", [])]
        monitor._in_drop = bool(state.get("in_drop", False))
        return monitor

    # -- internals -----------------------------------------------------------------------

    def _pause(self, record: ProgressRecord) -> None:
        key = f"{record.host or ''}|{record.path or record.step}"
        if record.event is CheckpointEvent.BEGIN:
            self._open.setdefault(key, record.time)
        elif key in self._open:
            self._pauses.append((self._open.pop(key), record.time))

    def _merged_pauses(self, now: float) -> list[tuple[float, float]]:
        """Checkpoint saves that stopped training, as disjoint spans (an open one lasts until
        ``now``). A save during which the counter still grew was asynchronous: not a pause."""
        times = [t for t, _ in self._samples]
        spans = []
        for s, e in [*self._pauses, *((s, now) for s in self._open.values())]:
            i = bisect.bisect_right(times, s)
            before = self._samples[i - 1][1] if i > 0 else None
            j = bisect.bisect_left(times, e)
            if before is not None and any(c > before for _, c in self._samples[i:j]):
                continue
            spans.append((s, e))
        merged: list[tuple[float, float]] = []
        for s, e in sorted(spans):
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            elif e > s:
                merged.append((s, e))
        return merged

    def _intervals(self, now: float, *, with_tail: bool) -> list[tuple[float, float, float, float]]:
        """``(start, end, rate, active seconds)`` between consecutive records, and the gap
        since the last record (rate 0) once its training time (the gap less any save in it)
        is ``stall_factor`` times the usual gap."""
        pauses = self._merged_pauses(now)
        out = []
        gaps = []
        for (t0, c0), (t1, c1) in zip(self._samples, self._samples[1:], strict=False):
            gaps.append(t1 - t0)
            active = (t1 - t0) - _overlap(pauses, t0, t1)
            if active > 1e-6:
                out.append((t0, t1, (c1 - c0) / active, active))
        if with_tail and gaps:
            last = self._samples[-1][0]
            active = (now - last) - _overlap(pauses, last, now)
            if active > self.thresholds.stall_factor * median(gaps):
                out.append((last, now, 0.0, active))
        return out

    def _judge(self, now: float) -> tuple[float, float] | None:
        th = self.thresholds
        if not self._samples or self._samples[0][0] > now - th.sustain - th.min_baseline:
            return None
        intervals = self._intervals(now, with_tail=True)
        split = now - th.sustain
        base = [(rate, w) for rate, w in _weights(intervals, split - th.baseline, split)]
        if sum(w for _, w in base) < th.min_baseline:
            return None
        recent = _weights(intervals, split, now)
        if sum(w for _, w in recent) < 0.5 * th.sustain:
            return None  # mostly saving a checkpoint: too little training time to judge
        current = _mean_rate(intervals, split, now)
        baseline = weighted_median(base)
        if current is None or baseline <= 0:
            return None
        return current, baseline

    def _prune(self, now: float) -> None:
        horizon = now - self.thresholds.sustain - self.thresholds.baseline
        keep = next((i for i, (t, _) in enumerate(self._samples) if t >= horizon), len(self._samples))
        # Keep one record before the horizon: the interval across it still counts.
        self._samples = self._samples[max(0, keep - 1):]
        self._pauses = [p for p in self._pauses if p[1] >= horizon]


def _overlap(spans: Sequence[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of [a, b] inside the disjoint, sorted ``spans``."""
    start = bisect.bisect_left(spans, (a, a)) - 1
    total = 0.0
    for s, e in spans[max(0, start):]:
        if s >= b:
            break
        total += max(0.0, min(e, b) - max(s, a))
    return total


def _counter(record: ProgressRecord, unit: str) -> int | None:
    if unit == "tokens":
        return record.tokens
    if unit == "samples":
        return record.samples
    return record.step


def _weights(intervals: Sequence[tuple[float, float, float, float]], a: float,
             b: float) -> list[tuple[float, float]]:
    """``(rate, active seconds inside [a, b])`` of each interval overlapping [a, b]."""
    out = []
    for s, e, rate, active in intervals:
        overlap = min(e, b) - max(s, a)
        if overlap > 0:
            out.append((rate, active * overlap / (e - s)))
    return out


def _mean_rate(intervals: Sequence[tuple[float, float, float, float]], a: float, b: float) -> float | None:
    pairs = _weights(intervals, a, b)
    total = sum(w for _, w in pairs)
    return sum(r * w for r, w in pairs) / total if total > 0 else None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"
