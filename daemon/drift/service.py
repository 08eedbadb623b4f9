"""The daemon's side of version drift: on-demand and scheduled scans.

SSH (slow, stateless) runs outside the daemon's action lock; judging and
acting (store, drain, resume) runs under it, so a scan never races a poll
cycle or a b300ctl command and never holds them up for the SSH part.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import structlog

from ..errors import B300Error, UsageError
from ..interfaces import SlurmClient
from .cli import scan_result_to_dict
from .config import DriftConfig
from .records import ScanResult
from .scanner import DriftScanner, build_drift_scanner

log = structlog.get_logger(__name__)


class DriftService:
    """Runs :class:`DriftScanner` scans for the daemon."""

    def __init__(self, scanner: DriftScanner, lock: threading.Lock, clock: Callable[[], datetime]) -> None:
        self.scanner = scanner
        self._lock = lock
        self._clock = clock

    def scan(self, nodes: list[str] | None, actor: str = "daemon") -> ScanResult:
        collected = self.scanner.collect(nodes)
        with self._lock:
            return self.scanner.apply(collected, self._clock(), actor=actor)

    def scan_request(self, request: dict[str, Any], actor: str) -> dict[str, Any]:
        """The control op ``drift_scan``: ``{"nodes": [names]}`` (empty: all)."""
        nodes = request.get("nodes") or []
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise UsageError("nodes must be a list of node names")
        result = self.scan(nodes or None, actor)
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

    def schedule(self, scheduler: Any) -> None:
        """Add the periodic scan to the daemon's APScheduler (first one at once)."""
        interval = self.scanner.config.interval_s
        if interval is None:
            return
        scheduler.add_job(self.scheduled, "interval", id="drift", seconds=interval, max_instances=1,
                          coalesce=True, next_run_time=self._clock())


def make_drift_service(config: DriftConfig | None, store: Any, slurm: SlurmClient, lock: threading.Lock,
                       clock: Callable[[], datetime]) -> DriftService | None:
    """The daemon's drift service, or None without a ``[drift]`` section."""
    if config is None:
        return None
    return DriftService(build_drift_scanner(config, store, slurm), lock, clock)
