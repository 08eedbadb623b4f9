"""Members of an elastic run that Slurm itself reports dead, reconciled every poll cycle.

The daemon's liveness checks find a silent node in seconds (:mod:`b300.recovery.node_loss`);
Slurm finds it too, later or on its own (``SlurmdTimeout``, a node an operator or a health
check set DOWN, a node whose slurmd failed): the cycle's node view then shows it ``DOWN``
(``Not responding`` after ``SlurmdTimeout``) or ``FAIL``. For a node running an agent of
an elastic run that is a member death, handled as the liveness path handles one:
``attempt.node_lost`` with what Slurm says, the node drained with that reason, and
:func:`b300.elastic.effects.on_dead` (the member left; an agent on a spare of the
allocation, or shrink, or fall back to resubmission, as the spec says).

Level-triggered and idempotent: :func:`elastic_todo` (pure) derives what is left from the
record (the attempt's ``elastic.*`` and ``attempt.node_lost`` events, the plan on disk),
never from this cycle's changes. A member recorded as left is never decided again, so a
daemon restarted at any point (even ``kill -9``) starts no second agent for one death; a
plan the record holds but the job's folder lacks is written again; a job the record says
falls back and that still runs is cancelled (again).

Only Slurm's settled verdicts count: ``DOWN`` and ``FAIL`` (and ``NOT_RESPONDING`` where a
backend reports it as a state). A node only flagged not responding (``*``, before
``SlurmdTimeout``) is left to the liveness checks, and an idle spare that dies needs
nothing (it runs no agent).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import structlog

from ..cycle.node_actions import NodeActions, drained_by_us
from ..errors import SlurmError, SpecError
from ..events import Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Attempt, AttemptState, NodeRecord
from ..payloads import AttemptNodeLost
from ..slurm.script import launch_dir
from ..spec import JobSpec, spec_of
from . import host
from .effects import first_allocation, on_dead
from .members import JOINED, LEFT, members_now

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]
DEAD_STATES = frozenset({"DOWN", "FAIL", "NOT_RESPONDING"})
_REASON_MAX = 200


def slurm_says_dead(rec: NodeRecord | None) -> str | None:
    """What Slurm says of a node it holds dead (``DOWN``, ``FAIL``, ``NOT_RESPONDING``, or
    a reason ``Not responding``), in words; None for any other node."""
    if rec is None:
        return None
    words = set(rec.state.upper().replace("+", " ").split())
    if words & DEAD_STATES or "NOT RESPONDING" in rec.reason.upper():
        return f"{rec.state}{f' ({rec.reason})' if rec.reason else ''}"
    return None


@dataclass(frozen=True, slots=True)
class ReportedDeath:
    node: str
    said: str              # Slurm's state and reason
    record_lost: bool      # no attempt.node_lost names it yet
    drain: bool            # Slurm does not show it drained by b300


@dataclass(frozen=True, slots=True)
class ElasticTodo:
    """What one running elastic attempt still needs."""

    deaths: tuple[ReportedDeath, ...] = ()
    plan: tuple[str, ...] | None = None   # rewrite the job's plan with these nodes (None: it is fine)
    cancel: bool = False                  # the record says fall back and the job still runs

    @property
    def done(self) -> bool:
        return not self.deaths and self.plan is None and not self.cancel


def elastic_todo(spec: JobSpec, *, running: bool, allocation: Sequence[str],
                 history: Sequence[tuple[str, Mapping[str, object]]], lost: Collection[str],
                 nodes_now: Mapping[str, NodeRecord], plan_on_disk: Iterable[str]) -> ElasticTodo:
    """What is left for one attempt of an elastic run. ``allocation``: the job's nodes as
    first allocated (Slurm drops a DOWN node from a ``--no-kill`` job's list); ``history``:
    the attempt's ``elastic.*`` events as (kind, data), oldest first; ``lost``: the nodes
    its ``attempt.node_lost`` events name; ``plan_on_disk``: the nodes the job's
    ``elastic.json`` adds now."""
    if spec.elastic is None:
        return ElasticTodo()
    deaths = []
    for node in members_now(spec, allocation, history):
        said = slurm_says_dead(nodes_now.get(node))
        if said is not None:
            deaths.append(ReportedDeath(node, said, record_lost=node not in lost,
                                        drain=not drained_by_us(nodes_now.get(node))))
    joined = sorted({str(d.get("node")) for k, d in history if k == JOINED})
    plan = tuple(joined) if joined and not set(joined) <= set(plan_on_disk) else None
    cancel = running and any(k == LEFT and d.get("then") == "resubmit" for k, d in history)
    return ElasticTodo(tuple(deaths), plan, cancel)


class ReportedDeaths:
    """Carries out :func:`elastic_todo` for every running elastic attempt, each cycle (under
    the action lock, with the cycle's node view)."""

    def __init__(self, store: Store, slurm: SlurmClient, clock: Clock, *, log_dir: str) -> None:
        self._store = store
        self._slurm = slurm
        self._clock = clock
        self._log_dir = log_dir
        self._nodes = NodeActions(store, slurm, clock)
        self._specs: dict[str, JobSpec | None] = {}   # a run's spec never changes

    def _spec(self, run_id: str) -> JobSpec | None:
        if run_id not in self._specs:
            try:
                spec: JobSpec | None = spec_of(self._store.get_run(run_id))
            except SpecError:
                spec = None
            self._specs[run_id] = spec if spec is not None and spec.elastic is not None else None
        return self._specs[run_id]

    def reconcile(self, nodes_now: Mapping[str, NodeRecord]) -> int:
        """Act on what is left for each running elastic attempt; how many actions were taken.
        A SlurmError defers that attempt's rest to the next cycle."""
        taken = 0
        for attempt in self._store.active_attempts():
            if attempt.state is not AttemptState.RUNNING or attempt.slurm_job_id is None:
                continue
            spec = self._spec(attempt.run_id)
            if spec is None:
                continue
            with structlog.contextvars.bound_contextvars(run=attempt.run_id, attempt=attempt.number,
                                                         job_id=attempt.slurm_job_id):
                try:
                    taken += self._one(attempt, spec, nodes_now)
                except SlurmError as exc:
                    log.warning("elastic.deferred", error=str(exc))
        return taken

    def _one(self, attempt: Attempt, spec: JobSpec, nodes_now: Mapping[str, NodeRecord]) -> int:
        assert attempt.slurm_job_id is not None
        mine = [e for e in self._store.events(run_id=attempt.run_id, kinds=[
            Kind.ELASTIC_MEMBER_LEFT, Kind.ELASTIC_MEMBER_JOINED, Kind.ATTEMPT_NODE_LOST])
            if e.attempt_id == attempt.id]
        history = [(str(e.kind), e.data) for e in mine if e.kind != Kind.ATTEMPT_NODE_LOST]
        lost = {n for e in mine if e.kind == Kind.ATTEMPT_NODE_LOST for n in AttemptNodeLost.of(e).nodes}
        folder = launch_dir(self._log_dir, attempt.run_id, attempt.number)
        todo = elastic_todo(spec, running=True, allocation=first_allocation(self._store, attempt),
                            history=history, lost=lost, nodes_now=nodes_now,
                            plan_on_disk=host.read_plan(folder, attempt.slurm_job_id)[1])
        if todo.done:
            return 0
        taken = 0
        if todo.plan is not None:   # before any new death: on_dead adds to the recorded plan
            try:
                host.write_plan(folder, attempt.slurm_job_id, len(todo.plan), list(todo.plan))
                log.info("elastic.plan_rewritten", add=list(todo.plan))
                taken += 1
            except OSError as exc:
                log.warning("elastic.plan_not_written", error=str(exc))
        cancel = todo.cancel
        for death in todo.deaths:
            now = self._clock()
            evidence = f"Slurm reports {death.said}"
            log.warning("elastic.member_dead_in_slurm", node=death.node, said=death.said)
            if death.record_lost:
                self._store.append_events([NewEvent(
                    Kind.ATTEMPT_NODE_LOST, run_id=attempt.run_id, attempt_id=attempt.id,
                    data={"job_id": attempt.slurm_job_id, "nodes": [death.node],
                          "evidence": evidence[:2000]})], now)
            if death.drain:
                self._nodes.drain(death.node, f"b300: elastic member lost: {evidence}"[:_REASON_MAX],
                                  run_id=attempt.run_id, attempt_id=attempt.id, nodes_now=nodes_now)
            outcome = on_dead(self._store, attempt, spec, death.node, now, folder=folder, cause="slurm",
                              nodes_now=nodes_now)
            cancel = cancel or outcome == "fallback"
            taken += 1
        if cancel:
            self._slurm.cancel(attempt.slurm_job_id)
            log.warning("elastic.job_cancelled", why="the run falls back to resubmission")
            taken += 1
        return taken
