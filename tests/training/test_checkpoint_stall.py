"""Checkpoint writes that began and did not end: per host, with a limit that learns."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from b300.training.checkpoint_stall import CheckpointStallMonitor
from b300.training.findings import FindingKind
from b300.training.protocol import CheckpointEvent, ProgressRecord
from b300.training.thresholds import CheckpointStallThresholds

T0 = 1_800_000_000.0
TH = CheckpointStallThresholds()   # 30 min; then 5x the median save, at least 5 min


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _begin(step: int, t: float, host: str | None = "gpu01", path: str | None = "auto") -> ProgressRecord:
    return ProgressRecord(step=step, time=t, host=host, event=CheckpointEvent.BEGIN,
                          path=f"/ckpt/step_{step}" if path == "auto" else path)


def _end(step: int, t: float, host: str | None = "gpu01", path: str | None = "auto") -> ProgressRecord:
    return ProgressRecord(step=step, time=t, host=host, event=CheckpointEvent.END,
                          path=f"/ckpt/step_{step}" if path == "auto" else path)


def test_a_save_without_end_is_stalled_after_the_timeout_once() -> None:
    monitor = CheckpointStallMonitor("run-2", TH)
    monitor.observe(_begin(100, T0))
    assert monitor.evaluate(_at(T0 + TH.timeout - 1)) == []
    found = monitor.evaluate(_at(T0 + TH.timeout + 1))
    assert [(f.kind, f.host, f.step, f.run) for f in found] == [
        (FindingKind.CHECKPOINT_STALLED, "gpu01", 100, "run-2")]
    assert found[0].threshold == TH.timeout and "configured timeout" in found[0].evidence
    assert "/ckpt/step_100" in found[0].evidence
    assert monitor.evaluate(_at(T0 + 2 * TH.timeout)) == []       # once per save
    monitor.observe(_end(100, T0 + 2 * TH.timeout))
    assert monitor.open_saves() == 0


def test_the_limit_follows_the_saves_of_the_attempt() -> None:
    monitor = CheckpointStallMonitor("r", TH)
    t = T0
    for step, took in ((10, 100.0), (20, 120.0), (30, 110.0)):
        monitor.observe(_begin(step, t))
        monitor.observe(_end(step, t + took))
        t += 1000
    assert monitor.limit() == 5 * 110.0
    monitor.observe(_begin(40, t))
    assert monitor.evaluate(_at(t + 549)) == []
    found = monitor.evaluate(_at(t + 551))
    assert [f.step for f in found] == [40] and "median of the last 3 saves" in found[0].evidence
    quick = CheckpointStallMonitor("r", TH)
    for step in (1, 2, 3):
        quick.observe(_begin(step, T0 + step))
        quick.observe(_end(step, T0 + step + 1.0))
    assert quick.limit() == TH.min_timeout


def test_hosts_are_apart_and_an_end_without_path_closes_by_step() -> None:
    monitor = CheckpointStallMonitor("r", TH)
    monitor.observe(_begin(5, T0, host="gpu01"))
    monitor.observe(_begin(5, T0, host="gpu02"))
    monitor.observe(_end(5, T0 + 10, host="gpu01", path=None))
    found = monitor.evaluate(_at(T0 + TH.timeout + 5))
    assert [f.host for f in found] == ["gpu02"]


def test_a_begin_stamped_in_the_future_starts_now() -> None:
    monitor = CheckpointStallMonitor("r", TH)
    monitor.observe(_begin(5, T0 + 10_000))
    assert monitor.evaluate(_at(T0)) == []


def test_an_end_without_a_begin_is_nothing() -> None:
    monitor = CheckpointStallMonitor("r", TH)
    monitor.observe(_end(5, T0))
    monitor.observe(ProgressRecord(step=6, time=T0))
    assert monitor.open_saves() == 0 and monitor.evaluate(_at(T0 + 1e6)) == []


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32), typical=st.floats(1.0, TH.timeout / 2 - 1), spread=st.floats(0.0, 1.0),
       hosts=st.integers(1, 8))
def test_saves_that_end_within_their_usual_time_raise_nothing(seed: int, typical: float, spread: float,
                                                              hosts: int) -> None:
    """Saves taking half to twice their usual time, checked every 30 s while they run. (The
    usual time is under half the configured timeout: before three saves are timed, the
    timeout is all there is, so a run whose saves take longer must configure it.)"""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not crypto
    monitor = CheckpointStallMonitor("r", TH)
    t = T0
    for step in range(0, 40):
        ends = []
        for h in range(hosts):
            monitor.observe(_begin(step, t, host=f"gpu{h}"))
            ends.append(t + typical * (1 + rng.uniform(-spread / 2, spread)))
        check = t
        while check < max(ends):
            assert monitor.evaluate(_at(check)) == []
            check += 30
        for h, end in enumerate(ends):
            monitor.observe(_end(step, end, host=f"gpu{h}"))
        t = max(ends) + 600


def test_state_round_trip() -> None:
    monitor = CheckpointStallMonitor("r", TH)
    for step in (1, 2, 3):
        monitor.observe(_begin(step, T0 + 100 * step))
        monitor.observe(_end(step, T0 + 100 * step + 60))
    monitor.observe(_begin(4, T0 + 500))
    monitor.evaluate(_at(T0 + 500 + 301))           # flagged (limit 300 s: 5x60)
    copy = CheckpointStallMonitor.from_state("r", TH, json.loads(json.dumps(monitor.to_state())))
    assert copy.limit() == monitor.limit() == 300.0
    assert copy.evaluate(_at(T0 + 5000)) == []        # already reported: not again
    copy.observe(_end(4, T0 + 5000))
    assert copy.open_saves() == 0
