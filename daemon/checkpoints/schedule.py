"""The checkpoint schedule: is a running run's newest complete checkpoint too old?

:func:`schedule_status` is pure: given what a layout listed, the spec's interval
and the attempt's start, it says how old the newest checkpoint is and whether it
is overdue, beside the Young/Daly interval (``sqrt(2 * save_time * MTBF)``) that
loses least for the measured save time and the observed failure rate.
:class:`CheckpointWatcher` runs it for every running run and, when configured,
asks an overdue job to checkpoint now with a signal to its batch step
(``scancel --signal=USR1 --batch JOB``), at most once per interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog

from ..errors import B300Error
from ..interfaces import CheckpointLayout, SlurmClient
from ..model import Attempt, AttemptState, CheckpointInfo, Run
from ..spec import JobSpec, parse_spec

log = structlog.get_logger(__name__)

#: Attempt outcomes/states that count as a failure of the machines (for the MTBF).
_INFRA_STATES = frozenset({AttemptState.NODE_FAIL, AttemptState.BOOT_FAIL})
_INFRA_OUTCOMES = frozenset({"INFRA", "HANG"})


@dataclass(frozen=True, slots=True)
class Alert:
    """Something a person should know, raised by a check (the daemon logs and notifies)."""

    kind: str
    run_id: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScheduleStatus:
    run_id: str
    interval_s: float
    age_s: float
    overdue: bool
    newest: CheckpointInfo | None
    optimal_interval_s: float | None = None


def young_daly_interval(save_time_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that loses least: ``sqrt(2 * save_time * MTBF)`` (Young, Daly)."""
    if save_time_s <= 0 or mtbf_s <= 0:
        raise ValueError("save time and MTBF must be positive")
    return math.sqrt(2.0 * save_time_s * mtbf_s)


def observed_mtbf(attempts: Iterable[Attempt], now: datetime) -> float | None:
    """Seconds of attempt run time per infrastructure failure, ``None`` before the first failure."""
    running = 0.0
    failures = 0
    for a in attempts:
        if a.start is not None:
            running += max(0.0, ((a.end or now) - a.start).total_seconds())
        if a.state in _INFRA_STATES or a.outcome in _INFRA_OUTCOMES:
            failures += 1
    return running / failures if failures and running > 0 else None


def schedule_status(
    run_id: str,
    checkpoints: Sequence[CheckpointInfo],
    interval_s: float,
    running_since: datetime,
    now: datetime,
    *,
    save_time_s: float | None = None,
    mtbf_s: float | None = None,
) -> ScheduleStatus:
    """How old the run's newest complete checkpoint is, counted from when the attempt started
    if that is later (a job that just started has had no chance to save yet)."""
    complete = [c for c in checkpoints if c.complete]
    newest = max(complete, key=lambda c: (c.mtime, c.step)) if complete else None
    since = max(newest.mtime, running_since) if newest else running_since
    age = (now - since).total_seconds()
    optimal = (
        young_daly_interval(save_time_s, mtbf_s) if save_time_s and mtbf_s and save_time_s > 0 else None
    )
    return ScheduleStatus(run_id, interval_s, age, age > interval_s, newest, optimal)


class CheckpointWatcher:
    """Checks every running run's checkpoint schedule; signals overdue jobs when told to.

    ``signal`` (e.g. ``"USR1"``) is sent to the batch step of an overdue job
    at most once per interval; ``None`` only alerts. ``save_time_s`` is the
    measured save time per run id (for the Young/Daly figure); the MTBF comes
    from the attempts passed in. Holds only the times it last signalled.
    """

    def __init__(
        self,
        slurm: SlurmClient,
        layout_for: Callable[[str], CheckpointLayout],
        *,
        signal: str | None = "USR1",
        save_time_s: Callable[[str], float | None] = lambda run_id: None,
    ) -> None:
        self._slurm = slurm
        self._layout_for = layout_for
        self._signal = signal
        self._save_time_s = save_time_s
        self._signalled: dict[str, datetime] = {}

    def check(self, runs_with_attempts: Sequence[tuple[Run, Sequence[Attempt]]], now: datetime) -> list[Alert]:
        """One ``checkpoint.overdue`` alert per running run whose newest checkpoint is too old."""
        every_attempt = [a for _, attempts in runs_with_attempts for a in attempts]
        mtbf = observed_mtbf(every_attempt, now)
        alerts: list[Alert] = []
        for run, attempts in runs_with_attempts:
            running = [a for a in attempts if a.state == AttemptState.RUNNING and a.slurm_job_id]
            if not running:
                self._signalled.pop(run.id, None)
                continue
            attempt = running[-1]
            try:
                spec = parse_spec(run.spec_toml, where=f"run {run.id}")
            except B300Error as exc:
                log.warning("checkpoint.bad_spec", run=run.id, error=str(exc))
                continue
            alert = self._check_one(run, spec, attempt, now, mtbf)
            if alert is not None:
                alerts.append(alert)
        return alerts

    def _check_one(
        self, run: Run, spec: JobSpec, attempt: Attempt, now: datetime, mtbf: float | None
    ) -> Alert | None:
        policy = spec.checkpoint
        if policy.dir is None:
            return None
        found = self._layout_for(policy.layout).list_checkpoints(policy.dir)
        status = schedule_status(run.id, found, policy.interval_s, attempt.start or attempt.updated_at, now,
                                 save_time_s=self._save_time_s(run.id), mtbf_s=mtbf)
        if not status.overdue:
            self._signalled.pop(run.id, None)
            return None
        signalled = False
        last = self._signalled.get(run.id)
        if self._signal and attempt.slurm_job_id and (
            last is None or now - last >= timedelta(seconds=policy.interval_s)
        ):
            try:
                self._slurm.cancel(attempt.slurm_job_id, signal=self._signal, batch_only=True)
                self._signalled[run.id] = now
                signalled = True
            except B300Error as exc:
                log.warning("checkpoint.signal_failed", run=run.id, job_id=attempt.slurm_job_id, error=str(exc))
        newest = status.newest
        optimal = status.optimal_interval_s
        message = (
            f"run {run.id}: newest complete checkpoint is {status.age_s / 60:.0f} min old"
            f" (interval {policy.interval_s / 60:.0f} min"
            + (f", Young/Daly optimum {optimal / 60:.0f} min" if optimal else "")
            + ")" + (f"; sent {self._signal} to job {attempt.slurm_job_id}" if signalled else "")
        )
        return Alert(
            kind="checkpoint.overdue",
            run_id=run.id,
            message=message,
            data={
                "age_s": round(status.age_s, 1),
                "interval_s": policy.interval_s,
                "optimal_interval_s": round(optimal, 1) if optimal else None,
                "newest": newest.path if newest else None,
                "newest_step": newest.step if newest else None,
                "job_id": attempt.slurm_job_id,
                "signalled": signalled,
            },
        )

