"""The poll cycle: observe every tracked job in one batch, record what changed.

One cycle costs one ``sinfo`` for the nodes, one ``squeue`` for all tracked
jobs, and one ``sacct`` only for the jobs that ended or left the controller,
however many jobs are tracked. Then recovery looks at what ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

import structlog

from .errors import SlurmError
from .events import ACCOUNTING, Kind
from .interfaces import AttemptUpdate, NewEvent, SlurmClient, Store
from .model import Attempt, AttemptState, JobObservation, RunState
from .recovery.service import RecoveryService
from .runs import RunService
from .tracking import AttemptChange, observe_attempt, run_state_for

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]


ACCOUNTING_DOWN = Kind.ACCOUNTING_UNAVAILABLE
ACCOUNTING_UP = Kind.ACCOUNTING_RESTORED


@dataclass(frozen=True, slots=True)
class AccountingHealth:
    """Whether Slurm accounting (sacct/slurmdbd) answered when last asked."""

    up: bool = True
    failures_total: int = 0
    down_since: datetime | None = None
    error: str = ""


@dataclass(slots=True)
class CycleReport:
    """What one poll cycle did; the benchmarks and ``--once`` print it."""

    tracked: int = 0
    changed: int = 0
    slurm_calls: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class JobTracker:
    """Runs poll cycles. Not thread-safe: the daemon calls it under its action lock."""

    def __init__(
        self,
        store: Store,
        slurm: SlurmClient,
        runs: RunService,
        clock: Clock,
        *,
        accounting_grace_s: float = 60.0,
        track_nodes: bool = True,
        recovery: RecoveryService | None = None,
    ) -> None:
        self._recovery = recovery
        self._store = store
        self._slurm = slurm
        self._runs = runs
        self._clock = clock
        self._grace = accounting_grace_s
        self._track_nodes = track_nodes
        # attempt id -> when the controller first said it ended without sacct knowing it
        self._terminal_since: dict[int, datetime] = {}
        self._accounting = AccountingHealth()
        self._accounting_seen = False  # whether accounting was asked since this daemon started

    def poll_once(self) -> CycleReport:
        """One cycle. Raises SlurmError if the controller could not be asked at all."""
        cpu0, wall0 = time.process_time(), time.monotonic()
        calls0 = sum(getattr(self._slurm, "calls", {}).values())
        report = CycleReport()
        # Nodes first: recovery judges an ended job by its nodes' state now.
        if self._track_nodes:
            try:
                self._store.sync_nodes(self._slurm.nodes(), self._clock())
            except SlurmError as exc:
                report.errors.append(f"sinfo: {exc}")
        active = self._store.active_attempts()
        for attempt in (a for a in active if a.state is AttemptState.SUBMITTING):
            try:
                self._runs.resolve_intent(attempt)
            except SlurmError as exc:
                report.errors.append(f"resolve {attempt.tag}: {exc}")
        tracked = {a.slurm_job_id: a for a in self._store.active_attempts()
                   if a.slurm_job_id is not None}
        report.tracked = len(tracked)
        if tracked:
            live = self._slurm.jobs(list(tracked))
            ended = [j for j in tracked if j not in live or live[j].state.is_terminal]
            accounted: dict[int, JobObservation] = {}
            if ended:
                try:
                    accounted = self._slurm.accounting(ended)
                except SlurmError as exc:
                    # slurmdbd down: what it would have said stays unknown this cycle.
                    report.errors.append(f"sacct: {exc}")
                    self._accounting_failed(exc)
                else:
                    self._accounting_answered()
            now = self._clock()
            changes = [(attempt, change) for job_id, attempt in tracked.items()
                       if (change := self._observe(attempt, live.get(job_id),
                                                   accounted.get(job_id), now)) is not None]
            report.changed += self._record(changes, now)
        if self._recovery is not None:
            try:
                self._recovery.check_hangs()
                report.changed += self._recovery.recover_all()
            except SlurmError as exc:
                report.errors.append(f"recovery: {exc}")
        report.slurm_calls = sum(getattr(self._slurm, "calls", {}).values()) - calls0
        report.cpu_s = time.process_time() - cpu0
        report.wall_s = time.monotonic() - wall0
        return report

    @property
    def accounting(self) -> AccountingHealth:
        return self._accounting

    def _accounting_failed(self, exc: SlurmError) -> None:
        """Count the failure; warn (log and event) once per outage, not once per cycle."""
        acc = self._accounting
        self._accounting_seen = True
        error = " ".join(str(exc).split())[:300]
        if not acc.up:
            self._accounting = AccountingHealth(False, acc.failures_total + 1, acc.down_since, error)
            return
        now = self._clock()
        last = self._store.events(kinds=list(ACCOUNTING))[-1:]
        if last and last[0].kind == ACCOUNTING_DOWN:
            since = last[0].ts  # the outage began before this daemon started
        else:
            since = now
            self._store.append_events([NewEvent(ACCOUNTING_DOWN, data={"error": error})], now)
        log.warning(ACCOUNTING_DOWN, error=error, since=since.isoformat(),
                    effect="ended jobs keep no exit code until slurmdbd answers")
        self._accounting = AccountingHealth(False, acc.failures_total + 1, since, error)

    def _accounting_answered(self) -> None:
        acc = self._accounting
        if acc.up and self._accounting_seen:
            return
        self._accounting_seen = True
        if acc.up:
            # First answer since start: close an outage an earlier daemon recorded.
            last = self._store.events(kinds=list(ACCOUNTING))[-1:]
            if not last or last[0].kind != ACCOUNTING_DOWN:
                return
            acc = AccountingHealth(False, acc.failures_total, last[0].ts)
        now = self._clock()
        down_for = (now - acc.down_since).total_seconds() if acc.down_since else None
        self._store.append_events([NewEvent(ACCOUNTING_UP, data={"down_for_s": down_for})], now)
        log.info(ACCOUNTING_UP, down_for_s=down_for, failures=acc.failures_total)
        self._accounting = AccountingHealth(True, acc.failures_total)

    def _observe(
        self, attempt: Attempt, live: JobObservation | None, accounted: JobObservation | None,
        now: datetime,
    ) -> AttemptChange | None:
        # A job id Slurm reused (controller state lost, or accounting rows from an
        # earlier cluster) is another job: only a record with our tag is ours.
        if live is not None and live.name != attempt.tag:
            live = None
        if accounted is not None and accounted.name != attempt.tag:
            accounted = None
        if live is not None and live.state.is_terminal and (
            accounted is None or not accounted.state.is_terminal
        ):
            self._terminal_since.setdefault(attempt.id, now)
        return observe_attempt(
            attempt, live, accounted, terminal_since=self._terminal_since.get(attempt.id),
            now=now, accounting_grace_s=self._grace,
        )

    def _record(self, changes: list[tuple[Attempt, AttemptChange]], now: datetime) -> int:
        """Write the cycle's changes in one transaction, then act on what they mean."""
        updates = []
        for attempt, change in changes:
            state = run_state_for(replace(attempt, state=change.state))
            if (change.state.is_terminal and change.state is not AttemptState.COMPLETED
                    and self._recovery is not None):
                state = RunState.RECOVERING
            updates.append(AttemptUpdate(
                attempt.id, state=change.state, nodes=change.nodes, reason=change.reason,
                exit_code=change.exit_code, signal=change.signal, start=change.start,
                end=change.end, events=[change.event] if change.event else (),
                run_state=state))
        done = self._store.update_attempts(updates, now)
        for (attempt, change), updated in zip(changes, done, strict=True):
            if updated.state.is_terminal:
                self._terminal_since.pop(attempt.id, None)
            if (attempt.state is AttemptState.RUNNING and updated.state is AttemptState.PENDING
                    and self._recovery is not None):
                # Slurm requeued the job itself: keep it, but off the nodes that failed it.
                self._recovery.on_requeued(attempt, updated)
            if change.event is not None:
                log.info("attempt.changed", run=attempt.run_id, job_id=attempt.slurm_job_id,
                         state=updated.state.value, nodes=",".join(updated.nodes))
        return len(changes)
