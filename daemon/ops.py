"""The daemon's operational side jobs: systemd watchdog, metrics, alerts, weekly report.

:class:`Operations` is built by the daemon and started with its scheduler;
each part is optional (configured or not) and none of them can stop the
poll cycle: their failures are logged.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

import structlog
from apscheduler.schedulers.base import BaseScheduler

from .alerts import AlertScanner
from .config import Config
from .errors import B300Error
from .health import Watchdog, watchdog_interval_s
from .metrics import MetricsServer, MetricsSnapshot, collect_metrics
from .report.schedule import schedule_report

if TYPE_CHECKING:
    from .service import Daemon

log = structlog.get_logger(__name__)


class Operations:
    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon
        self._watchdog: Watchdog | None = None
        self._scheduler: BaseScheduler | None = None
        self.metrics: MetricsServer | None = None
        self.alerts = AlertScanner(daemon.store, lambda: (daemon.config.alerts, daemon.config.report.smtp),
                                   daemon.clock, fence=daemon.fence.check)

    def healthy(self) -> bool:
        """The scheduler runs and no poll cycle is stuck (Slurm calls time out long before)."""
        d = self._daemon
        stuck_after = max(300.0, 10 * d.config.slurm_timeout_s, 3 * d.config.poll_interval_s)
        return d.scheduler_running() and not d.health.stuck(stuck_after)

    def start(self, scheduler: BaseScheduler, notify: object) -> None:
        self._scheduler = scheduler
        d = self._daemon
        schedule_report(scheduler, d.store, lambda: d.config.report, d.clock, fence=d.fence.check)
        try:
            self.alerts.prime()
        except B300Error as exc:
            log.error("alerts.not_primed", error=str(exc))
        self._schedule_alerts()
        if d.config.metrics.enabled:
            try:
                self.metrics = MetricsServer(d.config.metrics.host, d.config.metrics.port, self.snapshot)
            except OSError as exc:  # a taken port must not stop the daemon
                log.error("metrics.not_started", listen=f"{d.config.metrics.host}:{d.config.metrics.port}",
                          error=str(exc))
            else:
                self.metrics.start()
                log.info("metrics.started", address=f"{d.config.metrics.host}:{self.metrics.address[1]}")
        interval = watchdog_interval_s(os.environ.get("WATCHDOG_USEC"))
        if interval is not None and callable(notify):
            self._watchdog = Watchdog(interval, self.healthy, notify)
            self._watchdog.start()
            log.info("watchdog.started", every_s=round(interval, 3))

    def reconfigure(self, old: Config, new: Config) -> None:
        """A config reload: reschedule what depends on [report] and [alerts]."""
        d = self._daemon
        if old.report != new.report and self._scheduler is not None:
            schedule_report(self._scheduler, d.store, lambda: d.config.report, d.clock,
                            fence=d.fence.check)
        if old.alerts.scan_interval_s != new.alerts.scan_interval_s:
            self._schedule_alerts()

    def snapshot(self) -> MetricsSnapshot:
        d = self._daemon
        acc = d.tracker.accounting
        return dataclasses.replace(collect_metrics(d.store, d.health.snapshot(), d.clock()),
                                   accounting_up=acc.up, accounting_failures_total=acc.failures_total)

    def scan_alerts(self) -> None:
        try:
            sent = self.alerts.scan()
        except Exception:  # alerting must never take the daemon down
            log.exception("alerts.crashed")
            return
        log.debug("alerts.scanned", sent=sent)  # the tests wait for scans by this line

    def _schedule_alerts(self) -> None:
        if self._scheduler is None:
            return
        self._scheduler.add_job(self.scan_alerts, "interval", id="alerts", replace_existing=True,
                                seconds=self._daemon.config.alerts.scan_interval_s, max_instances=1,
                                coalesce=True)

    def stop(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        if self._watchdog is not None:
            self._watchdog.stop()
