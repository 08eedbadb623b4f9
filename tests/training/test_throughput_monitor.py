"""Throughput drops: below X% of the run's own recent median for Y minutes, and nothing else."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from b300.training.findings import Finding, FindingKind
from b300.training.protocol import CheckpointEvent, ProgressRecord
from b300.training.thresholds import ThroughputThresholds
from b300.training.throughput import ThroughputMonitor

T0 = 1_800_000_000.0
TH = ThroughputThresholds()   # 70% for 10 min against the hour before, 10 min of baseline needed


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def steady_run(seed: int, duration_s: float, *, step_s: float, jitter: float, tokens_per_step: int = 4096,
               ckpt_every_s: float | None = None, ckpt_s: float = 0.0, slow_from: float | None = None,
               slow_factor: float = 1.0, log_every: int = 1) -> list[ProgressRecord]:
    """Step records (tokens counted) with uniform jitter on each step's time, a checkpoint
    save every ``ckpt_every_s`` taking ``ckpt_s`` (no steps meanwhile), and from
    ``slow_from`` on every step ``slow_factor`` times slower."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not crypto
    t, step, tokens, next_ckpt = T0, 0, 0, (T0 + ckpt_every_s if ckpt_every_s else None)
    out = []
    while t < T0 + duration_s:
        factor = slow_factor if slow_from is not None and t >= T0 + slow_from else 1.0
        t += step_s * factor * (1 + rng.uniform(-jitter, jitter))
        step += 1
        tokens += tokens_per_step
        if step % log_every == 0:
            out.append(ProgressRecord(step=step, time=t, tokens=tokens))
        if next_ckpt is not None and t >= next_ckpt:
            out.append(ProgressRecord(step=step, time=t, event=CheckpointEvent.BEGIN, path=f"/c/{step}"))
            t += ckpt_s
            out.append(ProgressRecord(step=step, time=t, event=CheckpointEvent.END, path=f"/c/{step}"))
            next_ckpt = t + (ckpt_every_s or 0)
    return out


def replay(monitor: ThroughputMonitor, records: list[ProgressRecord], *, until: float,
           cycle_s: float = 30.0) -> list[tuple[float, Finding]]:
    """Feed records as they would arrive and evaluate every ``cycle_s`` (a daemon cycle)."""
    found = []
    i = 0
    t = T0
    while t <= until:
        while i < len(records) and records[i].time <= t:
            monitor.observe(records[i])
            i += 1
        found += [(t, f) for f in monitor.evaluate(_at(t))]
        t += cycle_s
    return found


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32), step_s=st.floats(0.3, 20.0), jitter=st.floats(0.0, 0.4),
       ckpt_every=st.none() | st.floats(600, 3600), ckpt_s=st.floats(0, 600), log_every=st.integers(1, 20))
def test_a_steady_run_with_jitter_and_checkpoints_raises_nothing(
        seed: int, step_s: float, jitter: float, ckpt_every: float | None, ckpt_s: float,
        log_every: int) -> None:
    records = steady_run(seed, 2.5 * 3600, step_s=step_s, jitter=jitter, ckpt_every_s=ckpt_every,
                         ckpt_s=ckpt_s, log_every=log_every)
    assert replay(ThroughputMonitor("r", TH), records, until=T0 + 2.5 * 3600, cycle_s=60) == []


def test_sparse_logging_is_not_idleness() -> None:
    """Megatron with --log-interval such that a line comes every 5 minutes."""
    records = steady_run(4, 4 * 3600, step_s=3.0, jitter=0.05, log_every=100)
    assert replay(ThroughputMonitor("r", TH), records, until=T0 + 4 * 3600) == []


def test_a_halved_rate_is_found_once_after_the_sustain_time() -> None:
    records = steady_run(5, 3 * 3600, step_s=1.0, jitter=0.1, slow_from=5400, slow_factor=2.2)
    found = replay(ThroughputMonitor("run-9", TH), records, until=T0 + 3 * 3600)
    assert len(found) == 1
    when, finding = found[0]
    assert finding.kind is FindingKind.THROUGHPUT_DROP and finding.run == "run-9"
    assert finding.value is not None and finding.threshold is not None and finding.value < finding.threshold
    assert "tokens/s" in finding.evidence and "limit 70%" in finding.evidence
    # Found once the slow part dominates the 10-minute window, and within it.
    assert T0 + 5400 + 0.3 * TH.sustain <= when <= T0 + 5400 + TH.sustain


