"""In-allocation restart (issue 15, the fast path): a run with ``spare_nodes`` loses a node
and trains again on a spare of the same Slurm job, in a new step, with no new job.

The job runs :mod:`b300.launcher` (the batch script); this is the daemon's half. When
:class:`~b300.recovery.node_loss.NodeLossWatch` confirms a node dead under a running
attempt of such a run, :meth:`StepRelauncher.on_dead` decides, under the daemon's action
lock:

- the node is not in the running step (an idle spare died): nothing to relaunch; Slurm
  takes it out of the job when it is set DOWN (``--no-kill``);
- a spare is left (the job's healthy nodes outside the plan's exclusions are at least
  ``nodes``) and the infrastructure retry budget allows one more: it records the intent
  (``node.failed`` strike and ``attempt.step_relaunch`` with the generation, the
  exclusions and the newest verified checkpoint, the same ``B300_RESUME_FROM`` a
  resubmission would get), then writes the plan (:func:`b300.launcher.plan.write_plan`,
  atomic, refused unless its generation is the next). The launcher ends the step and
  starts the new one;
- otherwise: today's path. The caller cancels the job (with ``--no-kill`` setting the node
  DOWN no longer ends it) and recovery resubmits from the newest checkpoint.

A crash between the intent and the plan is finished by :meth:`reconcile`, which every
liveness round also writes any planned generation missing on disk and records
``attempt.step_started`` once the launcher reports that generation's step running.
The daemon never starts or ends a step itself: the launcher is the only one that does,
so a daemon restarted in the middle of a relaunch cannot make a second copy.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from datetime import datetime

import structlog

from ..checkpoints.resume_point import newest_verified
from ..errors import SlurmError, SpecError
from ..events import Kind
from ..interfaces import NewEvent, Store
from ..launcher import plan as lf
from ..model import Attempt, AttemptState, Event
from ..payloads import StepRelaunch, StepStarted
from ..plugin_registry import PluginRegistry
from ..safety.faults import crashpoint
from ..slurm.parse import expand_nodes
from ..slurm.script import launch_dir
from ..spec import JobSpec, spec_of
from .classify import retries_used

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]


class Relaunch(enum.Enum):
    NOT_SPARE = "not a spare run"         # spare_nodes = 0: today's path
    NOT_IN_STEP = "not in the step"       # an idle spare died: nothing to restart
    ALREADY = "planned already"           # this node is in a plan (a repeat, or after a restart)
    RELAUNCHED = "relaunched"             # a new plan is written (or recorded, to be written)
    NO_SPARE = "no spare left"            # fall back: cancel the job, recovery resubmits


def relaunches(store: Store, run_id: str) -> list[Event]:
    """The run's recorded step relaunches (each one spends an infrastructure retry)."""
    return store.events(run_id=run_id, kinds=[Kind.ATTEMPT_STEP_RELAUNCH])


