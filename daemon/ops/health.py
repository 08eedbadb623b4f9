"""The daemon's own health: poll-cycle statistics and the systemd watchdog.

systemd kills a Type=notify service whose ``WATCHDOG=1`` pings stop for
``WatchdogSec``. A ping after each cycle is not enough (a slow cycle, or a long
poll interval, would look dead), so a small thread pings every
``WATCHDOG_USEC / 2`` -- but only while the daemon is healthy: the scheduler
runs and no cycle has been stuck for longer than ``stuck_after_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CycleSnapshot:
    cycles_total: int
    failures_total: int
    last_duration_s: float | None
    last_end_unix: float | None
    running_for_s: float | None
    overruns_total: int = 0


class CycleHealth:
    """Counts poll cycles; thread-safe (cycles run in the scheduler's thread)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._started: float | None = None
        self._cycles = 0
        self._failures = 0
        self._last_duration: float | None = None
        self._last_end: float | None = None
        self._overruns = 0

    def overran(self) -> None:
        """A cycle outlived its interval (counted once per overrunning cycle)."""
        with self._lock:
            self._overruns += 1

    def begin(self) -> None:
        with self._lock:
            self._started = self._clock()

    def end(self, ok: bool) -> None:
        with self._lock:
            if self._started is not None:
                self._last_duration = self._clock() - self._started
            self._started = None
            self._cycles += 1
            self._failures += 0 if ok else 1
            self._last_end = self._wall()

    def snapshot(self) -> CycleSnapshot:
        with self._lock:
            running = None if self._started is None else self._clock() - self._started
            return CycleSnapshot(self._cycles, self._failures, self._last_duration,
                                 self._last_end, running, self._overruns)

    def stuck(self, stuck_after_s: float) -> bool:
        running = self.snapshot().running_for_s
        return running is not None and running > stuck_after_s


def watchdog_interval_s(watchdog_usec: str | None) -> float | None:
    """Half of systemd's ``WATCHDOG_USEC`` in seconds, or None when not set/invalid."""
    try:
        usec = int(watchdog_usec or "")
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


class Watchdog:
    """Sends ``WATCHDOG=1`` every ``interval_s`` while ``healthy()`` says so."""

    def __init__(self, interval_s: float, healthy: Callable[[], bool],
                 notify: Callable[[str], object]) -> None:
        self.interval_s = interval_s
        self._healthy = healthy
        self._notify = notify
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self._healthy():
                self._notify("WATCHDOG=1")
