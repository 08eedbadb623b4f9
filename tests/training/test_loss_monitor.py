"""Loss spikes and NaN: found once per episode, never on a noisy but healthy curve."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from b300.training.findings import FindingKind
from b300.training.loss import LossMonitor
from b300.training.protocol import ProgressRecord
from b300.training.thresholds import LossSpikeThresholds

NOW = datetime(2026, 12, 1, tzinfo=UTC)
TH = LossSpikeThresholds()


def _rec(step: int, loss: float | None, nan_count: int = 0) -> ProgressRecord:
    return ProgressRecord(step=step, time=1e9 + step, loss=loss, nan_count=nan_count)


def healthy_curve(seed: int, n: int, *, sigma: float, a: float = 2.0, b: float = 6.0,
                  alpha: float = 0.5, stride: int = 1) -> list[tuple[int, float]]:
    """A pre-training loss curve ``a + b (s + 10)^-alpha`` with multiplicative noise of
    relative size ``sigma`` (normal, cut at 4 sigma: real batches have no unbounded tails)."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not crypto
    out = []
    for i in range(n):
        step = i * stride
        z = max(-4.0, min(4.0, rng.gauss(0.0, 1.0)))
        out.append((step, (a + b * (step + 10) ** -alpha) * math.exp(sigma * z)))
    return out


def _feed(monitor: LossMonitor, points: list[tuple[int, float]]) -> None:
    for step, loss in points:
        monitor.observe(_rec(step, loss))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(50, 700), sigma=st.floats(0.0, 0.12),
       a=st.floats(0.5, 4.0), b=st.floats(0.0, 10.0), alpha=st.floats(0.1, 1.0), stride=st.integers(1, 50))
def test_a_healthy_noisy_curve_raises_nothing(seed: int, n: int, sigma: float, a: float, b: float,
                                              alpha: float, stride: int) -> None:
    monitor = LossMonitor("r", TH)
    _feed(monitor, healthy_curve(seed, n, sigma=sigma, a=a, b=b, alpha=alpha, stride=stride))
    assert monitor.evaluate(NOW) == []


def test_a_spike_is_found_once_per_episode() -> None:
    monitor = LossMonitor("run-1", TH)
    points = healthy_curve(1, 300, sigma=0.02)
    _feed(monitor, points[:200])
    assert monitor.evaluate(NOW) == []
    limit = monitor.limit()
    assert limit is not None
    for step in range(200, 205):             # five steps far up: one finding
        monitor.observe(_rec(step, points[step][1] * 1.8))
    found = monitor.evaluate(NOW)
    assert [(f.kind, f.step, f.run) for f in found] == [(FindingKind.LOSS_SPIKE, 200, "run-1")]
    assert found[0].value is not None and found[0].threshold is not None
    assert found[0].value > found[0].threshold and "median" in found[0].evidence
    _feed(monitor, points[205:250])           # back to normal: the episode ends
    monitor.observe(_rec(250, points[250][1] * 1.8))
    assert [f.step for f in monitor.evaluate(NOW)] == [250]


def test_a_rise_within_min_rise_is_not_a_spike_on_a_flat_curve() -> None:
    monitor = LossMonitor("r", TH)
    _feed(monitor, [(s, 2.0) for s in range(100)])   # MAD 0: only min_rise protects
    monitor.observe(_rec(100, 2.1))                   # +5%
    assert monitor.evaluate(NOW) == []
    monitor.observe(_rec(101, 2.3))                   # +15%
    assert [f.kind for f in monitor.evaluate(NOW)] == [FindingKind.LOSS_SPIKE]


def test_nothing_is_judged_before_min_points() -> None:
    monitor = LossMonitor("r", TH)
    _feed(monitor, [(s, 2.0) for s in range(TH.min_points - 1)])
    monitor.observe(_rec(100, 50.0))
    assert monitor.evaluate(NOW) == []


def test_nan_once_per_run_of_nans() -> None:
    monitor = LossMonitor("r", TH)
    _feed(monitor, healthy_curve(2, 60, sigma=0.01))
    monitor.observe(_rec(60, math.nan))
    monitor.observe(_rec(61, math.inf))
    monitor.observe(_rec(62, None, nan_count=3))      # Megatron: nan iterations, no loss printed
    found = monitor.evaluate(NOW)
    assert [(f.kind, f.step) for f in found] == [(FindingKind.LOSS_NAN, 60)]
    assert "last finite loss" in found[0].evidence and found[0].value is None
    monitor.observe(_rec(63, 2.2))
    monitor.observe(_rec(64, None, nan_count=2))
    found = monitor.evaluate(NOW)
    assert [(f.kind, f.step, f.value) for f in found] == [(FindingKind.LOSS_NAN, 64, 2.0)]


def test_nan_can_be_turned_off() -> None:
    monitor = LossMonitor("r", LossSpikeThresholds(nan=False))
    monitor.observe(_rec(1, math.nan))
    assert monitor.evaluate(NOW) == []


def test_a_resume_from_an_earlier_step_is_not_a_spike() -> None:
    monitor = LossMonitor("r", TH)
    points = healthy_curve(3, 400, sigma=0.01, b=20.0)
    _feed(monitor, points)                     # the loss fell a long way
    _feed(monitor, points[150:250])            # resumed at step 150: higher losses again
    assert monitor.evaluate(NOW) == []


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), cut=st.integers(0, 400), spikes=st.lists(st.integers(60, 399), max_size=4))
def test_state_round_trip_changes_nothing(seed: int, cut: int, spikes: list[int]) -> None:
    points = [(s, v * (2.0 if s in spikes else 1.0)) for s, v in healthy_curve(seed, 400, sigma=0.03)]
    points.insert(200, (200, math.nan))
    whole = LossMonitor("r", TH)
    _feed(whole, points)
    expected = whole.evaluate(NOW)
    first = LossMonitor("r", TH)
    _feed(first, points[:cut])
    state = json.loads(json.dumps(first.to_state()))
    second = LossMonitor.from_state("r", TH, state)
    _feed(second, points[cut:])
    assert second.evaluate(NOW) == expected
