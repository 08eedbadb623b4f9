"""The daemon's operational side jobs: systemd watchdog, metrics, alerts, weekly report.

:class:`Operations` is built by the composition root and started with the
daemon's scheduler; each part is optional (configured or not) and none of them
can stop the poll cycle: their failures are logged.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

import structlog
from apscheduler.schedulers.base import BaseScheduler

from ..config import Config
from ..cycle.track import AccountingHealth
from ..errors import B300Error
from ..interfaces import Store
from ..ops.alerts import AlertScanner
from ..ops.health import CycleHealth, Watchdog, watchdog_interval_s
from ..ops.metrics import MetricsServer, MetricsSnapshot, collect_metrics
from ..report.weekly import report_jobs
from ..scheduling import table as timed

if TYPE_CHECKING:
    from ..training.health_step import RunFigures

log = structlog.get_logger(__name__)


class Operations:
    """Watchdog pings, the metrics listener, alert scans and the weekly report's schedule."""

    def __init__(
        self,
        *,
        config: Callable[[], Config],
        store: Store,
        clock: Callable[[], datetime],
        fence: Callable[[str], None],
        health: CycleHealth,
        accounting: Callable[[], AccountingHealth],
        running: Callable[[], bool],
        training: Callable[[], dict[str, RunFigures]] = dict,
    ) -> None:
        self._training = training
        self._config = config
        self._store = store
        self._clock = clock
        self._fence = fence
        self._health = health
        self._accounting = accounting
        self._running = running
        self._watchdog: Watchdog | None = None
        self._scheduler: BaseScheduler | None = None
        self.metrics: MetricsServer | None = None
        self.alerts = AlertScanner(store, lambda: (config().alerts, config().report.smtp), clock,
                                   fence=fence)

    def healthy(self) -> bool:
        """The scheduler runs and no poll cycle is stuck (Slurm calls time out long before)."""
        cfg = self._config()
        stuck_after = max(300.0, 10 * cfg.slurm_timeout_s, 3 * cfg.poll_interval_s)
        return self._running() and not self._health.stuck(stuck_after)

    def timed_jobs(self) -> dict[str, timed.Job]:
        """The weekly report's and the alert scanner's rows of the schedule (current config)."""
        return {**self._report_jobs(), **self._alerts_job()}

    def start(self, scheduler: BaseScheduler, notify: Callable[[str], bool]) -> None:
        """Before the daemon places its schedule: the alert scanner's starting point, the
        metrics server, the watchdog."""
        self._scheduler = scheduler
        cfg = self._config()
        try:
            self.alerts.prime()
        except B300Error as exc:
            log.error("alerts.not_primed", error=str(exc))
        if cfg.metrics.enabled:
            try:
                self.metrics = MetricsServer(cfg.metrics.host, cfg.metrics.port, self.snapshot)
            except OSError as exc:  # a taken port must not stop the daemon
                log.error("metrics.not_started", listen=f"{cfg.metrics.host}:{cfg.metrics.port}",
                          error=str(exc))
            else:
                self.metrics.start()
                log.info("metrics.started", address=f"{cfg.metrics.host}:{self.metrics.address[1]}")
        interval = watchdog_interval_s(os.environ.get("WATCHDOG_USEC"))
        if interval is not None:
            self._watchdog = Watchdog(interval, self.healthy, notify)
            self._watchdog.start()
            log.info("watchdog.started", every_s=round(interval, 3))

    def reconfigure(self, old: Config, new: Config) -> None:
        """A config reload: reschedule what depends on [report] and [alerts]."""
        if self._scheduler is None:
            return
        if old.report != new.report:
            timed.place(self._scheduler, self._report_jobs())
        if old.alerts.scan_interval_s != new.alerts.scan_interval_s:
            timed.place(self._scheduler, self._alerts_job())

    def snapshot(self) -> MetricsSnapshot:
        acc = self._accounting()
        return dataclasses.replace(collect_metrics(self._store, self._health.snapshot(), self._clock()),
                                   accounting_up=acc.up, accounting_failures_total=acc.failures_total,
                                   training=self._training())

    def scan_alerts(self) -> None:
        try:
            sent = self.alerts.scan()
        except Exception:  # alerting must never take the daemon down
            log.exception("alerts.crashed")
            return
        log.debug("alerts.scanned", sent=sent)  # the tests wait for scans by this line

    def _report_jobs(self) -> dict[str, timed.Job]:
        return report_jobs(self._store, lambda: self._config().report, self._clock, fence=self._fence)

    def _alerts_job(self) -> dict[str, timed.Job]:
        return {"alerts": timed.Every(self.scan_alerts, self._config().alerts.scan_interval_s)}

    def stop(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        if self._watchdog is not None:
            self._watchdog.stop()
