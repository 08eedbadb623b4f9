"""The daemon's timed jobs, in one table, and the one way to put them on the scheduler.

Every job b300d runs on a clock is a row of :data:`SCHEDULE`: its id in APScheduler, what
it does, and where its timing comes from. The features register their jobs through
:func:`every`, :func:`at` and :func:`once`, which refuse an id not in the table, so the
table is the whole list (``tests/unit/test_schedule_table.py`` checks that each row is registered somewhere).
Every job runs one instance at a time and a late run is coalesced into one.
"""

from __future__ import annotations

from collections.abc import Callable
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
    TimedJob("drill", "measure an open failure drill", "every 0.5 s while a drill is open"),
    TimedJob("reload", "reload the config", "once, on SIGHUP"),
)
IDS = frozenset(j.id for j in SCHEDULE)


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
