"""Straggler hosts of one attempt: slower than their peers step after step (pure).

Input: per-host ``step_time_s`` (each host's own work for a step, not the time it
waited for the others: in synchronous training the wall time per step is the same
everywhere, so only the own-work time tells the slow host apart).

For each step, each host is compared with the *other* hosts of that step (leave one
out: with two hosts, with the other one). It is an outlier when its time is at least
``ratio`` times their median, at least ``min_excess`` seconds above it (found live:
sub-millisecond step times differ by 40% from jitter alone) and, with three or
more others, also ``mad_k`` robust
sigmas above it (so one host among many with naturally wide jitter is not singled
out). A host that is an outlier for ``steps`` consecutive judged steps is a
straggler: one finding, until it has a step that is not an outlier.

A step is judged once every host seen so far has reported a later step, or when more
than ``max_pending_steps`` steps wait (a host that stopped reporting does not hold the
others up). Steps with fewer than ``min_hosts`` hosts are not judged; they neither
extend nor break a streak.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .findings import Finding, FindingKind
from .protocol import ProgressRecord
from .stats import median, robust_scale
from .thresholds import StragglerThresholds


class StragglerMonitor:
    """Watches per-host step times of one attempt of ``run``; see the module docstring."""

    def __init__(self, run: str, thresholds: StragglerThresholds) -> None:
        self.run = run
        self.thresholds = thresholds
        self._pending: dict[int, dict[str, float]] = {}
        self._last_step: dict[str, int] = {}
        self._closed_through = -1
        self._streak: dict[str, int] = {}
        self._flagged: set[str] = set()
        self._found: list[dict[str, Any]] = []

    def observe(self, record: ProgressRecord) -> None:
        if record.host is None or record.step_time_s is None:
            return
        host, step = record.host, record.step
        if step < self._last_step.get(host, -1):
            self._rewind()  # the job resumed from an earlier step: start over
        if step <= self._closed_through:
            return  # too late: that step was judged without it
        self._pending.setdefault(step, {})[host] = record.step_time_s
        self._last_step[host] = max(step, self._last_step.get(host, -1))

    def evaluate(self, now: datetime) -> list[Finding]:
        """Judge the steps that are complete; findings for hosts that became stragglers."""
        ready = min(self._last_step.values(), default=-1)
        for step in sorted(self._pending):
            if step >= ready and len(self._pending) <= self.thresholds.max_pending_steps:
                break
            self._judge(step, self._pending.pop(step))
            self._closed_through = step
        found = [Finding(at=now, run=self.run, **f) for f in self._found]
        self._found = []
        return found

    def stragglers(self) -> frozenset[str]:
        """Hosts flagged now (until they have a normal step)."""
        return frozenset(self._flagged)

    # -- state ---------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {"pending": {str(s): dict(h) for s, h in self._pending.items()},
                "last_step": dict(self._last_step), "closed_through": self._closed_through,
                "streak": dict(self._streak), "flagged": sorted(self._flagged),
                "found": [dict(f) for f in self._found]}

    @classmethod
    def from_state(cls, run: str, thresholds: StragglerThresholds, state: dict[str, Any]) -> StragglerMonitor:
        monitor = cls(run, thresholds)
        monitor._pending = {int(s): {str(h): float(t) for h, t in hosts.items()}
                            for s, hosts in state.get("pending", {}).items()}
        monitor._last_step = {str(h): int(s) for h, s in state.get("last_step", {}).items()}
        monitor._closed_through = int(state.get("closed_through", -1))
        monitor._streak = {str(h): int(n) for h, n in state.get("streak", {}).items()}
        monitor._flagged = {str(h) for h in state.get("flagged", [])}
        monitor._found = [{**f, "kind": FindingKind(f["kind"])} for f in state.get("found", [])]
        return monitor

    # -- internals -----------------------------------------------------------------------

    def _rewind(self) -> None:
        self._pending.clear()
        self._last_step.clear()
        self._closed_through = -1
        self._streak.clear()

    def _judge(self, step: int, times: dict[str, float]) -> None:
        th = self.thresholds
        if len(times) < th.min_hosts:
            return
        for host, mine in times.items():
            others = [t for h, t in times.items() if h != host]
            mid = median(others)
            # ... and at least min_excess seconds slower: a ratio of sub-millisecond times is jitter.
            slow = mid > 0 and mine >= th.ratio * mid and mine - mid >= th.min_excess
            if slow and len(others) >= 3:
                slow = mine - mid >= th.mad_k * robust_scale(others, mid, floor=0.01 * mid)
            if not slow:
                self._streak[host] = 0
                self._flagged.discard(host)
                continue
            self._streak[host] = self._streak.get(host, 0) + 1
            if self._streak[host] >= th.steps and host not in self._flagged:
                self._flagged.add(host)
                self._found.append({
                    "kind": FindingKind.STRAGGLER, "host": host, "step": step, "value": mine,
                    "threshold": th.ratio * mid,
                    "evidence": (f"{host} took {mine:.3g} s for step {step}, {mine / mid:.2f}x the "
                                 f"median {mid:.3g} s of the other {len(others)} host(s), for "
                                 f"{self._streak[host]} steps in a row (limit {th.ratio:g}x for "
                                 f"{th.steps} steps)")})
