"""Straggler hosts: an outlier among the run's hosts for Z steps in a row, never jitter."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from b300.training.findings import Finding, FindingKind
from b300.training.protocol import ProgressRecord
from b300.training.stragglers import StragglerMonitor
from b300.training.thresholds import StragglerThresholds

NOW = datetime(2026, 12, 1, tzinfo=UTC)
TH = StragglerThresholds()   # 1.3x the others' median (and 3.5 robust sigmas with 4+ hosts) for 10 steps


def step_times(seed: int, hosts: int, steps: int, *, sigma: float, slow: dict[int, float] | None = None,
               slow_from: int = 0, base: float = 1.0) -> list[ProgressRecord]:
    """Per-host own-work times: lognormal jitter ``sigma`` around ``base`` (each host with its
    own small constant offset, as real nodes have), host i ``slow[i]`` times slower from
    ``slow_from``. Hosts report in a shuffled order within each step."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not crypto
    offset = [1 + rng.uniform(-0.05, 0.05) for _ in range(hosts)]
    out = []
    for step in range(steps):
        batch = []
        for h in range(hosts):
            factor = (slow or {}).get(h, 1.0) if step >= slow_from else 1.0
            t = base * offset[h] * factor * rng.lognormvariate(0, sigma)
            batch.append(ProgressRecord(step=step, time=1e9 + step, host=f"gpu{h:02d}", rank=8 * h,
                                        step_time_s=t))
        rng.shuffle(batch)
        out += batch
    return out


def run(monitor: StragglerMonitor, records: list[ProgressRecord], every: int = 16) -> list[Finding]:
    found = []
    for i, rec in enumerate(records):
        monitor.observe(rec)
        if i % every == 0:
            found += monitor.evaluate(NOW)
    return found + monitor.evaluate(NOW)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), hosts=st.integers(2, 32), sigma=st.floats(0.0, 0.15),
       base=st.floats(0.05, 30.0))
def test_hosts_with_jitter_are_no_stragglers(seed: int, hosts: int, sigma: float, base: float) -> None:
    assert run(StragglerMonitor("r", TH), step_times(seed, hosts, 300, sigma=sigma, base=base)) == []


def test_a_slow_host_among_eight_is_found_after_z_steps() -> None:
    monitor = StragglerMonitor("run-3", TH)
    found = run(monitor, step_times(1, 8, 200, sigma=0.03, slow={5: 1.6}, slow_from=100))
    assert [(f.kind, f.host, f.step, f.run) for f in found] == [
        (FindingKind.STRAGGLER, "gpu05", 100 + TH.steps - 1, "run-3")]
    assert found[0].value is not None and found[0].threshold is not None
    assert found[0].value > found[0].threshold and "other 7 host(s)" in found[0].evidence
    assert monitor.stragglers() == {"gpu05"}


def test_with_two_hosts_the_slower_one_is_named() -> None:
    found = run(StragglerMonitor("r", TH), step_times(2, 2, 100, sigma=0.02, slow={0: 1.5}, slow_from=20))
    assert [f.host for f in found] == ["gpu00"]


def test_a_host_that_recovers_is_cleared_and_can_be_found_again() -> None:
    def steps(first: int, last: int, slow_time: float) -> list[ProgressRecord]:
        return [ProgressRecord(step=s, time=1e9 + s, host=f"gpu{h:02d}",
                               step_time_s=slow_time if h == 1 else 1.0)
                for s in range(first, last) for h in range(4)]

    monitor = StragglerMonitor("r", TH)
    assert [f.host for f in run(monitor, steps(0, 30, 2.0))] == ["gpu01"]
    assert run(monitor, steps(30, 40, 1.0)) == []
    assert monitor.stragglers() == frozenset()
    assert [(f.host, f.step) for f in run(monitor, steps(40, 70, 2.5))] == [("gpu01", 49)]


def test_a_host_that_stops_reporting_does_not_hold_the_others_up() -> None:
    monitor = StragglerMonitor("r", TH)
    records = [r for r in step_times(4, 4, 150, sigma=0.01, slow={2: 2.0}, slow_from=10)
               if not (r.host == "gpu03" and r.step >= 5)]
    found = run(monitor, records)
    assert [f.host for f in found] == ["gpu02"]


def test_one_host_alone_is_never_judged() -> None:
    records = [ProgressRecord(step=s, time=1e9, host="gpu01", step_time_s=5.0 + s) for s in range(100)]
    assert run(StragglerMonitor("r", TH), records) == []


def test_records_without_host_or_step_time_are_ignored() -> None:
    monitor = StragglerMonitor("r", TH)
    monitor.observe(ProgressRecord(step=1, time=1e9, step_time_s=3.0))
    monitor.observe(ProgressRecord(step=1, time=1e9, host="a"))
    assert monitor.to_state()["pending"] == {}


def test_a_resume_at_an_earlier_step_starts_over() -> None:
    monitor = StragglerMonitor("r", TH)
    run(monitor, step_times(5, 3, 50, sigma=0.01, slow={0: 2.0}, slow_from=45))   # streak of 4-5
    found = run(monitor, step_times(6, 3, 8, sigma=0.01, slow={0: 2.0}))           # steps 0-7 again
    assert found == []   # the streak started over with the new attempt: 8 < 10 steps


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32), cut=st.integers(0, 800))
def test_state_round_trip_changes_nothing(seed: int, cut: int) -> None:
    records = step_times(seed, 4, 200, sigma=0.02, slow={3: 1.8}, slow_from=120)
    expected = run(StragglerMonitor("r", TH), records)
    first = StragglerMonitor("r", TH)
    got = run(first, records[:cut])
    second = StragglerMonitor.from_state("r", TH, json.loads(json.dumps(first.to_state())))
    got += run(second, records[cut:])
    assert [(f.host, f.step) for f in got] == [(f.host, f.step) for f in expected]


def test_sub_millisecond_jitter_is_no_straggler_but_a_real_slowdown_is() -> None:
    """Found live (tests/live/test_training_health_live.py, clean run): two hosts doing
    0.4 ms of own work per step differ by 40% from jitter alone; below ``min_excess``
    (50 ms) a ratio is not a straggler. The same hosts with 0.3 s of sleep on one are."""
    jitter = step_times(3, 2, 200, sigma=0.3, base=0.0004)
    few = StragglerThresholds(steps=3)
    assert run(StragglerMonitor("r", few), jitter) == []
    # Without the floor, the same jitter is "a straggler" (what the live clean run showed).
    assert run(StragglerMonitor("r", StragglerThresholds(steps=3, min_excess=0)), jitter) != []
    slowed = [r if r.host != "gpu01" or r.step < 50 else
              ProgressRecord(step=r.step, time=r.time, host=r.host, rank=r.rank,
                             step_time_s=(r.step_time_s or 0) + 0.3) for r in jitter]
    found = run(StragglerMonitor("r", TH), slowed)
    assert [(f.host, f.step) for f in found] == [("gpu01", 50 + TH.steps - 1)]
