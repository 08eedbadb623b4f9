"""Submitting, resubmitting and cancelling runs: the daemon's acts on Slurm.

Every submission is an intent recorded before ``sbatch`` runs (an attempt in
state SUBMITTING whose Slurm job name is its unique tag) and confirmed after.
A crash between the two leaves the intent; :meth:`RunActions.resolve_intent`
then looks the tag up in Slurm and adopts the job it finds, or submits only
when Slurm has no such job and the grace period for a late sbatch is over.
So an attempt reaches Slurm at most once, and is never lost.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import structlog

from ..errors import SlurmError, UsageError
from ..events import EXCLUSIONS, Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Attempt, AttemptState, Run, RunState
from ..plugin_registry import PluginRegistry
from ..recovery.exclusions import Exclusion, ExclusionPlan, exclusions_of, plan_exclusions
from ..safety.faults import crashpoint
from ..slurm.parse import expand_nodes
from ..slurm.script import build_request
from ..spares.pool import pooled_reservation
from ..spec import JobSpec, spec_of
from .observe import run_state_for

if TYPE_CHECKING:
    from ..spares.pool import Placement

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]
_PATH_RE = re.compile(r"/[^\x00\n]{0,4000}")
# sbatch's words when the partition has fewer nodes left than the job asks for.
_NOT_AVAILABLE = "Requested node configuration is not available"


def attempt_exclusions(store: Store, attempt: Attempt) -> list[Exclusion]:
    """The attempt's exclusions with their causes, read from its latest ``attempt.intent``
    or ``attempt.excluded`` event (b300ctl status shows them too)."""
    found = [e for e in store.events(run_id=attempt.run_id,
                                     kinds=list(EXCLUSIONS))
             if e.attempt_id == attempt.id]
    return exclusions_of(found[-1].data if found else {}, attempt.excluded_nodes)


def new_run_id(name: str) -> str:
    """A run id from the spec's name: lower-case, safe in a Slurm job name, unique."""
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40] or "run"
    return f"{slug}-{secrets.token_hex(3)}"


