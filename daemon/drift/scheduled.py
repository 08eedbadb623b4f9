"""The daemon's side of version drift: on-demand and scheduled scans.

SSH (slow, stateless) runs outside the daemon's action lock; judging and
acting (store, drain, resume) runs under it, so a scan never races a poll
cycle or a b300ctl command and never holds them up for the SSH part.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog

from ..errors import B300Error
from ..interfaces import SlurmClient, Store
from ..plugin_registry import PluginRegistry
from ..scheduling import table as timed
from .scan_records import DriftConfig, ScanResult
from .scanner import DriftScanner, build_drift_scanner, scan_result_to_dict

log = structlog.get_logger(__name__)


class DriftWatch:
    """Runs :class:`DriftScanner` scans for the daemon: on request, on a schedule, and
    before a run is placed when the last scan is stale."""

    def __init__(self, scanner: DriftScanner, lock: threading.Lock, clock: Callable[[], datetime]) -> None:
        self.scanner = scanner
        self._lock = lock
        self._clock = clock

    def scan(self, nodes: list[str] | None, actor: str = "daemon") -> ScanResult:
        collected = self.scanner.collect(nodes)
        with self._lock:
            return self.scanner.apply(collected, self._clock(), actor=actor)

    def scan_request(self, nodes: Sequence[str], actor: str) -> dict[str, Any]:
        """The control op ``drift_scan`` (no nodes: all of them); the scan as JSON."""
        result = self.scan(list(nodes) or None, actor)
        log.info("drift.scan", by=actor, nodes=len(result.reports), findings=len(result.findings),
                 drained=list(result.drained), resumed=list(result.resumed), wall_s=round(result.wall_s, 2))
        return scan_result_to_dict(result)

    def scan_if_stale(self, now: datetime) -> ScanResult | None:
        """Scan every node when the last scan is older than ``max_age`` (before a submission)."""
        last = self.scanner.store.last_scan()
        if last is not None and now - last[1] < timedelta(seconds=self.scanner.config.max_age_s):
            return None
        return self.scan(None)

    def scheduled(self) -> None:
        """One scheduled scan; a failure is logged, never raised into the scheduler."""
        try:
            result = self.scan(None)
        except B300Error as exc:
            log.warning("drift.scan_failed", error=str(exc))
            return
        except Exception:
            log.exception("drift.scan_crashed")
            return
        log.info("drift.scan", by="schedule", nodes=len(result.reports), findings=len(result.findings),
                 drained=list(result.drained), resumed=list(result.resumed), wall_s=round(result.wall_s, 2))

    def timed_job(self) -> timed.Job:
        """The periodic scan's row of the schedule (first one at once); None without ``interval``."""
        interval = self.scanner.config.interval_s
        if interval is None:
            return None
        return timed.Every(self.scheduled, interval, first=self._clock())


def make_drift_watch(config: DriftConfig | None, store: Store, slurm: SlurmClient, lock: threading.Lock,
                     clock: Callable[[], datetime], plugins: PluginRegistry,
                     withheld: Callable[..., None] | None = None) -> DriftWatch | None:
    """The daemon's drift watch, or None without a ``[drift]`` section; ``withheld`` set:
    findings are recorded, drains and resumes withheld."""
    if config is None:
        return None
    return DriftWatch(build_drift_scanner(config, store, slurm, plugins, withheld), lock, clock)
