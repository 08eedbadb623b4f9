"""The daemon's operational side jobs: systemd watchdog, metrics, alerts, weekly report.

:class:`Operations` is built by the daemon and started with its scheduler;
each part is optional (configured or not) and none of them can stop the
poll cycle: their failures are logged.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import structlog
from apscheduler.schedulers.base import BaseScheduler

from .config import Config
from .health import Watchdog, watchdog_interval_s
from .report.schedule import schedule_report

if TYPE_CHECKING:
    from .service import Daemon

log = structlog.get_logger(__name__)


class Operations:
    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon
        self._watchdog: Watchdog | None = None
        self._scheduler: BaseScheduler | None = None

    def healthy(self) -> bool:
        """The scheduler runs and no poll cycle is stuck (Slurm calls time out long before)."""
        d = self._daemon
        stuck_after = max(300.0, 10 * d.config.slurm_timeout_s, 3 * d.config.poll_interval_s)
        return d.scheduler_running() and not d.health.stuck(stuck_after)

    def start(self, scheduler: BaseScheduler, notify: object) -> None:
        self._scheduler = scheduler
        d = self._daemon
        schedule_report(scheduler, d.store, lambda: d.config.report, d.clock)
        interval = watchdog_interval_s(os.environ.get("WATCHDOG_USEC"))
        if interval is not None and callable(notify):
            self._watchdog = Watchdog(interval, self.healthy, notify)
            self._watchdog.start()
            log.info("watchdog.started", every_s=round(interval, 3))

    def reconfigure(self, old: Config, new: Config) -> None:
        """A config reload: reschedule what depends on [report] and [alerts]."""
        d = self._daemon
        if old.report != new.report and self._scheduler is not None:
            schedule_report(self._scheduler, d.store, lambda: d.config.report, d.clock)

    def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
