"""The weekly report job: APScheduler CronTrigger in the cluster's time zone, sent at most once.

Before sending, a ``report.sending`` event with the week key is recorded, and
``report.sent`` after. A week with ``report.sent`` is never sent again; one
with ``report.sending`` but no ``report.sent`` (the daemon died while sending,
or the connection broke while the message was on the wire) is *not* resent
automatically -- the mail may have gone out -- and this is logged; ``b300ctl
report --out`` still makes it.

A send that failed before the message could have arrived (the SMTP server
down or refusing) is recorded as ``report.failed`` with ``retry: true``; a
catch-up job every ``retry_s`` sends such a week again until it goes through,
and also sends a week the daemon missed (it was down at the scheduled time)
within a day of its end.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import structlog
from apscheduler.triggers.cron import CronTrigger

from ..config.ops import ReportConfig
from ..errors import B300Error
from ..events import REPORT_DELIVERY, Kind
from ..interfaces import NewEvent, Store
from ..model import Event
from ..payloads import ReportDelivery
from ..scheduling import table as timed
from .collect import collect_report
from .compute import Window, week_key
from .mail import report_message, send_mail

log = structlog.get_logger(__name__)
JOB_ID = "weekly-report"
RETRY_JOB_ID = "weekly-report-catch-up"
CATCH_UP_FOR = timedelta(days=1)


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


def send_weekly_report(store: Store, cfg: ReportConfig, now: datetime,
                       fence: Callable[[str], None] = lambda _action: None) -> str:
    """Send the report of the week ending at the last scheduled time; returns what happened:
    ``sent``, ``already-sent``, ``unconfirmed`` (intent without confirmation: not resent) or ``failed``."""
    assert cfg.smtp is not None
    window = report_window(now, cfg)
    week = week_key(window)
    seen = _week_events(store, week)
    if any(e.kind == Kind.REPORT_SENT for e in seen):
        log.info("report.already_sent", week=week)
        return "already-sent"
    if seen and not _retryable(seen):
        log.warning("report.unconfirmed", week=week,
                    why="a send was started but never confirmed; not resending (it may have arrived)")
        return "unconfirmed"
    report = collect_report(store, window, now)
    msg = report_message(report, cfg.smtp.sender, cfg.to, week=week)
    fence(f"mail the report of {week}")  # b300.ha.fence: raises unless this daemon is active
    store.append_events([NewEvent(Kind.REPORT_SENDING, data={"week": week, "to": list(cfg.to)})], now)
    try:
        send_mail(cfg.smtp, msg)
    except B300Error as exc:
        retry = not getattr(exc, "maybe_delivered", False)
        log.error("report.failed", week=week, error=str(exc), retry=retry)
        store.append_events([NewEvent(Kind.REPORT_FAILED, data={"week": week, "error": str(exc),
                                                             "retry": retry})], now)
        return "failed"
    store.append_events([NewEvent(Kind.REPORT_SENT, data={"week": week, "to": list(cfg.to),
                                                       "message_id": msg["Message-ID"]})], now)
    log.info("report.sent", week=week, to=list(cfg.to))
    return "sent"


def _week_events(store: Store, week: str) -> list[Event]:
    kinds = list(REPORT_DELIVERY)
    return [e for e in store.events(kinds=kinds) if ReportDelivery.of(e).week == week]


def _retryable(seen: list[Event]) -> bool:
    """The week's last event is a failure that cannot have delivered the mail."""
    last = max(seen, key=lambda e: e.id)
    return last.kind == Kind.REPORT_FAILED and ReportDelivery.of(last).retry


def catch_up_weekly_report(store: Store, cfg: ReportConfig, now: datetime,
                           fence: Callable[[str], None] = lambda _action: None) -> str:
    """Send the current week's report again after a refused send, or when the daemon
    missed its time (within a day of the week's end); ``nothing-to-do`` otherwise."""
    window = report_window(now, cfg)
    seen = _week_events(store, week_key(window))
    if seen and not _retryable(seen):
        return "nothing-to-do"
    if not seen and now - window.until > CATCH_UP_FOR:
        return "nothing-to-do"
    return send_weekly_report(store, cfg, now, fence)


def report_jobs(store: Store, get_cfg: Callable[[], ReportConfig], clock: Callable[[], datetime], *,
                retry_s: float = 600.0,
                fence: Callable[[str], None] = lambda _action: None) -> dict[str, timed.Job]:
    """The weekly report's rows of the schedule from the current [report] config (both None,
    i.e. taken off, when it is disabled)."""
    cfg = get_cfg()
    if not cfg.enabled:
        return {JOB_ID: None, RETRY_JOB_ID: None}

    def job() -> None:
        try:
            send_weekly_report(store, get_cfg(), clock(), fence)
        except Exception:  # a report must never take the daemon down
            log.exception("report.crashed")

    trigger = CronTrigger(day_of_week=cfg.day, hour=cfg.hour, minute=0, timezone=ZoneInfo(cfg.timezone))

    def catch_up() -> None:
        try:
            catch_up_weekly_report(store, get_cfg(), clock(), fence)
        except Exception:  # never take the daemon down; the next run tries again
            log.exception("report.catch_up_crashed")

    log.info("report.scheduled", day=cfg.day, hour=cfg.hour, timezone=cfg.timezone)
    return {JOB_ID: timed.At(job, trigger, misfire_grace_s=3600), RETRY_JOB_ID: timed.Every(catch_up, retry_s)}