class RunActions:
    """Submits, resubmits and cancels runs. Callers serialize calls (the daemon holds one
    action lock)."""

    def __init__(
        self,
        store: Store,
        slurm: SlurmClient,
        clock: Clock,
        *,
        submit_grace_s: float = 60.0,
        job_log_dir: str | None = None,
        avoid_nodes: Callable[[], Iterable[str]] | None = None,
        black_holes: Callable[[], Iterable[str]] | None = None,
        plugins: PluginRegistry | None = None,
        spares: Callable[..., Placement | None] | None = None,
        on_placed: Callable[[], None] | None = None,
    ) -> None:
        self._plugins = plugins
        # spares: the spare pool's placement of a resubmitted attempt (b300.spares), or None.
        self._spares = spares
        self._on_placed = on_placed or (lambda: None)
        # avoid_nodes: nodes no new attempt may land on (open drift findings);
        # black_holes: nodes inside the black-hole window now.
        self._avoid = avoid_nodes or (lambda: ())
        self._black_holes = black_holes or (lambda: ())
        self._store = store
        self._log_dir = job_log_dir
        self._slurm = slurm
        self._clock = clock
        self._grace = submit_grace_s

    def submit(self, spec: JobSpec, spec_toml: str, *, actor: str) -> Run:
        """Create a run and submit its first attempt."""
        now = self._clock()
        run_id = new_run_id(spec.name)
        self._store.create_run(run_id, spec.name, spec_toml, now, events=[
            NewEvent(Kind.RUN_CREATED, run_id=run_id, actor=actor, data={"name": spec.name}),
        ])
        plan = self.plan_exclusions(spec, [Exclusion(n, "drift", "open drift finding")
                                           for n in self._avoid()])
        attempt = self._store.begin_attempt(run_id, now, excluded_nodes=plan.nodes, events=[
            NewEvent(Kind.ATTEMPT_INTENT, run_id=run_id, actor=actor,
                     data={"number": 1, "exclude": plan.nodes,
                           "exclusions": [e.to_dict() for e in plan.kept]}),
            *self._plan_events(run_id, plan, actor),
        ])
        self._sbatch(attempt, spec)
        return self._store.get_run(run_id)

    def resubmit(
        self,
        run_id: str,
        *,
        actor: str,
        exclude: Sequence[str] = (),
        resume_from: str | None = None,
        force: bool = False,
        from_scratch: bool = False,
        failed: Sequence[Exclusion] = (),
        checked: Sequence[dict[str, object]] | None = None,
    ) -> Run:
        """Submit a new attempt of an existing run that has no active attempt.

        Without ``resume_from`` the attempt resumes from the run's newest verified
        checkpoint (none with ``from_scratch``); a given ``resume_from`` must be a
        complete checkpoint of the run's layout whose manifest, if any, verifies
        (``force`` skips that, never the check that it exists). The previous
        attempt's exclusions are kept while their cause holds, plus ``exclude``
        (an operator's) and ``failed`` (recovery's suspects); see
        :mod:`b300.recovery.exclusions`. ``checked``: the checkpoints the caller
        already looked at to choose ``resume_from`` (for the event).
        """
        run = self._store.get_run(run_id)
        attempts = self._store.attempts(run_id)
        active = [a for a in attempts if not a.state.is_terminal]
        if active:
            a = active[-1]
            raise UsageError(
                f"run {run_id} still has attempt {a.number} ({a.state.value}"
                f"{f', job {a.slurm_job_id}' if a.slurm_job_id else ''}); cancel it first"
            )
        nodes: list[str] = []
        for item in exclude:
            try:
                nodes.extend(expand_nodes(item))
            except ValueError as exc:
                raise UsageError(f"--exclude: {exc}") from None
        if resume_from is not None and from_scratch:
            raise UsageError("--from-checkpoint and --from-scratch exclude each other")
        if resume_from is not None and not _PATH_RE.fullmatch(resume_from):
            raise UsageError(f"--from-checkpoint must be an absolute path, got {resume_from!r}")
        spec = spec_of(run)
        from ..checkpoints.resume_point import check_resume_path, newest_verified

        if resume_from is not None and checked is None:
            check_resume_path(spec, run_id, resume_from, force=force, plugins=self._plugins)
            chosen = "forced" if force else "given, verified"
        elif resume_from is None and not from_scratch and checked is None:
            resume_from, checked = newest_verified(spec, self._plugins)
            chosen = "newest verified" if resume_from else "no complete checkpoint"
        else:
            chosen = "from scratch" if resume_from is None else "newest verified"
        previous = self.attempt_exclusions(attempts[-1]) if attempts else []
        plan = self.plan_exclusions(spec, [
            *[Exclusion(n, "operator", f"--exclude by {actor}") for n in nodes],
            *failed,
            *[Exclusion(n, "drift", "open drift finding") for n in self._avoid()],
            *previous,
        ], fresh=[e.node for e in failed])
        now = self._clock()
        data: dict[str, object] = {
            "resubmit": True, "exclude": plan.nodes, "resume_from": resume_from,
            "resume": chosen, "exclusions": [e.to_dict() for e in plan.kept]}
        if checked:
            data["checkpoints_checked"] = list(checked)
        # The spare pool (b300.spares): into its reservation when it holds every node the
        # job needs, outside the exclusions; else the queue, as without a pool.
        placement = self._spares(spec, plan.nodes) if self._spares is not None else None
        if placement is not None:
            data["reservation"] = placement.reservation
        attempt = self._store.begin_attempt(
            run_id, now, excluded_nodes=plan.nodes, resume_from=resume_from, events=[
                NewEvent(Kind.ATTEMPT_INTENT, run_id=run_id, actor=actor, data=data),
                *self._plan_events(run_id, plan, actor),
            ])
        self._set_run_state(run_id, attempt)
        self._sbatch(attempt, spec, placement=placement)
        return self._store.get_run(run_id)

    def plan_exclusions(self, spec: JobSpec, candidates: Sequence[Exclusion],
                        fresh: Sequence[str] = ()) -> ExclusionPlan:
        """The candidates whose cause holds now, trimmed so that the run still fits its
        partition. Only when there is anything to exclude: the nodes' states are read
        afresh (a drain done moments ago counts) and the partition's nodes (two sinfo)."""
        partition: list[str] | None = None
        if candidates:
            try:
                self._store.sync_nodes(self._slurm.nodes(), self._clock())
                partition = self._slurm.partition_nodes(spec.partition)
            except SlurmError as exc:
                log.warning("exclusions.nodes_unknown", error=str(exc))
        return plan_exclusions(
            candidates, nodes_now={n.name: n for n in self._store.list_nodes()},
            drift=set(self._avoid()), black_holes=set(self._black_holes()),
            partition_nodes=partition, needed=spec.nodes, fresh=fresh)

    def attempt_exclusions(self, attempt: Attempt) -> list[Exclusion]:
        """The attempt's exclusions with their causes (its latest ``attempt.intent`` or
        ``attempt.excluded`` event)."""
        return attempt_exclusions(self._store, attempt)

    @staticmethod
    def _plan_events(run_id: str, plan: ExclusionPlan, actor: str) -> list[NewEvent]:
        if not plan.dropped:
            return []
        return [NewEvent(
            Kind.EXCLUSIONS_TRIMMED if plan.trimmed else Kind.EXCLUSIONS_ENDED, run_id=run_id,
            actor=actor, data={"dropped": [{**e.to_dict(), "why": why} for e, why in plan.dropped],
                               "kept": plan.nodes})]

    def cancel(self, run_id: str, *, actor: str) -> Run:
        """Cancel the run's active attempt; the tracker records how it ends."""
        self._store.get_run(run_id)
        active = [a for a in self._store.attempts(run_id) if not a.state.is_terminal]
        if not active:
            raise UsageError(f"run {run_id} has no active attempt to cancel")
        attempt = active[-1]
        if attempt.slurm_job_id is None:
            attempt = self.resolve_intent(attempt, submit=False)
        now = self._clock()
        if attempt.slurm_job_id is None:
            # The intent never reached Slurm: give it up instead of submitting it.
            attempt = self._store.update_attempt(
                attempt.id, now, state=AttemptState.ABANDONED, reason=f"cancelled by {actor}",
                events=[NewEvent(Kind.ATTEMPT_ABANDONED, run_id=run_id, attempt_id=attempt.id,
                                 actor=actor, data={"why": "cancelled before it reached Slurm"})])
            self._store.set_run_state(run_id, RunState.CANCELLED, now, actor=actor)
            return self._store.get_run(run_id)
        self._slurm.cancel(attempt.slurm_job_id)
        self._store.append_events([NewEvent(
            Kind.RUN_CANCEL, run_id=run_id, attempt_id=attempt.id, actor=actor,
            data={"job_id": attempt.slurm_job_id})], now)
        return self._store.get_run(run_id)

    def resolve_intent(self, attempt: Attempt, *, submit: bool = True) -> Attempt:
        """Finish an attempt left SUBMITTING (a crash or a failed sbatch).

        If Slurm has a job with the attempt's tag, adopt it (cancelling any
        extra copies); if not and the grace period is over, submit it now.
        """
        since = attempt.created_at - timedelta(days=1)
        found = [o for o in self._slurm.find_by_name(attempt.tag, since=since)
                 if o.name == attempt.tag]
        now = self._clock()
        if found:
            keep = min(found, key=lambda o: o.job_id)
            for extra in found:
                if extra.job_id != keep.job_id and not extra.state.is_terminal:
                    self._slurm.cancel(extra.job_id)
                    self._store.append_events([NewEvent(
                        Kind.ATTEMPT_DUPLICATE_CANCELLED, run_id=attempt.run_id,
                        attempt_id=attempt.id, data={"job_id": extra.job_id})], now)
            confirmed = self._store.confirm_attempt(attempt.id, keep.job_id, now, events=[
                NewEvent(Kind.ATTEMPT_ADOPTED, run_id=attempt.run_id, attempt_id=attempt.id,
                         data={"job_id": keep.job_id, "slurm_state": keep.state.value})])
            self._set_run_state(attempt.run_id, confirmed)
            return confirmed
        age = (now - attempt.created_at).total_seconds()
        if not submit or age < self._grace:
            return attempt
        run = self._store.get_run(attempt.run_id)
        spec = spec_of(run)
        reservation = self._intended_reservation(attempt)
        if reservation is not None:
            reservation = self._still_fits(attempt, spec, reservation)
        return self._sbatch(attempt, spec, reservation=reservation)

    def _intended_reservation(self, attempt: Attempt) -> str | None:
        """The spare pool the attempt's intent chose (a crash between intent and sbatch, a
        deferred sbatch), unless Slurm refused the job there since."""
        return pooled_reservation(
            (e.kind, e.data) for e in self._store.events(
                run_id=attempt.run_id, kinds=[Kind.ATTEMPT_INTENT, Kind.SPARES_USED])
            if e.attempt_id == attempt.id)

    def _still_fits(self, attempt: Attempt, spec: JobSpec, reservation: str) -> str | None:
        """``reservation`` if the pool still holds the job's nodes now (beyond those promised
        to other attempts placed there), else None: the plain queue, recorded as
        ``spares.used`` with ``dropped`` (the nodes it was placed on may be taken since)."""
        placement = self._spares(spec, attempt.excluded_nodes, ignore=(attempt.id,)) \
            if self._spares is not None else None
        if placement is not None and placement.reservation == reservation:
            return reservation
        self._store.append_events([NewEvent(
            Kind.SPARES_USED, run_id=attempt.run_id, attempt_id=attempt.id,
            data={"reservation": reservation, "dropped": True,
                  "why": "the pool no longer holds the job's nodes: submitted to the queue"})],
            self._clock())
        return None

    def _sbatch(self, attempt: Attempt, spec: JobSpec, *, placement: Placement | None = None,
                reservation: str | None = None) -> Attempt:
        reservation = placement.reservation if placement is not None else reservation
        request = build_request(
            spec, run_id=attempt.run_id, attempt=attempt.number,
            resume_from=attempt.resume_from, excluded_nodes=attempt.excluded_nodes,
            log_dir=self._log_dir, reservation=reservation,
        )
        if self._log_dir and not spec.output:
            os.makedirs(self._log_dir, mode=0o750, exist_ok=True)
        crashpoint("before_sbatch", attempt.number)
        try:
            job_id = self._slurm.submit(request)
        except SlurmError as exc:
            now = self._clock()
            if exc.transient:
                # Slurm may or may not have it: leave the intent for resolve_intent.
                self._store.append_events([NewEvent(
                    Kind.ATTEMPT_SUBMIT_DEFERRED, run_id=attempt.run_id, attempt_id=attempt.id,
                    data={"error": str(exc)})], now)
                log.warning("attempt.submit_deferred", run=attempt.run_id, error=str(exc))
                return attempt
            if reservation and attempt.state is AttemptState.SUBMITTING:
                # The pool is never what makes a run fail: Slurm refused the job in the
                # reservation (gone, changed), so it goes to the queue as without a pool.
                self._store.append_events([NewEvent(
                    Kind.SPARES_USED, run_id=attempt.run_id, attempt_id=attempt.id,
                    data={"reservation": reservation, "refused": True, "error": str(exc)[:300]})], now)
                return self._sbatch(attempt, spec)
            if (_NOT_AVAILABLE in str(exc) and attempt.excluded_nodes
                    and attempt.state is AttemptState.SUBMITTING):
                # Exclusions must never be what makes a run fail: Slurm skips bad nodes
                # anyway, so submit without them and let the job wait for nodes instead.
                attempt = self._store.update_attempt(
                    attempt.id, now, excluded_nodes=(), events=[NewEvent(
                        Kind.EXCLUSIONS_TRIMMED, run_id=attempt.run_id, attempt_id=attempt.id,
                        data={"why": str(exc)[:300], "kept": [], "dropped": [
                            {"node": n, "why": "Slurm refused the job with it excluded"}
                            for n in attempt.excluded_nodes]})])
                return self._sbatch(attempt, spec)
            failed = self._store.update_attempt(
                attempt.id, now, state=AttemptState.ABANDONED, reason=str(exc)[:500],
                events=[NewEvent(Kind.ATTEMPT_SUBMIT_REFUSED, run_id=attempt.run_id,
                                 attempt_id=attempt.id, data={"error": str(exc)})])
            self._set_run_state(attempt.run_id, failed)
            raise
        crashpoint("after_sbatch", attempt.number)
        now = self._clock()
        events = [NewEvent(Kind.ATTEMPT_SUBMITTED, run_id=attempt.run_id, attempt_id=attempt.id,
                           data={"job_id": job_id, "job_name": request.job_name,
                                 "exclude": list(request.excluded_nodes)})]
        if reservation:
            used: dict[str, object] = {"reservation": reservation, "job_id": job_id,
                                       "needed": request.nodes}
            if placement is not None:
                used.update(partition=placement.partition, usable=list(placement.usable))
            events.append(NewEvent(Kind.SPARES_USED, run_id=attempt.run_id, attempt_id=attempt.id,
                                   data=used))
        confirmed = self._store.confirm_attempt(attempt.id, job_id, now, events=events)
        if reservation:
            self._on_placed()
        self._set_run_state(attempt.run_id, confirmed)
        log.info("attempt.submitted", run=attempt.run_id, attempt=attempt.number, job_id=job_id)
        return confirmed

    def _set_run_state(self, run_id: str, latest: Attempt) -> None:
        self._store.set_run_state(run_id, run_state_for(latest), self._clock())