def test_a_job_that_stops_reporting_is_a_drop() -> None:
    records = steady_run(6, 2 * 3600, step_s=2.0, jitter=0.1)
    found = replay(ThroughputMonitor("r", TH), records, until=T0 + 2 * 3600 + 1200)
    assert len(found) == 1 and T0 + 2 * 3600 < found[0][0] <= T0 + 2 * 3600 + TH.sustain


def test_a_long_checkpoint_save_is_not_a_drop() -> None:
    records = steady_run(7, 3 * 3600, step_s=1.0, jitter=0.1, ckpt_every_s=3600, ckpt_s=540)
    assert replay(ThroughputMonitor("r", TH), records, until=T0 + 3 * 3600) == []


def test_too_little_history_is_no_verdict() -> None:
    records = steady_run(8, 900, step_s=1.0, jitter=0.0, slow_from=300, slow_factor=10)
    assert replay(ThroughputMonitor("r", TH), records, until=T0 + 900) == []


def test_units_and_rate() -> None:
    monitor = ThroughputMonitor("r", TH)
    monitor.observe(ProgressRecord(step=1, time=T0, event=CheckpointEvent.BEGIN))  # no unit from an event
    monitor.observe(ProgressRecord(step=1, time=T0 + 0.5, event=CheckpointEvent.END))
    monitor.observe(ProgressRecord(step=1, time=T0 + 1, samples=8))
    assert monitor.unit == "samples"
    for i in range(2, 62):
        monitor.observe(ProgressRecord(step=i, time=T0 + i, samples=8 * i))
    assert monitor.rate(_at(T0 + 61), 30) == 8.0
    other = ThroughputMonitor("r", TH)
    other.observe(ProgressRecord(step=3, time=T0))
    assert other.unit == "steps"


def test_a_counter_that_starts_over_is_a_new_series() -> None:
    monitor = ThroughputMonitor("r", TH)
    for i in range(10):
        monitor.observe(ProgressRecord(step=i, time=T0 + i, tokens=1000 + 10 * i))
    monitor.observe(ProgressRecord(step=10, time=T0 + 10, tokens=5))
    monitor.observe(ProgressRecord(step=11, time=T0 + 11, tokens=15))
    assert monitor.rate(_at(T0 + 11), 5) == 10.0


def test_other_ranks_are_ignored() -> None:
    monitor = ThroughputMonitor("r", TH)
    monitor.observe(ProgressRecord(step=1, time=T0, tokens=10, rank=3))
    assert monitor.unit is None


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32), cut_s=st.floats(0, 3 * 3600))
def test_state_round_trip_changes_nothing(seed: int, cut_s: float) -> None:
    records = steady_run(seed, 3 * 3600, step_s=2.0, jitter=0.2, ckpt_every_s=1800, ckpt_s=120,
                         slow_from=7000, slow_factor=3)
    cycle = 120.0
    expected = replay(ThroughputMonitor("r", TH), records, until=T0 + 3 * 3600, cycle_s=cycle)
    last = T0 + (cut_s // cycle) * cycle          # the last cycle before the daemon stopped
    first = ThroughputMonitor("r", TH)
    got = replay(first, [r for r in records if r.time <= last], until=last, cycle_s=cycle)
    resumed = ThroughputMonitor.from_state("r", TH, json.loads(json.dumps(first.to_state())))
    rest = [r for r in records if r.time > last]
    t, i = last + cycle, 0
    while t <= T0 + 3 * 3600:
        while i < len(rest) and rest[i].time <= t:
            resumed.observe(rest[i])
            i += 1
        got += [(t, f) for f in resumed.evaluate(_at(t))]
        t += cycle
    assert got == expected


def test_an_asynchronous_save_is_not_taken_off() -> None:
    """Steps went on while the save ran: the save's time was training time."""
    monitor = ThroughputMonitor("r", TH)
    monitor.observe(ProgressRecord(step=0, time=T0, tokens=0))
    monitor.observe(ProgressRecord(step=10, time=T0 + 10, event=CheckpointEvent.BEGIN, path="/c/10"))
    for i in range(1, 121):
        monitor.observe(ProgressRecord(step=i, time=T0 + i, tokens=100 * i))
        if i == 100:
            monitor.observe(ProgressRecord(step=i, time=T0 + i, event=CheckpointEvent.END, path="/c/10"))
    rate = monitor.rate(_at(T0 + 120), 110)
    assert rate is not None and abs(rate - 100.0) < 1e-6
