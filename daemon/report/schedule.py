"""The weekly report job: APScheduler CronTrigger in the cluster's time zone, sent at most once.

Before sending, a ``report.sending`` event with the week key is recorded, and
``report.sent`` after. A week with ``report.sent`` is never sent again; one
with ``report.sending`` but no ``report.sent`` (the daemon died while sending,
or the SMTP server failed mid-way) is *not* resent automatically -- the mail
may have gone out -- and this is logged; ``b300ctl report --out`` still makes it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import structlog
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.cron import CronTrigger

from ..errors import B300Error
from ..interfaces import NewEvent, Store
from ..ops_config import ReportConfig
from .collect import collect_report
from .compute import Window, week_key
from .mail import report_message, send_mail

log = structlog.get_logger(__name__)
JOB_ID = "weekly-report"


def report_window(now: datetime, cfg: ReportConfig) -> Window:
    """The week that ended at the last scheduled time (day/hour in the cluster's zone) at or before now."""
    tz = ZoneInfo(cfg.timezone)
    local = now.astimezone(tz)
    days = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
    back = (local.weekday() - days.index(cfg.day)) % 7
    end_date = (local - timedelta(days=back)).date()
    end = datetime(end_date.year, end_date.month, end_date.day, cfg.hour, tzinfo=tz)
    if end > local:
        end_date -= timedelta(days=7)
        end = datetime(end_date.year, end_date.month, end_date.day, cfg.hour, tzinfo=tz)
    start_date = end_date - timedelta(days=7)
    start = datetime(start_date.year, start_date.month, start_date.day, cfg.hour, tzinfo=tz)
    return Window(start, end)


def send_weekly_report(store: Store, cfg: ReportConfig, now: datetime) -> str:
    """Send the report of the week ending at the last scheduled time; returns what happened:
    ``sent``, ``already-sent``, ``unconfirmed`` (intent without confirmation: not resent) or ``failed``."""
    assert cfg.smtp is not None
    window = report_window(now, cfg)
    week = week_key(window)
    seen = [e for e in store.events(kinds=["report.sending", "report.sent"]) if e.data.get("week") == week]
    if any(e.kind == "report.sent" for e in seen):
        log.info("report.already_sent", week=week)
        return "already-sent"
    if seen:
        log.warning("report.unconfirmed", week=week,
                    why="a send was started but never confirmed; not resending (it may have arrived)")
        return "unconfirmed"
    report = collect_report(store, window, now)
    msg = report_message(report, cfg.smtp.sender, cfg.to, week=week)
    store.append_events([NewEvent("report.sending", data={"week": week, "to": list(cfg.to)})], now)
    try:
        send_mail(cfg.smtp, msg)
    except B300Error as exc:
        log.error("report.failed", week=week, error=str(exc))
        store.append_events([NewEvent("report.failed", data={"week": week, "error": str(exc)})], now)
        return "failed"
    store.append_events([NewEvent("report.sent", data={"week": week, "to": list(cfg.to),
                                                       "message_id": msg["Message-ID"]})], now)
    log.info("report.sent", week=week, to=list(cfg.to))
    return "sent"


def schedule_report(scheduler: BaseScheduler, store: Store, get_cfg: Callable[[], ReportConfig],
                    clock: Callable[[], datetime]) -> None:
    """(Re)schedule the weekly report from the current [report] config; removes it when disabled."""
    cfg = get_cfg()
    if scheduler.get_job(JOB_ID) is not None:
        scheduler.remove_job(JOB_ID)
    if not cfg.enabled:
        return

    def job() -> None:
        try:
            send_weekly_report(store, get_cfg(), clock())
        except Exception:  # a report must never take the daemon down
            log.exception("report.crashed")

    trigger = CronTrigger(day_of_week=cfg.day, hour=cfg.hour, minute=0, timezone=ZoneInfo(cfg.timezone))
    scheduler.add_job(job, trigger, id=JOB_ID, max_instances=1, coalesce=True, misfire_grace_time=3600)
    log.info("report.scheduled", day=cfg.day, hour=cfg.hour, timezone=cfg.timezone)