class StepRelauncher:
    def __init__(self, store: Store, clock: Clock, *, log_dir: str,
                 plugins: PluginRegistry | None = None) -> None:
        self._store = store
        self._clock = clock
        self._log_dir = log_dir
        self._plugins = plugins
        self._drift_seen: set[tuple[int, str, int]] = set()

    def folder(self, attempt: Attempt) -> str:
        return launch_dir(self._log_dir, attempt.run_id, attempt.number)

    # -- a node lost: confirmed dead, or drained for drift ---------------------------

    def on_dead(self, attempt: Attempt, node: str, now: datetime, *,
                cause: str = "dead") -> tuple[Relaunch, str]:
        """Decide (and record, and plan) for one running attempt on a dead node (``cause``
        "dead") or one drained for version drift ("drift"); the decision and why, in words."""
        if attempt.slurm_job_id is None:
            return Relaunch.NOT_SPARE, "no job id"
        try:
            spec = spec_of(self._store.get_run(attempt.run_id))
        except SpecError as exc:
            return Relaunch.NOT_SPARE, str(exc)
        if spec.elastic is not None:   # PyTorch Elastic (b300.elastic): an agent on a spare
            from ..elastic.effects import on_dead as elastic_on_dead

            outcome = elastic_on_dead(self._store, attempt, spec, node, now, folder=self.folder(attempt))
            return {"fallback": Relaunch.NO_SPARE, "kept": Relaunch.RELAUNCHED}.get(
                outcome, Relaunch.NOT_IN_STEP), f"elastic: {outcome}"
        if not spec.spare_nodes:
            return Relaunch.NOT_SPARE, "spare_nodes = 0"
        job_id, folder = attempt.slurm_job_id, self.folder(attempt)
        intents = [e for e in relaunches(self._store, attempt.run_id) if e.attempt_id == attempt.id]
        if any(node in StepRelaunch.of(e).exclude for e in intents):
            self._finish_plans(attempt, intents)
            return Relaunch.ALREADY, "planned already"
        try:
            current = lf.read_plan(folder, job_id)
            status = lf.read_status(folder, job_id)
        except lf.PlanError as exc:
            log.warning("relaunch.unreadable", error=str(exc))
            current, status = None, None
        if current is not None and node in current.exclude:
            return Relaunch.ALREADY, "planned already"
        # The launcher's own node (Slurm's batch host: the allocation's first node) ends
        # the job with it; nothing in the job can take over.
        batch_host = (status.batch_host if status is not None and status.batch_host
                      else attempt.nodes[0] if attempt.nodes else "")
        if node == batch_host:
            return Relaunch.NO_SPARE, f"{node} runs the job's launcher (its batch host)"
        gen_now = max([current.generation if current else 0,
                       *(StepRelaunch.of(e).generation for e in intents)])
        if (status is not None and status.state == "running" and status.generation == gen_now
                and status.nodes and node not in _expand(status.nodes)):
            return Relaunch.NOT_IN_STEP, f"{node} is not in step {status.step_id} ({status.nodes})"
        # Nodes of the job drained for drift are no place for the new step either.
        drifted = set(self._store.drift.drained_nodes()) & set(attempt.nodes)
        exclude = sorted({*(current.exclude if current else ()),
                          *(n for e in intents for n in StepRelaunch.of(e).exclude), node, *drifted})
        healthy = [n for n in attempt.nodes if n not in exclude]
        if len(healthy) < spec.nodes:
            return Relaunch.NO_SPARE, (f"{len(healthy)} healthy node(s) left in job {job_id}, "
                                       f"the step needs {spec.nodes}")
        infra, _ = retries_used(self._store.attempts(attempt.run_id))
        used = infra + len(relaunches(self._store, attempt.run_id))
        if used + 1 > spec.retries.infra:
            return Relaunch.NO_SPARE, f"infrastructure retry budget spent ({spec.retries.infra})"
        return Relaunch.RELAUNCHED, self._plan(attempt, spec, node, exclude, gen_now, healthy, now,
                                               cause)

    def _plan(self, attempt: Attempt, spec: JobSpec, node: str, exclude: Sequence[str],
              gen_now: int, healthy: Sequence[str], now: datetime, cause: str) -> str:
        assert attempt.slurm_job_id is not None
        resume, checked = newest_verified(spec, self._plugins)
        generation = gen_now + 1
        data = {"job_id": attempt.slurm_job_id, "generation": generation, "exclude": list(exclude),
                "outcome": "INFRA", "resume_from": resume, "suspects": [node],
                "checkpoints_checked": checked, "spares_left": len(healthy) - spec.nodes,
                "cause": cause}
        # The intent first (as a resubmission's is): a crash before the plan is on disk is
        # finished by reconcile(); a dead node's strike counts for the black-hole rule as a
        # failure does (drift is no strike, as without spares).
        strikes = [] if cause == "drift" else [
            NewEvent(Kind.NODE_FAILED, run_id=attempt.run_id, attempt_id=attempt.id, node=node,
                     data={"job_id": attempt.slurm_job_id, "outcome": "INFRA"})]
        self._store.append_events([*strikes, NewEvent(
            Kind.ATTEMPT_STEP_RELAUNCH, run_id=attempt.run_id, attempt_id=attempt.id,
            actor="recovery", data=data)], now)
        crashpoint("relaunch_recorded")
        self._write(attempt, data)
        log.warning("relaunch.planned", generation=generation, exclude=list(exclude), cause=cause,
                    resume_from=resume, spares_left=len(healthy) - spec.nodes)
        return f"generation {generation}, resume {resume or 'from scratch'}"

    def _write(self, attempt: Attempt, data: dict[str, object]) -> bool:
        assert attempt.slurm_job_id is not None
        exclude = data.get("exclude")
        plan = lf.Plan(attempt.slurm_job_id, int(data["generation"]),  # type: ignore[call-overload]
                       tuple(str(n) for n in exclude) if isinstance(exclude, list) else (),
                       str(data.get("resume_from") or ""), f"node lost: {data.get('suspects')}")
        try:
            lf.write_plan(self.folder(attempt), plan)
        except lf.StalePlan:
            return True   # written before (a restart after the write): nothing to do
        except (OSError, lf.PlanError) as exc:
            log.warning("relaunch.plan_not_written", error=str(exc), generation=plan.generation)
            return False
        return True

    def _finish_plans(self, attempt: Attempt, intents: Sequence[Event]) -> None:
        """Write the newest recorded generation if the folder does not have it."""
        if not intents or attempt.slurm_job_id is None:
            return
        newest = max(intents, key=lambda e: StepRelaunch.of(e).generation)
        try:
            on_disk = lf.read_plan(self.folder(attempt), attempt.slurm_job_id)
        except lf.PlanError:
            on_disk = None
        generation = StepRelaunch.of(newest).generation
        behind = on_disk is None or on_disk.generation < generation
        if behind and self._write(attempt, newest.data):
            log.info("relaunch.plan_finished", generation=generation)

    # -- every round ------------------------------------------------------------------

    def _off_drift(self, running: Sequence[Attempt], now: datetime) -> None:
        """A node of a running spare step drained for drift (b300.drift): relaunch without it.
        With no spare left the step stays where it is, as a drift drain leaves a job without
        spares (it only keeps new jobs off the node)."""
        drifted = self._store.drift.drained_nodes()
        if not drifted:
            return
        for attempt in running:
            assert attempt.slurm_job_id is not None
            try:
                status = lf.read_status(self.folder(attempt), attempt.slurm_job_id)
            except lf.PlanError:
                continue
            if status is None or status.state != "running":
                continue
            for node in _expand(status.nodes):
                key = (attempt.id, node, status.generation)
                if node not in drifted or key in self._drift_seen:
                    continue
                decision, why = self.on_dead(attempt, node, now, cause="drift")
                if decision is not Relaunch.RELAUNCHED:
                    self._drift_seen.add(key)   # said once, not every round
                log.warning("relaunch.drift", node=node, decision=decision.value, why=why)

    def reconcile(self, now: datetime) -> None:
        """Finish planned generations missing on disk; record each started step once; move
        a step off a node drained for drift while it runs (when a spare is left)."""
        running = [a for a in self._store.active_attempts()
                   if a.state is AttemptState.RUNNING and a.slurm_job_id is not None]
        if not running:
            return
        self._off_drift(running, now)
        # One query a round for every running attempt (none older than the oldest of them).
        ids = {a.id for a in running}
        mine = [e for e in self._store.events(
                    kinds=[Kind.ATTEMPT_STEP_RELAUNCH, Kind.ATTEMPT_STEP_STARTED],
                    since=min(a.created_at for a in running))
                if e.attempt_id in ids]
        started = {(e.attempt_id, -1 if (g := StepStarted.of(e).generation) is None else g)
                   for e in mine if e.kind == Kind.ATTEMPT_STEP_STARTED}
        for attempt in running:
            assert attempt.slurm_job_id is not None
            intents = [e for e in mine
                       if e.kind == Kind.ATTEMPT_STEP_RELAUNCH and e.attempt_id == attempt.id]
            if not intents:
                continue
            self._finish_plans(attempt, intents)
            try:
                status = lf.read_status(self.folder(attempt), attempt.slurm_job_id)
            except lf.PlanError as exc:
                log.warning("relaunch.unreadable", error=str(exc))
                continue
            if (status is None or status.state != "running" or status.generation < 1
                    or (attempt.id, status.generation) in started):
                continue
            intent = next((p for e in intents if (p := StepRelaunch.of(e)).generation == status.generation),
                          None)
            self._store.append_events([NewEvent(
                Kind.ATTEMPT_STEP_STARTED, run_id=attempt.run_id, attempt_id=attempt.id,
                data={"job_id": attempt.slurm_job_id, "generation": status.generation,
                      "step_id": status.step_id, "nodes": list(_expand(status.nodes)),
                      "exclude": list(intent.exclude) if intent else []})], now)
            log.info("relaunch.step_started", generation=status.generation, step=status.step_id,
                     nodes=status.nodes)


def _expand(nodes: str) -> tuple[str, ...]:
    try:
        return expand_nodes(nodes)
    except (SlurmError, ValueError):
        return ()
