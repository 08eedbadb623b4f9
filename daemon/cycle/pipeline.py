"""The poll cycle, in one direction: observe -> classify/decide -> act -> record.

One :meth:`PollCycle.run_once`:

1. **act on intents left over**: attempts recorded SUBMITTING whose ``sbatch`` a
   crash or an outage interrupted are resolved by their tag (adopted, or submitted
   once the grace for a late sbatch is over);
2. **observe** the cluster once (:class:`~b300.cycle.view.ClusterObserver`: one
   sinfo, one squeue, sacct only for ended jobs) into a :class:`ClusterView`;
3. **track** (:class:`~b300.cycle.track.AttemptTracker`): what the view means for
   each tracked attempt (pure, :func:`~b300.cycle.observe.observe_attempt`), written
   in one transaction; the recorded changes come back;
4. **reconcile** (level-triggered: what is recorded and not yet done is decided again
   every cycle, so a crash between the tracker's commit and an action loses nothing):
   a job Slurm requeued itself is kept off the nodes that failed it and those are
   drained (:class:`~b300.cycle.requeues.RequeueReconciler`, from the
   ``attempt.requeued`` record the tracker wrote with the state change); a member of
   an elastic run that Slurm reports DOWN or FAIL is handled as a dead member
   (:class:`~b300.elastic.reported.ReportedDeaths`: drained, an agent on a spare); running
   attempts' progress is read and judged
   (:class:`~b300.training.health_step.TrainingWatch`: loss spikes, NaN, throughput,
   stragglers, stalled checkpoint writes; an ended attempt's files are read a last
   time); running attempts whose training stopped advancing are cancelled
   (:class:`~b300.recovery.hangs.HangWatch`); runs whose attempt ended without completing are classified (pure,
   :func:`~b300.recovery.classify.classify_end`) and acted on: drains and a
   resubmission from the newest verified checkpoint (:class:`Recoverer`).

Every step reads the same view; none asks Slurm for the cluster again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from ..errors import SlurmError
from ..interfaces import SlurmClient, Store
from ..model import Attempt, AttemptState, NodeRecord, RunState
from ..recovery.hangs import HangWatch
from ..recovery.recoverer import Recoverer
from ..safety.faults import crashpoint
from ..spares.pools import SparePools
from ..training.health_step import TrainingWatch
from .requeues import RequeueReconciler
from .run_actions import RunActions
from .track import AttemptTracker
from .view import ClusterObserver

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]


@dataclass(slots=True)
class CycleReport:
    """What one poll cycle did; the benchmarks and ``b300d --once`` print it."""

    tracked: int = 0
    changed: int = 0
    slurm_calls: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class PollCycle:
    """The pipeline's parts, run in order. Not thread-safe: the daemon runs it under
    its action lock."""

    def __init__(
        self,
        *,
        store: Store,
        slurm: SlurmClient,
        actions: RunActions,
        observer: ClusterObserver,
        tracker: AttemptTracker,
        clock: Clock,
        recoverer: Recoverer | None = None,
        hangs: HangWatch | None = None,
        training: TrainingWatch | None = None,
        spares: SparePools | None = None,
        requeues: RequeueReconciler | None = None,
        triage: Callable[[], object] | None = None,
        elastic: Callable[[Mapping[str, NodeRecord]], int] | None = None,
    ) -> None:
        self._requeues = requeues
        self._elastic = elastic   # b300.elastic.reported.ReportedDeaths.reconcile
        self._spares = spares
        self._triage = triage   # b300.triage.slurm.NodeTriage.upkeep
        self._store = store
        self._slurm = slurm
        self._actions = actions
        self._observer = observer
        self.tracker = tracker
        self._clock = clock
        self._recoverer = recoverer
        self._hangs = hangs
        self._training = training

    def run_once(self) -> CycleReport:
        """One cycle. Raises SlurmError if the controller could not be asked at all."""
        cpu0, wall0 = time.process_time(), time.monotonic()
        calls0 = _calls(self._slurm)
        report = CycleReport()
        for attempt in self._store.active_attempts():
            if attempt.state is AttemptState.SUBMITTING:
                with structlog.contextvars.bound_contextvars(run=attempt.run_id, attempt=attempt.number):
                    try:
                        self._actions.resolve_intent(attempt)
                    except SlurmError as exc:
                        report.errors.append(f"resolve {attempt.tag}: {exc}")
        tracked = [a for a in self._store.active_attempts() if a.slurm_job_id is not None]
        report.tracked = len(tracked)
        view = self._observer.gather([a.slurm_job_id for a in tracked if a.slurm_job_id is not None],
                                     self._clock())
        report.errors += view.errors
        changes = self.tracker.apply(tracked, view)
        report.changed += len(changes)
        if any(c.requeued for c in changes):
            crashpoint("requeue_recorded")
        if self._training is not None:
            # Before recovery: an ended attempt's last lines (its exit intent) are read first:
            # those that ended this cycle, and (level-triggered) every ended attempt recovery
            # has not classified yet, in case a crash came between their end and this read.
            with _watch_guard("training", report):
                for c in changes:
                    if c.after.state.is_terminal and not c.before.state.is_terminal:
                        self._training.finish(c.after)
                for attempt in self._unclassified_ends():
                    self._training.finish(attempt)
                self._training.check(self._store.active_attempts())
        try:
            if self._requeues is not None:
                report.changed += self._requeues.reconcile(view.nodes)
            if self._elastic is not None and view.nodes_error is None:
                # Elastic members Slurm reports dead (not on a stale node view).
                report.changed += self._elastic(view.nodes)
            if self._hangs is not None:
                with _watch_guard("hangs", report):
                    self._hangs.check(self._store.active_attempts())
            if self._recoverer is not None:
                report.changed += self._recoverer.recover_all(view)
        except SlurmError as exc:
            report.errors.append(f"recovery: {exc}")
        if self._spares is not None:
            # After recovery: a job just placed in a pool is counted, its nodes refilled.
            try:
                self._spares.upkeep()
            except SlurmError as exc:
                report.errors.append(f"spares: {exc}")
        if self._triage is not None:
            # Last: drained nodes checked on the node, returned or kept out (b300.triage).
            try:
                with _watch_guard("triage", report):
                    self._triage()
            except SlurmError as exc:
                report.errors.append(f"triage: {exc}")
        report.slurm_calls = _calls(self._slurm) - calls0
        report.cpu_s = time.process_time() - cpu0
        report.wall_s = time.monotonic() - wall0
        return report


    def _unclassified_ends(self) -> list[Attempt]:
        """The last attempts of RECOVERING runs that ended and are not classified yet."""
        if self._recoverer is None:
            return []
        found = []
        for run in self._store.list_runs([RunState.RECOVERING]):
            last = self._store.attempts(run.id)[-1:]
            if last and last[0].state.is_terminal and not last[0].outcome:
                found.append(last[0])
        return found


@contextlib.contextmanager
def _watch_guard(name: str, report: CycleReport) -> Iterator[None]:
    """A watcher's failure (training health, hangs) is logged and reported, and the cycle goes on:
    recovery must not wait for an observer. Slurm errors go to the cycle's own handling."""
    try:
        yield
    except SlurmError:
        raise
    except Exception as exc:  # isolate the observer: recovery goes on
        log.exception("cycle.watcher_failed", watcher=name)
        report.errors.append(f"{name}: {type(exc).__name__}: {exc}")


def _calls(slurm: SlurmClient) -> int:
    """Slurm requests so far (both backends count them)."""
    return sum(slurm.call_counts().values())
