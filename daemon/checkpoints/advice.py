"""A run's schedule as the operators see it: the configured interval, the newest checkpoint's
age, overdue or not, and the Young/Daly interval beside it with the inputs it used.

:func:`run_schedule` is pure (the same figures for ``b300ctl checkpoints``, ``b300ctl
status``, the weekly report and the metrics); :func:`stored_run_schedule` reads its inputs
from the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..interfaces import Store
from ..model import Attempt, AttemptState, CheckpointInfo, Run
from ..spec import JobSpec
from .cadence import (
    HISTORY,
    FailureHistory,
    YoungDaly,
    failure_history,
    format_span,
    schedule_status,
    young_daly,
)


@dataclass(frozen=True, slots=True)
class RunSchedule:
    """``age_s`` counts as the watcher does for a running attempt (from its start when it has
    no checkpoint yet, ``counted_from`` "start"); for a run not running it is the newest
    checkpoint's age, None without one."""

    run_id: str
    interval_s: float
    age_s: float | None
    counted_from: str | None
    overdue: bool
    newest_step: int | None
    signal: str | None
    signal_to: str
    young_daly: YoungDaly

    def to_dict(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s,
                "newest_age_s": None if self.age_s is None else round(self.age_s, 1),
                "counted_from": self.counted_from, "overdue": self.overdue, "newest_step": self.newest_step,
                "signal": self.signal, "signal_to": self.signal_to if self.signal else None,
                "young_daly": self.young_daly.to_dict()}

    def lines(self) -> list[str]:
        """What ``b300ctl`` prints: the state of the schedule, then the advice."""
        if self.age_s is None:
            age = "no checkpoint yet"
        elif self.counted_from == "start":
            age = f"no checkpoint yet in this attempt, {format_span(self.age_s)} since it started"
        else:
            age = f"newest checkpoint (step {self.newest_step}) {format_span(self.age_s)} old"
        state = "OVERDUE" if self.overdue else "on time"
        signal = (f"{self.signal} to {'the batch shell' if self.signal_to == 'batch' else 'all processes'}"
                  if self.signal else "none (the spec does not opt in)")
        return [f"schedule: every {format_span(self.interval_s)}; {age}; {state}; signal when late: {signal}",
                self.young_daly.describe()]


def run_schedule(run: Run, spec: JobSpec, checkpoints: Sequence[CheckpointInfo], attempts: Sequence[Attempt],
                 history: Sequence[Attempt], now: datetime, *,
                 failures: FailureHistory | None = None) -> RunSchedule | None:
    """The schedule figures of one run; None when its spec names no checkpoint dir.
    ``failures``: the run's :func:`failure_history` over ``history``, if already computed."""
    policy = spec.checkpoint
    if policy.dir is None:
        return None
    running = [a for a in attempts if a.state == AttemptState.RUNNING and a.start is not None]
    complete = [c for c in checkpoints if c.complete]
    newest = max(complete, key=lambda c: (c.mtime, c.step)) if complete else None
    age: float | None
    counted_from: str | None
    if running and not run.state.is_terminal:
        status = schedule_status(run.id, complete, policy.interval_s, running[-1].start or now, now)
        age, counted_from, overdue = status.age_s, status.counted_from, status.overdue
    else:
        age = (now - newest.mtime).total_seconds() if newest else None
        counted_from, overdue = ("checkpoint" if newest else None), False
    if failures is None:
        failures = failure_history(run.id, history, now)
    advice = young_daly(complete, failures, spec.nodes, policy.interval_s)
    return RunSchedule(run.id, policy.interval_s, age, counted_from, overdue,
                       newest.step if newest else None, policy.signal, policy.signal_to, advice)


def stored_checkpoints(store: Store, run_id: str) -> list[CheckpointInfo]:
    """The run's checkpoints as the daemon last listed them."""
    return [c.info for c in store.checkpoints.checkpoints(run_id)]


def stored_run_schedule(store: Store, run: Run, spec: JobSpec, now: datetime, *,
                        checkpoints: Sequence[CheckpointInfo] | None = None,
                        history: Sequence[Attempt] | None = None,
                        attempts: Sequence[Attempt] | None = None,
                        failures: FailureHistory | None = None) -> RunSchedule | None:
    """:func:`run_schedule` with its inputs read from the store (``checkpoints``: a fresh
    listing instead of the stored one; ``history``: the cluster's attempts, ``attempts``:
    the run's, ``failures``: the run's failure history, each if already read)."""
    if spec.checkpoint.dir is None:
        return None
    return run_schedule(run, spec,
                        stored_checkpoints(store, run.id) if checkpoints is None else checkpoints,
                        store.attempts(run.id) if attempts is None else attempts,
                        store.attempts_since(now - HISTORY) if history is None else history, now,
                        failures=failures)
