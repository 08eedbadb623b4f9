"""The running daemon: its schedule, the control socket, the lease, and clean stops.

Everything that acts on Slurm or the store (a poll cycle, a b300ctl request, the
judging part of a drift scan, a prune) runs under one action lock, so b300ctl
never races the poll cycle. The parts are built by :mod:`b300.app.root`; this
module only runs them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from apscheduler.events import EVENT_JOB_MAX_INSTANCES
from apscheduler.schedulers.background import BackgroundScheduler

from .. import __version__
from ..checkpoints.checkpoint_pass import CheckpointPass
from ..checkpoints.upkeep import CheckpointUpkeep
from ..config import Config
from ..control.server import ControlServer
from ..cycle.pipeline import CycleReport, PollCycle
from ..drift.scheduled import DriftWatch
from ..drill.runner import DrillWatch
from ..errors import SlurmError, StoreError
from ..events import Kind
from ..ha.lease import FencedError
from ..interfaces import NewEvent, SlurmClient, Store
from ..ops.health import CycleHealth, Watchdog, watchdog_interval_s
from ..recovery.node_loss import NodeLossWatch
from ..scheduling import table as timed
from .lifetime import Lifetime, sd_notify
from .operations import Operations
from .reloader import ConfigReloader
from .router import ControlRouter

log = structlog.get_logger(__name__)


class CycleRunner:
    """Runs the poll cycle on the schedule: lease renewal first, exponential back-off
    while Slurm or the store is down, a warning when a cycle outlives its interval."""

    def __init__(self, cycle: PollCycle, lifetime: Lifetime, lock: threading.Lock,
                 config: Callable[[], Config], health: CycleHealth) -> None:
        self.cycle = cycle
        self._lifetime = lifetime
        self._lock = lock
        self._config = config
        self.health = health
        self._failures = 0
        self._skip_until = 0.0
        self._overrun_logged = -60.0

    def run(self) -> None:
        """One scheduled cycle (never raises into the scheduler)."""
        if time.monotonic() < self._skip_until:
            return
        with self._lock:
            if self._lifetime.stopping() or not self._renew_lease():
                return
            report = self._guarded()
        if report is None:
            return
        self._check_overrun(report.wall_s)
        if self._failures:
            log.info("cycle.recovered", after_failures=self._failures)
        self._failures = 0
        log.debug("cycle.done", tracked=report.tracked, changed=report.changed,
                  slurm_calls=report.slurm_calls, wall_s=round(report.wall_s, 3),
                  errors=report.errors or None)

    def _guarded(self) -> CycleReport | None:
        self.health.begin()
        try:
            report = self.cycle.run_once()
        except FencedError:
            # Logged by the fence; the daemon stops (exit 75) and acts no more.
            self.health.end(ok=False)
            return None
        except (SlurmError, StoreError) as exc:
            self.health.end(ok=False)
            self._failures += 1
            cfg = self._config()
            delay = min(cfg.max_backoff_s, cfg.poll_interval_s * 2 ** min(self._failures, 16))
            self._skip_until = time.monotonic() + delay
            log.warning("cycle.failed", error=str(exc), failures=self._failures,
                        retry_in_s=round(delay, 1))
            return None
        except Exception:
            # A bug must not stop the daemon; it is logged with its traceback.
            self.health.end(ok=False)
            log.exception("cycle.crashed")
            return None
        self.health.end(ok=True)
        return report

    def wake(self) -> None:
        """The next scheduled cycle runs whatever the back-off says."""
        self._skip_until = 0.0

    def _renew_lease(self) -> bool:
        """Renew the lease at the start of a cycle; False: skip this cycle."""
        lease = self._lifetime.lease
        if lease is None:
            return True
        try:
            if lease.renew():
                return True
        except StoreError as exc:
            if lease.healthy():
                log.warning("lease.renew_failed", error=str(exc), action="cycle skipped")
                return False
            self._lifetime.lease_lost(f"could not renew within the lease's validity: {exc}")
            return False
        self._lifetime.lease_lost("taken over or expired")
        return False

    def _check_overrun(self, wall_s: float) -> None:
        interval = self._config().poll_interval_s
        if wall_s > interval:
            self.health.overran()
            log.warning("cycle.overran", wall_s=round(wall_s, 3), interval_s=interval,
                        why="the poll cycle took longer than poll_interval; cycles were skipped")

    def still_running(self, event: Any) -> None:
        """APScheduler skipped a cycle because the last one still runs: say so, once a minute."""
        if getattr(event, "job_id", None) != "poll":
            return
        running = self.health.snapshot().running_for_s
        now = time.monotonic()
        if now - self._overrun_logged >= 60:
            self._overrun_logged = now
            log.warning("cycle.overrun", running_for_s=round(running or 0.0, 1),
                        interval_s=self._config().poll_interval_s,
                        why="the previous poll cycle is still running")


@dataclass
class DaemonParts:
    """What the composition root built; the daemon runs it."""

    config: Config
    store: Store
    slurm: SlurmClient
    lifetime: Lifetime
    lock: threading.Lock
    clock: Callable[[], datetime]
    scheduler: BackgroundScheduler
    cycles: CycleRunner
    checkpoint_pass: CheckpointPass
    checkpoint_upkeep: CheckpointUpkeep
    drift: DriftWatch | None
    node_loss: NodeLossWatch | None
    operations: Operations
    router: ControlRouter
    reloader: ConfigReloader
    on_start: Callable[[], None]   # after the schedule starts: arm the trigger, check folders
    drills: DrillWatch | None = None  # b300ctl drill: measured here, scheduled while one is open


class Daemon:
    """Runs the parts for the process's lifetime; :meth:`serve` blocks until stopped."""

    def __init__(self, parts: DaemonParts) -> None:
        self.parts = parts
        self._server: ControlServer | None = None

    @property
    def exit_code(self) -> int:
        return self.parts.lifetime.exit_code

    def serve(self) -> int:
        """Start the socket, wait for the lease, run the schedule until :meth:`stop`; the exit code."""
        p = self.parts
        self._server = ControlServer(p.config.socket, p.router.handle, admin_group=p.config.admin_group)
        self._server.start()
        try:
            if not self._become_active():
                return self._shut_down()
        except BaseException:
            self._server.stop()
            raise
        cfg = p.config
        sched = p.scheduler
        sched.add_listener(p.cycles.still_running, EVENT_JOB_MAX_INSTANCES)
        sched.start()
        p.operations.start(sched, sd_notify)
        timed.start(sched, self.timed_jobs())
        p.on_start()
        if p.drills is not None:
            p.drills.attach(sched)
        sd_notify(f"READY=1\nSTATUS=tracking (poll every {cfg.poll_interval_s:g} s)")
        log.info("daemon.started", version=__version__, pid=os.getpid(), socket=cfg.socket,
                 slurm=p.slurm.name, poll_interval_s=cfg.poll_interval_s)
        # Bounded waits: Python runs a signal's handler in the main thread only when that
        # thread runs Python code, and the kernel may give SIGTERM to another thread; an
        # unbounded wait here then never returned (seen: a SIGTERM lost right after a drill).
        while not p.lifetime.stop_event.wait(1.0):
            pass
        sd_notify("STOPPING=1")
        log.info("daemon.stopping")
        # wait=True: a cycle in progress finishes; its intents are already recorded.
        sched.shutdown(wait=True)
        p.operations.stop()
        if p.node_loss is not None:
            p.node_loss.close()
        return self._shut_down()

    def timed_jobs(self) -> dict[str, timed.Job]:
        """Every row of the schedule placed when the daemon becomes active (None: its
        feature is off), from the config it started with; :func:`b300.scheduling.table.start`
        places them in one go and refuses a row left out."""
        p, cfg = self.parts, self.parts.config
        return {
            "poll": timed.Every(p.cycles.run, cfg.poll_interval_s, first=datetime.now(UTC)),
            "liveness": (None if p.node_loss is None
                         else timed.Every(p.node_loss.round, cfg.liveness.interval_s)),
            "checkpoints": timed.Every(p.checkpoint_pass.run_once, cfg.checkpoints.check_interval_s),
            "checkpoint-upkeep": timed.Every(p.checkpoint_upkeep.run_once, cfg.checkpoints.maintain_interval_s),
            "drift": None if p.drift is None else p.drift.timed_job(),
            **p.operations.timed_jobs(),
        }

    def stop(self) -> None:
        self.parts.lifetime.stop()

    def set_admin_group(self, group: str) -> None:
        """Give the control socket to a new admin group (config reload)."""
        if self._server is not None:
            self._server.set_group(group)

    def request_reload(self) -> None:
        """SIGHUP: reload the config soon, in the scheduler (not in the signal handler)."""
        try:
            timed.once(self.parts.scheduler, "reload", self.parts.reloader.reload)
        except Exception:  # the scheduler is not running (starting up or stopping)
            log.warning("config.reload_skipped", why="scheduler not running")

    def _shut_down(self) -> int:
        p = self.parts
        if self._server is not None:
            self._server.stop()
        if p.lifetime.lease is not None:
            p.lifetime.lease.release()
        p.store.close()
        log.info("daemon.stopped", exit_code=p.lifetime.exit_code)
        return p.lifetime.exit_code

    def _become_active(self) -> bool:
        """Wait as a standby (answering b300ctl) until the lease is ours; False if stopped."""
        p = self.parts
        lease = p.lifetime.lease
        if lease is None:
            return True
        sd_notify(f"READY=1\nSTATUS=standby (lease {lease.name})")
        interval = watchdog_interval_s(os.environ.get("WATCHDOG_USEC"))
        standby_dog = (Watchdog(interval, lambda: not p.lifetime.stopping(), sd_notify)
                       if interval is not None else None)
        if standby_dog is not None:
            standby_dog.start()
        try:
            if not lease.acquire(p.lifetime.stop_event):
                return False
        finally:
            if standby_dog is not None:
                standby_dog.stop()
        prev = lease.previous
        data: dict[str, Any] = {"lease": lease.name, "epoch": lease.epoch,
                                "new": lease.identity, "new_host": lease.host,
                                "new_pid": lease.pid,
                                "since": lease.acquired_at.isoformat() if lease.acquired_at else None}
        if prev is not None:
            data.update(old=prev.holder, old_host=prev.host, old_pid=prev.pid,
                        old_epoch=prev.epoch, old_renewed_at=prev.renewed_at.isoformat(),
                        old_expired_at=prev.expires_at.isoformat())
            # A clean stop gives the lease up (expires_at set back to then).
            data["old_released"] = (prev.expires_at - prev.renewed_at).total_seconds() \
                < lease.ttl_s - 0.5
        kind = Kind.HA_FAILOVER if prev is not None else Kind.HA_ACQUIRED
        p.store.daemon_identity = f"{lease.identity} e{lease.epoch}"
        try:
            p.store.append_events([NewEvent(kind, data=data)], p.clock())
        except StoreError as exc:
            log.warning("ha.event_not_recorded", kind=kind.value, error=str(exc))
        log.info(kind.value, **data)
        lease.start_heartbeat(p.lifetime.stop_event, p.lifetime.lease_lost)
        return not p.lifetime.stopping()
