"""Slurm's own requeues, reconciled every cycle (level-triggered).

When Slurm requeues a running job itself (``--requeue`` and a node failure: same job
id, PENDING again), the tracker records ``attempt.requeued`` with the nodes Slurm
showed bad at that moment (and their strikes) in the same transaction as the state
change. What must follow is derived from the record, not from the change:

- each suspect node drained (done when a ``node.drained`` of that attempt names it,
  or Slurm shows it drained by the daemon). Suspects are the nodes Slurm showed bad
  when the requeue was seen and, for ``settle_s`` after it, any node of the job that
  Slurm shows bad later (Slurm may requeue a job a moment before its node shows DOWN);
  each is recorded as a ``node.failed`` strike before it is drained;
- while the job is still pending, its excluded nodes updated so that it restarts away
  from them (done when an ``attempt.excluded`` of that attempt follows the requeue).

:func:`requeue_todo` is the pure part: what is not done yet. :class:`RequeueReconciler`
asks it for every recorded requeue each cycle and carries out the rest, so a daemon
killed between the tracker's commit and the drain (or between the drain and the
exclusion) finishes the work on the next cycle after its restart, once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime

import structlog

from ..errors import SlurmError
from ..events import Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Attempt, AttemptState, Event, NodeRecord
from ..payloads import AttemptRequeued, NodeStrike
from ..recovery.classify import node_is_bad
from ..recovery.exclusions import Exclusion
from ..safety.faults import crashpoint
from ..spec import spec_of
from .node_actions import NodeActions, drained_by_us
from .run_actions import RunActions

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]


@dataclass(frozen=True, slots=True)
class RequeueTodo:
    """What a recorded requeue still needs: late suspects to record (their strikes), nodes
    to drain, whether to update the exclusions; ``settling`` while late suspects may come."""

    requeue_id: int
    attempt_id: int
    strike: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    exclude: bool = False
    settling: bool = False

    @property
    def done(self) -> bool:
        return not (self.strike or self.drain or self.exclude or self.settling)


def requeue_todo(requeue: Event, attempt: Attempt | None, *, struck: Collection[str], drained: Collection[str],
                 excluded_after: Collection[int], nodes_now: Mapping[str, NodeRecord], now: datetime,
                 settle_s: float) -> RequeueTodo:
    """What is left of ``requeue`` (an ``attempt.requeued`` event) for ``attempt`` (its
    attempt now; None if gone).

    ``struck``: the nodes recorded as this requeue's suspects (``node.failed`` with outcome
    REQUEUED); ``drained``: the nodes recorded drained for the attempt; ``excluded_after``:
    ids of the attempt's ``attempt.excluded`` events. For ``settle_s`` after the requeue, a
    node of the job that Slurm shows bad now is a late suspect (Slurm may requeue the job
    a moment before its node shows DOWN)."""
    aid = requeue.attempt_id or 0
    settling = (now - requeue.ts).total_seconds() <= settle_s
    requeued = AttemptRequeued.of(requeue)
    nodes = list(requeued.nodes)
    strike = tuple(n for n in nodes if settling and n not in struck and node_is_bad(nodes_now.get(n)))
    suspects = [*struck, *strike]
    drain = tuple(n for n in suspects if n not in drained and not drained_by_us(nodes_now.get(n)))
    exclude = (bool(suspects) and attempt is not None and attempt.state is AttemptState.PENDING
               and attempt.slurm_job_id == requeued.job_id
               and not any(i > requeue.id for i in excluded_after))
    return RequeueTodo(requeue.id, aid, strike, drain, exclude, settling)


class RequeueReconciler:
    """Carries out what :func:`requeue_todo` says, every cycle. A cursor (in memory) skips
    the requeues found done; after a restart every recorded requeue is looked at once."""

    def __init__(self, store: Store, slurm: SlurmClient, actions: RunActions, clock: Clock,
                 settle_s: float = 60.0) -> None:
        self._store = store
        self._slurm = slurm
        self._actions = actions
        self._nodes = NodeActions(store, slurm, clock)
        self._clock = clock
        self._settle_s = settle_s
        self._done_through = 0  # every requeue event with an id <= this is done

    def reconcile(self, nodes_now: Mapping[str, NodeRecord]) -> int:
        """Act on every recorded requeue not done yet; how many actions were taken.
        A SlurmError defers that requeue's rest to the next cycle."""
        taken = 0
        now = self._clock()
        all_done = True
        for req in self._store.events(kinds=[Kind.ATTEMPT_REQUEUED], after_id=self._done_through):
            if req.attempt_id is None or req.run_id is None:
                continue
            attempt = next((a for a in self._store.attempts(req.run_id) if a.id == req.attempt_id), None)
            mine = [e for e in self._store.events(run_id=req.run_id, after_id=req.id - 1, kinds=[
                Kind.NODE_DRAINED, Kind.ATTEMPT_EXCLUDED, Kind.NODE_FAILED, Kind.ATTEMPT_REQUEUED])
                    if e.attempt_id == req.attempt_id]
            later = [e.id for e in mine if e.kind == Kind.ATTEMPT_REQUEUED and e.id > req.id]
            until = later[0] if later else None  # the attempt's next requeue starts its own record
            struck = {e.node for e in mine if e.kind == Kind.NODE_FAILED and e.node
                      and NodeStrike.of(e).outcome == "REQUEUED" and (until is None or e.id < until)}
            todo = requeue_todo(req, attempt, struck=struck, nodes_now=nodes_now, now=now,
                                settle_s=self._settle_s,
                                drained={e.node for e in mine if e.kind == Kind.NODE_DRAINED and e.node},
                                excluded_after=[e.id for e in mine if e.kind == Kind.ATTEMPT_EXCLUDED])
            if todo.done:
                if all_done:
                    self._done_through = req.id
                continue
            all_done = False
            with structlog.contextvars.bound_contextvars(run=req.run_id, job_id=AttemptRequeued.of(req).job_id):
                try:
                    taken += self._carry_out(req, attempt, todo, sorted({*struck, *todo.strike}), nodes_now)
                except SlurmError as exc:
                    # Deferred: decided again next cycle (the job may have started meanwhile:
                    # then there is nothing left to exclude).
                    log.warning("requeue.deferred", error=str(exc))
        return taken

    def _carry_out(self, req: Event, attempt: Attempt | None, todo: RequeueTodo, suspects: list[str],
                   nodes_now: Mapping[str, NodeRecord]) -> int:
        taken = 0
        job_id = AttemptRequeued.of(req).job_id
        number = attempt.number if attempt is not None else "?"
        if todo.strike:
            log.warning("requeue.late_suspects", nodes=list(todo.strike))
            self._store.append_events([NewEvent(Kind.NODE_FAILED, run_id=req.run_id, attempt_id=req.attempt_id,
                                                node=n, data={"job_id": job_id, "outcome": "REQUEUED"})
                                       for n in todo.strike], self._clock())
        for node in todo.drain:
            rec = nodes_now.get(node)
            reason = (f"b300: run {req.run_id} job {job_id} requeued by Slurm"
                      f"{' (' + rec.state.lower() + ': ' + rec.reason + ')' if rec and rec.reason else ''}")
            self._nodes.drain(node, reason, run_id=req.run_id, attempt_id=req.attempt_id, nodes_now=nodes_now)
            taken += 1
            crashpoint("requeue_drained")
        if todo.exclude and attempt is not None and attempt.slurm_job_id is not None:
            failed = [Exclusion(n, "failed", f"failed attempt {number} (job {job_id}, requeued by Slurm)")
                      for n in suspects]
            spec = spec_of(self._store.get_run(attempt.run_id))
            plan = self._actions.plan_exclusions(spec, [*failed, *self._actions.attempt_exclusions(attempt)],
                                                 fresh=suspects)
            if plan.nodes != sorted(attempt.excluded_nodes):
                self._slurm.exclude_nodes(attempt.slurm_job_id, plan.nodes)
                taken += 1
            # Recorded even when nothing changed: the exclusion is decided, not asked again.
            self._store.update_attempt(attempt.id, self._clock(), excluded_nodes=plan.nodes, events=[
                NewEvent(Kind.ATTEMPT_EXCLUDED, run_id=attempt.run_id, attempt_id=attempt.id,
                         data={"exclude": plan.nodes, "exclusions": [e.to_dict() for e in plan.kept]})])
        return taken
