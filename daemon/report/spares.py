"""The weekly report's spare capacity: what the spares cost in idle GPU-hours and the queue
time they saved (pure: store records in, figures out).

Cost:

- **pool**: the idle nodes each ``b300-spares-<partition>`` reservation held, from its
  ``spares.pool`` events (one per change: the idle count holds from one to the next, and
  after the last one until the window's end), in node-hours, and in GPU-hours at the
  GPUs per node of the runs of that partition (of all runs when none names it; unknown
  when there is no run);
- **in allocation**: a run with ``spare_nodes = K`` holds K idle nodes inside each job
  while it runs, fewer after each step relaunch (``spares_left`` of the
  ``attempt.step_relaunch`` event): those nodes x its GPUs per node x the running time.

Saved (an estimate, and said so): the queue wait a plain resubmission would have had.
Its baseline is the median wait (submitted -> started) of the daemon's jobs that went to
the plain queue in the window; each resubmission that started in a pool saved the
baseline minus its own wait, each in-allocation relaunch the whole baseline (it waits for
nothing). With no plain-queue job in the window there is no baseline: unknown, never
guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..events import Kind
from ..model import Attempt, Event
from ..payloads import SparesPool, StepRelaunch
from ..spares.pool import pooled_reservation
from ..training.stats import median


@dataclass(frozen=True, slots=True)
class SpareRun:
    """What the spare figures need of one run: its spec's partition, node shape, attempts."""

    partition: str | None
    gpus_per_node: int
    spare_nodes: int
    attempts: Sequence[Attempt]


@dataclass(frozen=True, slots=True)
class SpareFigures:
    pool_node_hours: dict[str, float]       # partition -> idle node-hours its pool held
    pool_gpu_hours: float | None            # None: some pool's GPUs per node are not known
    in_allocation_gpu_hours: float          # idle spare_nodes inside the runs' jobs
    pool_recoveries: int                    # resubmitted jobs that started in a pool
    relaunches: int                         # in-allocation step relaunches
    baseline_queue_s: float | None          # median wait of the daemon's plain-queue jobs
    saved_s: float | None                   # queue time the spares avoided (None: no baseline)
    notes: tuple[str, ...] = ()

    @property
    def cost_gpu_hours(self) -> float | None:
        if self.pool_gpu_hours is None:
            return None
        return self.pool_gpu_hours + self.in_allocation_gpu_hours


def _overlap(since: datetime, until: datetime, a: datetime, b: datetime) -> float:
    lo, hi = max(since, a), min(until, b)
    return max(0.0, (hi - lo).total_seconds())


def pool_idle_node_s(pool_events: Sequence[Event], since: datetime, until: datetime) -> dict[str, float]:
    """Idle node-seconds per partition in [since, until) from the ``spares.pool`` events
    (any age: the one before ``since`` says what the pool held when the window began)."""
    by_part: dict[str, list[Event]] = {}
    for e in sorted((e for e in pool_events if e.kind == Kind.SPARES_POOL and e.ts < until),
                    key=lambda e: (e.ts, e.id)):
        by_part.setdefault(str(SparesPool.of(e).partition), []).append(e)
    found: dict[str, float] = {}
    for part, evs in by_part.items():
        total = 0.0
        for i, e in enumerate(evs):
            end = evs[i + 1].ts if i + 1 < len(evs) else until
            total += len(SparesPool.of(e).idle) * _overlap(since, until, e.ts, end)
        found[part] = total
    return found


def _in_allocation_gpu_s(run: SpareRun, relaunch: dict[int, list[Event]], since: datetime,
                         until: datetime) -> float:
    total = 0.0
    for a in run.attempts:
        if a.start is None:
            continue
        stop = min(a.end or until, until)
        spares, at = run.spare_nodes, a.start
        for e in relaunch.get(a.id, []):
            total += spares * _overlap(since, until, at, min(e.ts, stop))
            left = StepRelaunch.of(e).spares_left
            spares, at = (left if left is not None and left >= 0 else max(0, spares - 1)), e.ts
        total += spares * _overlap(since, until, at, stop)
    return total * run.gpus_per_node


def spare_figures(runs: Sequence[SpareRun], events: Sequence[Event], pool_events: Sequence[Event],
                  since: datetime, until: datetime) -> SpareFigures | None:
    """The window's spare figures; None when no pool was held and no run had spare nodes."""
    idle = pool_idle_node_s(pool_events, since, until)
    spare_runs = [r for r in runs if r.spare_nodes > 0]
    if not any(idle.values()) and not spare_runs:
        return None
    notes: list[str] = []
    pool_gpu_s: float | None = 0.0
    for part, node_s in sorted(idle.items()):
        if not node_s:
            continue
        gpus = [r.gpus_per_node for r in runs if r.partition == part] or \
            [r.gpus_per_node for r in runs]
        if not gpus:
            pool_gpu_s = None
            notes.append(f"pool {part}: GPUs per node unknown (no run of the daemon in the window)")
        elif pool_gpu_s is not None:
            if not any(r.partition == part for r in runs):
                notes.append(f"pool {part}: GPUs per node taken from the daemon's other runs "
                             f"({max(gpus)}): no run names partition {part}")
            pool_gpu_s += node_s * max(gpus)
    by_attempt: dict[int, list[Event]] = {}
    intents: dict[int, list[tuple[str, dict[str, object]]]] = {}
    for e in sorted(events, key=lambda e: (e.ts, e.id)):
        if e.attempt_id is None:
            continue
        if e.kind == Kind.ATTEMPT_STEP_RELAUNCH:
            by_attempt.setdefault(e.attempt_id, []).append(e)
        elif e.kind in (Kind.ATTEMPT_INTENT, Kind.SPARES_USED):
            intents.setdefault(e.attempt_id, []).append((e.kind, e.data))
    alloc_gpu_s = sum(_in_allocation_gpu_s(r, by_attempt, since, until) for r in spare_runs)
    relaunches = sum(1 for evs in by_attempt.values() for e in evs if since <= e.ts < until)
    plain: list[float] = []
    pooled: list[float] = []
    for r in runs:
        for a in r.attempts:
            if a.start is None or not since <= a.start < until:
                continue
            wait = max(0.0, (a.start - a.created_at).total_seconds())
            if pooled_reservation(intents.get(a.id, [])) is not None:
                pooled.append(wait)
            else:
                plain.append(wait)
    baseline = median(plain) if plain else None
    saved = None
    if baseline is not None:
        saved = sum(max(0.0, baseline - w) for w in pooled) + baseline * relaunches
    elif pooled or relaunches:
        notes.append("time saved unknown: no job of the daemon waited in the plain queue in the "
                     "window to compare with")
    return SpareFigures(
        pool_node_hours={p: s / 3600 for p, s in sorted(idle.items())},
        pool_gpu_hours=None if pool_gpu_s is None else pool_gpu_s / 3600,
        in_allocation_gpu_hours=alloc_gpu_s / 3600, pool_recoveries=len(pooled),
        relaunches=relaunches, baseline_queue_s=baseline, saved_s=saved, notes=tuple(notes))
