"""Submitting, resubmitting and cancelling runs: the daemon's acts on Slurm.

Every submission is an intent recorded before ``sbatch`` runs (an attempt in
state SUBMITTING whose Slurm job name is its unique tag) and confirmed after.
A crash between the two leaves the intent; :meth:`RunService.resolve_intent`
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

import structlog

from .errors import SlurmError, UsageError
from .faults import crashpoint
from .interfaces import NewEvent, SlurmClient, Store
from .model import Attempt, AttemptState, Run, RunState
from .slurm.parse import expand_nodes
from .slurm.script import build_request
from .spec import JobSpec, parse_spec
from .tracking import run_state_for

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]
_PATH_RE = re.compile(r"/[^\x00\n]{0,4000}")


def new_run_id(name: str) -> str:
    """A run id from the spec's name: lower-case, safe in a Slurm job name, unique."""
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40] or "run"
    return f"{slug}-{secrets.token_hex(3)}"


class RunService:
    """Acts on runs. Callers serialize calls (the daemon holds one action lock)."""

    def __init__(
        self,
        store: Store,
        slurm: SlurmClient,
        clock: Clock,
        *,
        submit_grace_s: float = 60.0,
        job_log_dir: str | None = None,
        avoid_nodes: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        # avoid_nodes: nodes no new attempt may land on (open drift findings).
        self._avoid = avoid_nodes or (lambda: ())
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
            NewEvent("run.created", run_id=run_id, actor=actor, data={"name": spec.name}),
        ])
        avoid = sorted(set(self._avoid()))
        attempt = self._store.begin_attempt(run_id, now, excluded_nodes=avoid, events=[
            NewEvent("attempt.intent", run_id=run_id, actor=actor,
                     data={"number": 1, "exclude": avoid}),
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
    ) -> Run:
        """Submit a new attempt of an existing run that has no active attempt."""
        run = self._store.get_run(run_id)
        active = [a for a in self._store.attempts(run_id) if not a.state.is_terminal]
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
        if resume_from is not None and not _PATH_RE.fullmatch(resume_from):
            raise UsageError(f"--from-checkpoint must be an absolute path, got {resume_from!r}")
        spec = parse_spec(run.spec_toml, where=f"run {run_id}")
        nodes.extend(self._avoid())
        now = self._clock()
        attempt = self._store.begin_attempt(
            run_id, now, excluded_nodes=sorted(set(nodes)), resume_from=resume_from, events=[
                NewEvent("attempt.intent", run_id=run_id, actor=actor, data={
                    "resubmit": True, "exclude": sorted(set(nodes)), "resume_from": resume_from,
                }),
            ])
        self._set_run_state(run_id, attempt)
        self._sbatch(attempt, spec)
        return self._store.get_run(run_id)

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
                events=[NewEvent("attempt.abandoned", run_id=run_id, attempt_id=attempt.id,
                                 actor=actor, data={"why": "cancelled before it reached Slurm"})])
            self._store.set_run_state(run_id, RunState.CANCELLED, now, events=[
                NewEvent("run.state", run_id=run_id, actor=actor, data={"to": "CANCELLED"})])
            return self._store.get_run(run_id)
        self._slurm.cancel(attempt.slurm_job_id)
        self._store.append_events([NewEvent(
            "run.cancel", run_id=run_id, attempt_id=attempt.id, actor=actor,
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
                        "attempt.duplicate_cancelled", run_id=attempt.run_id,
                        attempt_id=attempt.id, data={"job_id": extra.job_id})], now)
            confirmed = self._store.confirm_attempt(attempt.id, keep.job_id, now, events=[
                NewEvent("attempt.adopted", run_id=attempt.run_id, attempt_id=attempt.id,
                         data={"job_id": keep.job_id, "slurm_state": keep.state.value})])
            self._set_run_state(attempt.run_id, confirmed)
            return confirmed
        age = (now - attempt.created_at).total_seconds()
        if not submit or age < self._grace:
            return attempt
        run = self._store.get_run(attempt.run_id)
        spec = parse_spec(run.spec_toml, where=f"run {run.id}")
        return self._sbatch(attempt, spec)

    def _sbatch(self, attempt: Attempt, spec: JobSpec) -> Attempt:
        request = build_request(
            spec, run_id=attempt.run_id, attempt=attempt.number,
            resume_from=attempt.resume_from, excluded_nodes=attempt.excluded_nodes,
            log_dir=self._log_dir,
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
                    "attempt.submit_deferred", run_id=attempt.run_id, attempt_id=attempt.id,
                    data={"error": str(exc)})], now)
                log.warning("attempt.submit_deferred", run=attempt.run_id, error=str(exc))
                return attempt
            failed = self._store.update_attempt(
                attempt.id, now, state=AttemptState.ABANDONED, reason=str(exc)[:500],
                events=[NewEvent("attempt.submit_refused", run_id=attempt.run_id,
                                 attempt_id=attempt.id, data={"error": str(exc)})])
            self._set_run_state(attempt.run_id, failed)
            raise
        crashpoint("after_sbatch", attempt.number)
        now = self._clock()
        confirmed = self._store.confirm_attempt(attempt.id, job_id, now, events=[
            NewEvent("attempt.submitted", run_id=attempt.run_id, attempt_id=attempt.id,
                     data={"job_id": job_id, "job_name": request.job_name,
                           "exclude": list(request.excluded_nodes)})])
        self._set_run_state(attempt.run_id, confirmed)
        log.info("attempt.submitted", run=attempt.run_id, attempt=attempt.number, job_id=job_id)
        return confirmed

    def _set_run_state(self, run_id: str, latest: Attempt) -> None:
        state = run_state_for(latest)
        run = self._store.get_run(run_id)
        if run.state != state:
            self._store.set_run_state(run_id, state, self._clock(), events=[
                NewEvent("run.state", run_id=run_id,
                         data={"from": run.state.value, "to": state.value})])
