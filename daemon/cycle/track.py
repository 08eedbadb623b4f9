"""Record what a cycle's view means for every tracked attempt; return the changes.

The tracker does not act: it writes the cycle's attempt changes (and the run
states they bring) in ONE transaction and hands the recorded changes back to the
pipeline, which decides what follows (requeue handling, recovery). It also keeps
the health of Slurm accounting (sacct/slurmdbd): one warning and one event per
outage, one when it answers again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import structlog

from ..events import ACCOUNTING, Kind
from ..interfaces import AttemptUpdate, NewEvent, Store
from ..model import Attempt, AttemptState, JobObservation, NodeRecord, RunState
from ..recovery.classify import node_is_bad
from .observe import AttemptChange, observe_attempt, run_state_for
from .view import ClusterView

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]


@dataclass(frozen=True, slots=True)
class AccountingHealth:
    """Whether Slurm accounting (sacct/slurmdbd) answered when last asked."""

    up: bool = True
    failures_total: int = 0
    down_since: datetime | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class TrackedChange:
    """An attempt before and after this cycle recorded its change."""

    before: Attempt
    after: Attempt
    change: AttemptChange

    @property
    def requeued(self) -> bool:
        """Slurm requeued the running job itself (same job id, PENDING again)."""
        return self.before.state is AttemptState.RUNNING and self.after.state is AttemptState.PENDING


def ours(attempt: Attempt, obs: JobObservation | None) -> JobObservation | None:
    """``obs`` if it is the attempt's job: a job id Slurm reused (controller state
    lost, accounting rows of an earlier cluster) is another job; only our tag is ours."""
    return obs if obs is not None and obs.name == attempt.tag else None


class AttemptTracker:
    """Not thread-safe: the daemon runs its cycles under its action lock.

    ``recovering``: a run whose attempt ended without completing goes RECOVERING
    (recovery decides next); without recovery it goes FAILED/CANCELLED at once.
    """

    def __init__(self, store: Store, clock: Clock, *, accounting_grace_s: float = 60.0,
                 recovering: bool = True, withheld: Callable[..., None] | None = None) -> None:
        # Without recovery (observe mode, [recovery] enabled = false), an attempt that ended
        # badly is recorded through ``withheld`` as the recovery the daemon did not start.
        self._withheld = withheld
        self._store = store
        self._clock = clock
        self._grace = accounting_grace_s
        self._recovering = recovering
        # attempt id -> when the controller first said it ended without sacct knowing it
        self._terminal_since: dict[int, datetime] = {}
        self._accounting = AccountingHealth()
        self._accounting_seen = False  # whether accounting was asked since this daemon started

    @property
    def accounting(self) -> AccountingHealth:
        return self._accounting

    def apply(self, attempts: Sequence[Attempt], view: ClusterView) -> list[TrackedChange]:
        """Record what ``view`` says of ``attempts`` (those with a job id); the changes."""
        if view.accounting_error is not None:
            self._accounting_failed(view.accounting_error)
        elif view.asked_accounting:
            self._accounting_answered()
        now = view.taken_at
        changes = []
        for attempt in attempts:
            if attempt.slurm_job_id is None:
                continue
            change = self._observe(attempt, view.live.get(attempt.slurm_job_id),
                                   view.accounted.get(attempt.slurm_job_id), now)
            if change is not None:
                changes.append((attempt, change))
        return self._record(changes, now, view.nodes)

    def _observe(self, attempt: Attempt, live: JobObservation | None,
                 accounted: JobObservation | None, now: datetime) -> AttemptChange | None:
        live, accounted = ours(attempt, live), ours(attempt, accounted)
        if live is not None and live.state.is_terminal and (
            accounted is None or not accounted.state.is_terminal
        ):
            self._terminal_since.setdefault(attempt.id, now)
        return observe_attempt(
            attempt, live, accounted, terminal_since=self._terminal_since.get(attempt.id),
            now=now, accounting_grace_s=self._grace,
        )

    def _record(self, changes: list[tuple[Attempt, AttemptChange]], now: datetime,
                nodes_now: Mapping[str, NodeRecord]) -> list[TrackedChange]:
        updates = []
        for attempt, change in changes:
            events = [change.event] if change.event else []
            if attempt.state is AttemptState.RUNNING and change.state is AttemptState.PENDING:
                events += self._requeue_events(attempt, nodes_now)
            state = run_state_for(replace(attempt, state=change.state))
            if (change.state.is_terminal and change.state is not AttemptState.COMPLETED
                    and self._recovering):
                state = RunState.RECOVERING
            updates.append(AttemptUpdate(
                attempt.id, state=change.state, nodes=change.nodes, reason=change.reason,
                exit_code=change.exit_code, signal=change.signal, start=change.start,
                end=change.end, events=events, run_state=state))
        done = self._store.update_attempts(updates, now)
        tracked = []
        for (attempt, change), updated in zip(changes, done, strict=True):
            if updated.state.is_terminal:
                self._terminal_since.pop(attempt.id, None)
            if change.event is not None:
                log.info("attempt.changed", run=attempt.run_id, job_id=attempt.slurm_job_id,
                         state=updated.state.value, nodes=",".join(updated.nodes))
            tracked.append(TrackedChange(attempt, updated, change))
            if (self._withheld is not None and not self._recovering and updated.state.is_terminal
                    and updated.state not in (AttemptState.COMPLETED, AttemptState.CANCELLED)):
                self._withheld("resubmit", attempt.run_id, now, run_id=attempt.run_id,
                               detail=f"attempt {attempt.number} (job {attempt.slurm_job_id}) ended "
                                      f"{updated.state.value} on {','.join(updated.nodes) or '-'}: "
                                      "recovery would classify it, drain its bad nodes and resubmit")
        return tracked

    def _requeue_events(self, attempt: Attempt, nodes_now: Mapping[str, NodeRecord]) -> list[NewEvent]:
        """Slurm requeued the running job itself: the record that :mod:`b300.cycle.requeues`
        acts on (the nodes it showed bad now, and with recovery on their strikes), written in
        the same transaction as the state change so that no crash can lose it."""
        bad = [n for n in attempt.nodes if node_is_bad(nodes_now.get(n))]
        log.warning("attempt.requeued", run=attempt.run_id, job_id=attempt.slurm_job_id, suspects=bad)
        events = [NewEvent(Kind.ATTEMPT_REQUEUED, run_id=attempt.run_id, attempt_id=attempt.id,
                           data={"job_id": attempt.slurm_job_id, "nodes": list(attempt.nodes),
                                 "suspects": bad})]
        if self._recovering:
            events += [NewEvent(Kind.NODE_FAILED, run_id=attempt.run_id, attempt_id=attempt.id, node=n,
                                data={"job_id": attempt.slurm_job_id, "outcome": "REQUEUED"}) for n in bad]
        return events

    def _accounting_failed(self, error_text: str) -> None:
        """Count the failure; warn (log and event) once per outage, not once per cycle."""
        acc = self._accounting
        self._accounting_seen = True
        error = " ".join(error_text.split())[:300]
        if not acc.up:
            self._accounting = AccountingHealth(False, acc.failures_total + 1, acc.down_since, error)
            return
        now = self._clock()
        last = self._store.events(kinds=list(ACCOUNTING))[-1:]
        if last and last[0].kind == Kind.ACCOUNTING_UNAVAILABLE:
            since = last[0].ts  # the outage began before this daemon started
        else:
            since = now
            self._store.append_events([NewEvent(Kind.ACCOUNTING_UNAVAILABLE, data={"error": error})], now)
        log.warning(Kind.ACCOUNTING_UNAVAILABLE.value, error=error, since=since.isoformat(),
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
            if not last or last[0].kind != Kind.ACCOUNTING_UNAVAILABLE:
                return
            acc = AccountingHealth(False, acc.failures_total, last[0].ts)
        now = self._clock()
        down_for = (now - acc.down_since).total_seconds() if acc.down_since else None
        self._store.append_events([NewEvent(Kind.ACCOUNTING_RESTORED, data={"down_for_s": down_for})], now)
        log.info(Kind.ACCOUNTING_RESTORED.value, down_for_s=down_for, failures=acc.failures_total)
        self._accounting = AccountingHealth(True, acc.failures_total)
