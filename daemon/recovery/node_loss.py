"""Active failure localisation in the daemon: a dead node of a running job, found in seconds.

slurmctld decides a node is dead after ``SlurmdTimeout`` (300 s by default), and a
powered-off node closes no socket, so the surviving ranks of a job sit in a
collective until NCCL's timeout (10-30 min) while Slurm shows the job RUNNING.
:class:`NodeLossWatch` does not wait for either. Every ``[liveness] interval`` it
checks the slurmd of every node in use (:mod:`b300.liveness`: a TCP connect per
node in one batch; a suspect is confirmed by an independent SSH round trip), and
for a node confirmed dead it

1. records ``liveness.dead`` and, for each running attempt on it,
   ``attempt.node_lost`` with the evidence (before acting, so a crash in between
   leaves the cause on record);
2. drains the node with the evidence as its reason;
3. sets the node DOWN, so Slurm ends the attempt at once (NODE_FAIL; its surviving
   ranks would otherwise hang, and a cancelled job stays COMPLETING on a node that
   never answers until ``SlurmdTimeout``); if that fails, cancels the attempt. Then it
   wakes the poll cycle: recovery sees the attempt end with its node lost, classifies it
   as an infrastructure failure with that node as the suspect, and resubmits from the
   newest verified checkpoint without it. The drain set first stays when the node
   comes back (DOWN+DRAIN), until an operator or the drift scan resumes it.

   A run with ``spare_nodes`` and a spare left gets a new step in the same job instead
   (:mod:`b300.recovery.relaunch`); with none left its job is cancelled first (it runs
   ``--no-kill``: DOWN alone would not end it).

A job that failed with peer/NCCL evidence gets its nodes checked the same way:
recovery asks :meth:`node_health` instead of waiting blind for Slurm to name a node.
The probing runs outside the daemon's action lock; acting takes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import structlog

from ..cycle.node_actions import NodeActions
from ..errors import B300Error, SlurmError
from ..events import Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..liveness.machine import Health
from ..liveness.rounds import LivenessMonitor, RoundReport
from ..liveness.slurm_addr import targets_for
from ..liveness.verdicts import Decision, Target, Verdict
from ..model import Attempt, AttemptState, RunState
from .relaunch import Relaunch, StepRelauncher

if TYPE_CHECKING:
    from ..safety.mode import Withheld

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]
_EVENT_OF = {Verdict.SUSPECT: Kind.LIVENESS_SUSPECT, Verdict.CLEARED: Kind.LIVENESS_CLEARED,
             Verdict.DEAD: Kind.LIVENESS_DEAD, Verdict.RECOVERED: Kind.LIVENESS_RECOVERED}
_IN_USE = (AttemptState.RUNNING, AttemptState.COMPLETING, AttemptState.SUSPENDED)
_REASON_MAX = 200


class NodeLossWatch:
    """The liveness rounds of the running daemon (one object for its life)."""

    def __init__(self, store: Store, slurm: SlurmClient, monitor: LivenessMonitor, *,
                 lock: threading.Lock, clock: Clock, wake: Callable[[], None],
                 settle_s: float, relauncher: StepRelauncher | None = None, act: bool = True,
                 withheld: Withheld | None = None) -> None:
        """``act=False`` (observe mode, or [recovery] off): dead nodes are recorded and
        alerted (``liveness.*`` events), and what would have been done (drain, DOWN,
        cancel, relaunch) is recorded as withheld (``withheld``) instead of done."""
        self._act_on = act
        self._withheld = withheld
        self._relauncher = relauncher if act else None
        self._store = store
        self._slurm = slurm
        self._nodes = NodeActions(store, slurm, clock)
        self._monitor = monitor
        self._lock = lock
        self._clock = clock
        self._wake = wake
        self._settle = timedelta(seconds=settle_s)
        # An ongoing mass silence (b300.liveness.machine.mass_silence): its nodes, its start.
        self._partition: tuple[frozenset[str], datetime] | None = None
        self._targets: list[Target] = []
        self._targets_for: frozenset[str] = frozenset()
        self._addresses_failed_at: datetime | None = None

    def round(self) -> None:
        """One scheduled round; failures are logged, never raised into the scheduler."""
        try:
            self._round()
        except B300Error as exc:
            log.warning("liveness.round_failed", error=str(exc))
        except Exception:
            log.exception("liveness.round_crashed")

    def node_health(self, nodes: Sequence[str]) -> dict[str, str]:
        """For recovery: each of ``nodes`` as ``dead`` (confirmed), ``undecided`` (missing
        checks or suspect), ``alive``, or ``unknown`` (not watched: no verdict either way)."""
        states = self._monitor.states
        out = {}
        for n in nodes:
            s = states.get(n)
            if s is None:
                out[n] = "unknown"
            elif s.health is Health.DEAD:
                out[n] = "dead"
            elif s.health in (Health.MISSING, Health.SUSPECT):
                out[n] = "undecided"
            else:
                out[n] = "alive"
        return out

    def close(self) -> None:
        self._monitor.close()

    # -- one round -----------------------------------------------------------

    def _round(self) -> None:
        if self._relauncher is not None:
            with self._lock:
                self._relauncher.reconcile(self._clock())
        now = self._clock()
        running, nodes = self._nodes_in_use(now)
        targets = self._refresh_targets(nodes, now)
        report = self._monitor.round(targets, now)
        self._record(report, now)
        dead = [d for d in report.dead if d.node in nodes]
        if not dead:
            return
        if not self._act_on:
            self._withhold(dead, running, now)
            return
        with self._lock:
            for d in dead:
                self._act(d, [a for a in running if d.node in a.nodes], self._clock())
        self._wake()

    def _withhold(self, dead: list[Decision], running: list[Attempt], now: datetime) -> None:
        """Observe only: the node is left as it is; one withheld record per dead node."""
        for d in dead:
            jobs = [a.slurm_job_id for a in running if d.node in a.nodes]
            detail = f"would drain and set DOWN {d.node} (running jobs: {jobs or 'none'}): {d.evidence[:300]}"
            if self._withheld is not None:
                self._withheld("node_down", d.node, now, detail=detail, node=d.node)
            else:
                log.warning("liveness.action_withheld", node=d.node, detail=detail)

    def _nodes_in_use(self, now: datetime) -> tuple[list[Attempt], set[str]]:
        """Running attempts, and their nodes plus those of attempts that ended lately
        without completing (recovery may be asking about them)."""
        running = [a for a in self._store.active_attempts() if a.state in _IN_USE and a.nodes]
        nodes = {n for a in running for n in a.nodes}
        for run in self._store.list_runs([RunState.RECOVERING]):
            last = self._store.attempts(run.id)[-1:]
            if last and last[0].end is not None and now - last[0].end <= self._settle:
                nodes.update(last[0].nodes)
        return running, nodes

    def _refresh_targets(self, nodes: set[str], now: datetime) -> list[Target]:
        """Targets for ``nodes``: ``scontrol show node`` once per change of the set (and again
        a minute after it failed)."""
        key = frozenset(nodes)
        retry = self._addresses_failed_at is not None and \
            (now - self._addresses_failed_at).total_seconds() >= 60
        if key == self._targets_for and not retry:
            return self._targets
        if not nodes:
            self._targets, self._targets_for, self._addresses_failed_at = [], key, None
            return []
        try:
            addresses = self._slurm.node_addresses(sorted(nodes))
        except SlurmError as exc:
            log.warning("liveness.addresses_unknown", error=str(exc), nodes=len(nodes))
            self._addresses_failed_at = now
            self._targets_for = key
            # Keep checking what we knew; new nodes wait for the next try.
            self._targets = [t for t in self._targets if t.node in nodes]
            return self._targets
        targets, missing = targets_for(sorted(nodes), addresses)
        if missing:
            log.warning("liveness.not_checked", nodes=missing)
        self._targets, self._targets_for, self._addresses_failed_at = targets, key, None
        return targets

    def _record(self, report: RoundReport, now: datetime) -> None:
        events = [NewEvent(_EVENT_OF[d.verdict], node=d.node,
                           data={"evidence": d.evidence[:2000], "misses": d.misses})
                  for d in report.decisions if d.verdict in _EVENT_OF]
        if events:
            self._store.append_events(events, now)
        for d in report.decisions:
            (log.warning if d.verdict in (Verdict.DEAD, Verdict.SUSPECT) else log.info)(
                f"liveness.{d.verdict.value}", node=d.node, misses=d.misses, evidence=d.evidence[:300])
        if report.note:
            log.warning("liveness.round_not_counted", note=report.note)
        self._record_partition(report, now)

    def _record_partition(self, report: RoundReport, now: datetime) -> None:
        """One ``liveness.partition`` event when a mass silence begins (nothing is drained for
        it) and one ``liveness.partition_over`` when a round is counted again."""
        if report.uncounted and self._partition is None:
            self._partition = (frozenset(report.uncounted), now)
            self._store.append_events([NewEvent(Kind.LIVENESS_PARTITION, data={
                "nodes": list(report.uncounted), "checked": report.checked, "note": report.note})], now)
        elif report.uncounted and self._partition is not None:
            self._partition = (self._partition[0] | set(report.uncounted), self._partition[1])
        elif self._partition is not None and report.checked:
            nodes, since = self._partition
            self._partition = None
            self._store.append_events([NewEvent(Kind.LIVENESS_PARTITION_OVER, data={
                "nodes": sorted(nodes), "checked": report.checked,
                "lasted_s": round((now - since).total_seconds(), 1)})], now)
            log.warning("liveness.partition_over", nodes=len(nodes), lasted_s=(now - since).total_seconds())

    def _act(self, dead: Decision, attempts: list[Attempt], now: datetime) -> None:
        """Drain the dead node and cancel the attempts still running on it (or, for a run with
        a spare left in its allocation, plan a new step there: b300.recovery.relaunch)."""
        reason = f"b300: node dead (b300d checks): {dead.evidence}"[:_REASON_MAX]
        fall_back: list[Attempt] = []   # --no-kill jobs DOWN does not end: cancelled first
        for attempt in attempts:
            if attempt.slurm_job_id is None:
                continue
            with structlog.contextvars.bound_contextvars(run=attempt.run_id, attempt=attempt.number,
                                                         job_id=attempt.slurm_job_id):
                self._store.append_events([NewEvent(
                    Kind.ATTEMPT_NODE_LOST, run_id=attempt.run_id, attempt_id=attempt.id,
                    data={"job_id": attempt.slurm_job_id, "nodes": [dead.node],
                          "evidence": dead.evidence[:2000]})], now)
                self._drain_once(dead.node, reason, attempt, now)
                if self._relauncher is not None and self._relaunch(attempt, dead.node, now) \
                        is Relaunch.NO_SPARE:
                    fall_back.append(attempt)
        for attempt in fall_back:
            self._cancel(attempt, dead.node)
        if not attempts:
            self._drain_once(dead.node, reason, None, now)
        try:
            self._nodes.down(dead.node, reason)
        except SlurmError as exc:
            log.warning("liveness.down_failed", node=dead.node, error=str(exc),
                        action="cancelling its attempts instead")
            for attempt in attempts:
                self._cancel(attempt, dead.node)
        else:
            log.warning("liveness.node_down", node=dead.node, attempts=[a.slurm_job_id for a in attempts],
                        why="confirmed dead: Slurm ends its jobs now")

    def _relaunch(self, attempt: Attempt, node: str, now: datetime) -> Relaunch:
        """The spare decision for one attempt; a failure in it falls back to today's path."""
        assert self._relauncher is not None
        try:
            decision, why = self._relauncher.on_dead(attempt, node, now)
        except Exception:
            log.exception("liveness.relaunch_failed", node=node, action="cancelling the job instead")
            return Relaunch.NO_SPARE
        if decision is not Relaunch.NOT_SPARE:
            log.warning("liveness.spare_decision", node=node, decision=decision.value, why=why)
        return decision

    def _cancel(self, attempt: Attempt, node: str) -> None:
        if attempt.slurm_job_id is None:
            return
        try:
            self._slurm.cancel(attempt.slurm_job_id)
        except SlurmError as exc:
            # Recovery acts once Slurm ends the job; the cause is on record already.
            log.warning("liveness.cancel_failed", job_id=attempt.slurm_job_id, error=str(exc))
        else:
            log.warning("liveness.attempt_cancelled", node=node, job_id=attempt.slurm_job_id,
                        why="its node is dead; the surviving ranks would hang")

    def _drain_once(self, node: str, reason: str, attempt: Attempt | None, now: datetime) -> None:
        try:
            self._nodes.drain(node, reason, run_id=attempt.run_id if attempt else None,
                              attempt_id=attempt.id if attempt else None)
        except SlurmError as exc:
            log.warning("liveness.drain_failed", node=node, error=str(exc))


def node_lost(events: Mapping[str, object] | None) -> tuple[str, ...]:
    """The nodes named by an ``attempt.node_lost`` event's data."""
    nodes = (events or {}).get("nodes")
    return tuple(str(n) for n in nodes) if isinstance(nodes, list) else ()
