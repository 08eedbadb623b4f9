"""The daemon's timed jobs, in one table, and the one way to put them on the scheduler.

Every job b300d runs on a clock is a row of :data:`SCHEDULE`: its id in APScheduler, what
it does, where its timing comes from, and when it is placed. The features say what to run
and how often (an :class:`Every` or :class:`At`, built from the current config); the
daemon places every ``start`` row in one call (:func:`start`, which refuses a missing or
unknown row), and a reload or a drill changes one row through :func:`place`. Ids not in
the table are refused, so the table is the whole list (``tests/unit/test_schedule_table.py``
compares it with what the scheduler holds after start). Every job runs one instance at a
time and a late run is coalesced into one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.base import BaseTrigger


@dataclass(frozen=True, slots=True)
class TimedJob:
    id: str
    what: str
    timing: str  # where its interval or time comes from
    placed: str = "start"  # "start": when the daemon becomes active (off: its feature is off);
    #                        "drill": while a drill is open; "sighup": once per SIGHUP


SCHEDULE: tuple[TimedJob, ...] = (
    TimedJob("poll", "the poll cycle: observe Slurm, track attempts, reconcile, recover",
             "[daemon] poll_interval; also woken at once by a node-down trigger, a dead node or b300ctl"),
    TimedJob("liveness", "one round of host-level checks of the nodes in use", "[liveness] interval_s"),
    TimedJob("checkpoints", "list, fingerprint and verify the runs' checkpoints; the schedule enforcer",
             "[checkpoints] check_interval"),
    TimedJob("checkpoint-upkeep", "prune and replicate checkpoints", "[checkpoints] maintain_interval"),
    TimedJob("drift", "scan the nodes for version drift", "[drift] interval (none: on demand only)"),
    TimedJob("alerts", "deliver the alerts of new events", "[alerts] scan_interval"),
    TimedJob("weekly-report", "mail the weekly report", "[report] day and hour, in [report] timezone"),
    TimedJob("weekly-report-catch-up", "send a weekly report a failure or a stop left unsent",
             "every 10 minutes"),
    TimedJob("drill", "measure an open failure drill", "every 0.5 s while a drill is open", placed="drill"),
    TimedJob("reload", "reload the config", "once, on SIGHUP", placed="sighup"),
)
IDS = frozenset(j.id for j in SCHEDULE)
#: The rows :func:`start` places (each given, or None when its feature is off).
AT_START = tuple(j.id for j in SCHEDULE if j.placed == "start")


@dataclass(frozen=True, slots=True)
class Every:
    """Run ``func`` every ``seconds`` (the first time at ``first``, or after one interval)."""

    func: Callable[[], Any]
    seconds: float
    first: datetime | None = None


@dataclass(frozen=True, slots=True)
class At:
    """Run ``func`` on ``trigger`` (a cron time); a run missed by up to ``misfire_grace_s`` still runs."""

    func: Callable[[], Any]
    trigger: BaseTrigger
    misfire_grace_s: int


#: What a feature asks for one row: how to run it, or None (off: the job is taken away).
Job = Every | At | None


def start(scheduler: BaseScheduler, jobs: Mapping[str, Job]) -> None:
    """Place every ``start`` row of the table, in the table's order; ``jobs`` must name each
    one (None: off) and nothing else."""
    missing = [i for i in AT_START if i not in jobs]
    extra = sorted(set(jobs) - set(AT_START))
    if missing or extra:
        raise ValueError(f"the daemon's start schedule does not match b300.scheduling.table.SCHEDULE: "
                         f"missing {missing}, not start rows {extra}")
    place(scheduler, {i: jobs[i] for i in AT_START})


def place(scheduler: BaseScheduler, jobs: Mapping[str, Job]) -> None:
    """Put each named row on the scheduler as asked (replacing it), or take it off (None)."""
    for job_id, job in jobs.items():
        if job is None:
            drop(scheduler, job_id)
        elif isinstance(job, Every):
            every(scheduler, job_id, job.func, job.seconds, first=job.first)
        else:
            at(scheduler, job_id, job.func, job.trigger, misfire_grace_s=job.misfire_grace_s)


def _known(job_id: str) -> str:
    if job_id not in IDS:
        raise ValueError(f"timed job {job_id!r} is not in b300.scheduling.table.SCHEDULE")
    return job_id


def every(scheduler: BaseScheduler, job_id: str, func: Callable[[], Any], seconds: float, *,
          first: datetime | None = None) -> None:
    """Run ``func`` every ``seconds`` (the first time at ``first``, or after one interval)."""
    extra: dict[str, Any] = {} if first is None else {"next_run_time": first}
    scheduler.add_job(func, "interval", id=_known(job_id), seconds=seconds, max_instances=1, coalesce=True,
                      replace_existing=True, **extra)


def at(scheduler: BaseScheduler, job_id: str, func: Callable[[], Any], trigger: BaseTrigger, *,
       misfire_grace_s: int) -> None:
    """Run ``func`` on ``trigger`` (a cron time); a run missed by up to ``misfire_grace_s`` still runs."""
    scheduler.add_job(func, trigger, id=_known(job_id), max_instances=1, coalesce=True,
                      misfire_grace_time=misfire_grace_s, replace_existing=True)


def once(scheduler: BaseScheduler, job_id: str, func: Callable[[], Any]) -> None:
    """Run ``func`` once, now."""
    scheduler.add_job(func, id=_known(job_id), replace_existing=True)


def drop(scheduler: BaseScheduler, job_id: str) -> None:
    """Take the job off the scheduler if it is on it."""
    if scheduler.get_job(_known(job_id)) is not None:
        scheduler.remove_job(job_id)
