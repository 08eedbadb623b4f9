"""The running daemon: the poll schedule, the control socket, and clean stops.

Everything that acts on Slurm or the store (a poll cycle, a b300ctl request)
runs under one action lock, so b300ctl never races the tracker.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from apscheduler.events import EVENT_JOB_MAX_INSTANCES
from apscheduler.schedulers.background import BackgroundScheduler

from . import __version__
from .checkpoints.access import checkpoint_dir_problem
from .checkpoints.upkeep import CheckpointUpkeep
from .checkpoints.watch import CheckpointPass
from .config import Config, load_config, trigger_program
from .control import ControlServer, Peer, is_admin
from .drift.service import make_drift_service
from .errors import B300Error, ConfigError, NotFoundError, SlurmError, StoreError, UsageError
from .events import Kind
from .fence import Fence, FencedSlurm
from .health import CycleHealth, Watchdog, watchdog_interval_s
from .interfaces import NewEvent, SlurmClient, Store
from .lease import DbLease, FencedError
from .logs import configure_logging
from .model import Attempt, Run
from .ops import Operations
from .recovery.service import RecoveryService
from .reload import plan_reload
from .runs import RunService
from .spec import parse_spec
from .tracker import JobTracker

log = structlog.get_logger(__name__)
_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MUTATING = {"submit", "resubmit", "cancel", "node_resume", "wake", "drift_scan"}


def sd_notify(message: str) -> bool:
    """Tell systemd (Type=notify) how we are; a no-op outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), addr)
        except OSError:
            return False
    return True


def run_to_dict(run: Run) -> dict[str, Any]:
    return {"id": run.id, "name": run.name, "state": run.state.value,
            "created_at": run.created_at.isoformat(), "updated_at": run.updated_at.isoformat(),
            "attempts": run.attempts_count}


def attempt_to_dict(a: Attempt) -> dict[str, Any]:
    return {"number": a.number, "tag": a.tag, "state": a.state.value, "job_id": a.slurm_job_id,
            "nodes": list(a.nodes), "excluded_nodes": list(a.excluded_nodes),
            "resume_from": a.resume_from, "reason": a.reason, "exit_code": a.exit_code,
            "signal": a.signal, "start": a.start.isoformat() if a.start else None,
            "end": a.end.isoformat() if a.end else None,
            "created_at": a.created_at.isoformat()}


class Daemon:
    """Owns the parts for the daemon's lifetime; :meth:`serve` blocks until stopped."""

    def __init__(
        self,
        config: Config,
        store: Store,
        slurm: SlurmClient,
        *,
        clock: Callable[[], datetime] | None = None,
        lease: DbLease | None = None,
    ) -> None:
        self._lease = lease
        self.exit_code = 0
        self.config = config
        self.store = store
        # Fencing (b300.fence): every changing Slurm call proves the lease first.
        self.fence = Fence(lease, on_fenced=self._lease_lost)
        self.slurm = slurm = FencedSlurm(slurm, self.fence) if lease is not None else slurm
        self.clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        self.drift = make_drift_service(config.drift, store, slurm, self._lock, self.clock)
        self.runs = RunService(store, slurm, self.clock, submit_grace_s=config.submit_grace_s,
                               job_log_dir=config.job_log_dir, avoid_nodes=self._drifted_nodes,
                               black_holes=self._black_hole_nodes)
        self.recovery = (
            RecoveryService(store, slurm, self.runs, self.clock, config.recovery,
                            job_log_dir=config.job_log_dir)
            if config.recovery.enabled else None
        )
        self.tracker = JobTracker(store, slurm, self.runs, self.clock, recovery=self.recovery,
                                  accounting_grace_s=config.accounting_grace_s)
        self.checkpoint_pass = CheckpointPass(
            store, store.checkpoints, slurm, self.clock,
            allow_signals=config.checkpoints.allow_signals,
            signal_grace_s=config.checkpoints.signal_grace_s,
            manifests_per_pass=config.checkpoints.manifests_per_pass)
        self.checkpoint_upkeep = CheckpointUpkeep(
            store, store.checkpoints, config.checkpoints, self.clock,
            action_lock=self._lock, stopping=lambda: self._stop.is_set(), fence=self.fence.check)
        self._stop = threading.Event()
        self._failures = 0
        self._overrun_logged = -60.0
        self._skip_until = 0.0
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self._server: ControlServer | None = None
        self.health = CycleHealth()
        self.ops = Operations(self)

    # -- the poll cycle ---------------------------------------------------

    def cycle(self) -> None:
        """One poll cycle, with exponential back-off while Slurm or the store is down."""
        if time.monotonic() < self._skip_until:
            return
        with self._lock:
            if self._stop.is_set():
                return
            if not self._renew_lease():
                return
            self.health.begin()
            try:
                report = self.tracker.poll_once()
            except FencedError:
                # Logged by the fence; the daemon stops (exit 75) and acts no more.
                self.health.end(ok=False)
                return
            except (SlurmError, StoreError) as exc:
                self.health.end(ok=False)
                self._failures += 1
                delay = min(self.config.max_backoff_s,
                            self.config.poll_interval_s * 2 ** min(self._failures, 16))
                self._skip_until = time.monotonic() + delay
                log.warning("cycle.failed", error=str(exc), failures=self._failures,
                            retry_in_s=round(delay, 1))
                return
            except Exception:
                # A bug must not stop the daemon; it is logged with its traceback.
                self.health.end(ok=False)
                log.exception("cycle.crashed")
                return
            self.health.end(ok=True)
        self._check_overrun(report.wall_s)
        if self._failures:
            log.info("cycle.recovered", after_failures=self._failures)
        self._failures = 0
        log.debug("cycle.done", tracked=report.tracked, changed=report.changed,
                  slurm_calls=report.slurm_calls, wall_s=round(report.wall_s, 3),
                  errors=report.errors or None)

    def _check_overrun(self, wall_s: float) -> None:
        interval = self.config.poll_interval_s
        if wall_s > interval:
            self.health.overran()
            log.warning("cycle.overran", wall_s=round(wall_s, 3), interval_s=interval,
                        why="the poll cycle took longer than poll_interval; cycles were skipped")

    def _cycle_still_running(self, event: Any) -> None:
        """APScheduler skipped a cycle because the last one still runs: say so, once a minute."""
        if getattr(event, "job_id", None) != "poll":
            return
        running = self.health.snapshot().running_for_s
        now = time.monotonic()
        if now - self._overrun_logged >= 60:
            self._overrun_logged = now
            log.warning("cycle.overrun", running_for_s=round(running or 0.0, 1),
                        interval_s=self.config.poll_interval_s,
                        why="the previous poll cycle is still running")

    def _renew_lease(self) -> bool:
        """Renew the lease at the start of a cycle; False: skip this cycle."""
        if self._lease is None:
            return True
        try:
            if self._lease.renew():
                return True
        except StoreError as exc:
            if self._lease.healthy():
                log.warning("lease.renew_failed", error=str(exc), action="cycle skipped")
                return False
            self._lease_lost(f"could not renew within the lease's validity: {exc}")
            return False
        self._lease_lost("taken over or expired")
        return False

    def _lease_lost(self, why: str) -> None:
        """The lease is gone or cannot be proven: act no more, exit for a restart as standby."""
        if self.exit_code != 75:
            log.error("lease.lost", why=why, epoch=self._lease.epoch if self._lease else None,
                      action="stopping; systemd restarts us as a standby")
        self.exit_code = 75
        self._stop.set()

    def _black_hole_nodes(self) -> set[str]:
        return self.recovery.black_hole_nodes() if self.recovery is not None else set()

    def _drifted_nodes(self) -> set[str]:
        """Nodes with open drift findings (drain policy): no attempt may land there.

        Only Slurm's own nodes: a finding for a host that is not one (a typo in
        [drift.nodes], a retired node) is reported, never put in an exclude list,
        where sbatch would refuse the whole job ("Invalid node name")."""
        if self.drift is None:
            return set()
        drifted = self.drift.scanner.store.open_drift_nodes()
        if not drifted:
            return set()
        known = {n.name for n in self.store.list_nodes()}
        if not known:
            try:
                known = {n.name for n in self.slurm.nodes()}
            except SlurmError:
                known = set()
        outside = drifted - known
        if outside:
            log.warning("drift.not_a_slurm_node", nodes=sorted(outside),
                        action="reported, not excluded (sbatch would refuse the job)")
        return drifted & known

    def wake(self) -> None:
        """Run a cycle soon (after a change made through the control socket)."""
        self._skip_until = 0.0
        try:
            self._scheduler.modify_job("poll", next_run_time=datetime.now(UTC))
        except Exception:  # the scheduler may be shutting down
            log.debug("wake.skipped")

    # -- control requests -------------------------------------------------

    def role(self) -> str:
        """``active``, ``standby`` (waiting for the lease) or ``fenced`` (lost it; stopping)."""
        if self._lease is None:
            return "active"
        if self._lease.lost or self.exit_code == 75:
            return "fenced"
        return "active" if self._lease.epoch is not None else "standby"

    def _ping(self) -> dict[str, Any]:
        result: dict[str, Any] = {"pid": os.getpid(), "version": __version__, "role": self.role()}
        if self._lease is not None:
            result["identity"] = self._lease.identity
            result["epoch"] = self._lease.epoch
        return result

    def _refuse_unless_active(self, op: str) -> None:
        if self.role() == "active":
            return
        who = ""
        if self._lease is not None:
            try:
                info = self._lease.read()
            except StoreError:
                info = None
            if info is not None and info.live:
                who = f"; the active daemon is {info.holder} (epoch {info.epoch})"
        raise FencedError(f"this b300d is {self.role()}, not active: {op} not done{who}")

    def _request_expired(self, request: dict[str, Any], op: str,
                         client_alive: Callable[[], bool] | None) -> str | None:
        """Why a request must be dropped (its deadline passed, its client left), or None."""
        deadline = request.get("deadline")
        if isinstance(deadline, int | float) and not isinstance(deadline, bool):
            # b300ctl and b300d share the host (Unix socket), so their clocks are one.
            late = time.time() - float(deadline)
            if late > 0:
                return f"its deadline passed {late:.1f} s ago"
        if client_alive is not None and not client_alive():
            return "its client is gone"
        return None

    def handle(self, request: dict[str, Any], peer: Peer,
               client_alive: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Answer one control request.

        A changing request is executed only by the active daemon, only while
        its ``deadline`` (Unix time, set by b300ctl) has not passed and its
        client is still connected, checked under the action lock right before
        acting; the fence then proves the lease at each action.
        """
        op = request["op"]
        actor = peer.user
        try:
            if op == "ping":
                return {"ok": True, "result": self._ping()}
            if op not in _MUTATING:
                raise UsageError(f"unknown request {op!r}")
            self._refuse_unless_active(op)
            if not is_admin(peer, self.config.admin_group):
                log.warning("control.refused", op=op, user=actor, uid=peer.uid)
                return {"ok": False, "exit_code": 2,
                        "error": f"user {actor} may not {op}: not in admin group "
                                 f"{self.config.admin_group or '(none configured)'}"}
            dropped = self._request_expired(request, op, client_alive)
            if dropped:
                log.warning("control.dropped", op=op, user=actor, why=dropped)
                return {"ok": False, "exit_code": 5, "error": f"{op} dropped: {dropped}"}
            if op == "drift_scan":
                if self.drift is None:
                    raise UsageError("version drift is not configured (no [drift] in the config)")
                # Not under the lock as a whole: only the judging and acting part takes it.
                return {"ok": True, "result": self.drift.scan_request(request, actor)}
            if op == "wake":
                # A Slurm trigger (node down) or an operator: run a cycle now.
                log.info("control.wake", by=actor, why=str(request.get("why", ""))[:200])
                self.wake()
                return {"ok": True, "result": {}}
            if self.drift is not None and op in ("submit", "resubmit"):
                # A fresh view of drift before placing a run (outside the lock: SSH).
                self.drift.scan_if_stale(self.clock())
            with self._lock:
                # Checked again here: the request may have waited for the lock
                # (or the process may have been frozen) since it arrived.
                dropped = self._request_expired(request, op, client_alive)
                if dropped:
                    log.warning("control.dropped", op=op, user=actor, why=dropped)
                    return {"ok": False, "exit_code": 5, "error": f"{op} dropped: {dropped}"}
                self._refuse_unless_active(op)
                # Prove the lease before the first write of the request, not only at
                # its Slurm call: an intent written by a fenced daemon would be
                # carried out by the next active one.
                self.fence.check(f"request {op} from {actor}")
                result = self._mutate(op, request, actor)
            self.wake()
            return {"ok": True, "result": result}
        except B300Error as exc:
            return {"ok": False, "error": str(exc), "exit_code": exc.exit_code}
        except Exception as exc:
            log.exception("control.crashed", op=op)
            return {"ok": False, "error": f"internal error: {type(exc).__name__}", "exit_code": 1}

    def _mutate(self, op: str, request: dict[str, Any], actor: str) -> dict[str, Any]:
        if op == "node_resume":
            node = request.get("node")
            if not isinstance(node, str) or not _NODE_RE.fullmatch(node):
                raise UsageError(f"bad node name {node!r}")
            known = {n.name for n in self.store.list_nodes()}
            if known and node not in known:
                raise NotFoundError(f"unknown node {node!r}")
            self.slurm.resume_node(node)
            self.store.append_events([NewEvent(Kind.NODE_RESUMED, node=node, actor=actor)],
                                     self.clock())
            return {"node": node}
        if op == "submit":
            text = request.get("spec_toml")
            if not isinstance(text, str):
                raise UsageError("submit needs spec_toml")
            spec = parse_spec(text, where=str(request.get("where") or "spec"))
            if spec.checkpoint.dir and (why := checkpoint_dir_problem(
                    spec.checkpoint.dir, self.config.checkpoints.roots)):
                raise UsageError(why)
            run = self.runs.submit(spec, text, actor=actor)
        else:
            run_id = request.get("run_id")
            if not isinstance(run_id, str):
                raise UsageError(f"{op} needs a run id")
            if op == "cancel":
                run = self.runs.cancel(run_id, actor=actor)
            else:
                exclude = request.get("exclude") or []
                resume = request.get("resume_from")
                if not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
                    raise UsageError("exclude must be a list of node names")
                if resume is not None and not isinstance(resume, str):
                    raise UsageError("resume_from must be a path")
                run = self.runs.resubmit(run_id, actor=actor, exclude=exclude, resume_from=resume,
                                         force=request.get("force") is True,
                                         from_scratch=request.get("from_scratch") is True)
        return {"run": run_to_dict(run),
                "attempts": [attempt_to_dict(a) for a in self.store.attempts(run.id)]}

    # -- lifetime ---------------------------------------------------------

    def serve(self) -> int:
        """Start the schedule and the socket, block until :meth:`stop`; the exit code."""
        self._server = ControlServer(self.config.socket, self.handle,
                                     admin_group=self.config.admin_group)
        self._server.start()
        try:
            if not self._become_active():
                return self._shut_down()
        except BaseException:
            self._server.stop()
            raise
        self._scheduler.add_job(self.cycle, "interval", id="poll",
                                seconds=self.config.poll_interval_s, max_instances=1,
                                coalesce=True, next_run_time=datetime.now(UTC))
        if self.drift is not None:
            self.drift.schedule(self._scheduler)
        self._scheduler.add_job(self.checkpoint_pass.run_once, "interval", id="checkpoints",
                                seconds=self.config.checkpoints.check_interval_s,
                                max_instances=1, coalesce=True)
        self._scheduler.add_job(self.checkpoint_upkeep.run_once, "interval", id="checkpoint-upkeep",
                                seconds=self.config.checkpoints.maintain_interval_s,
                                max_instances=1, coalesce=True)
        self._scheduler.add_listener(self._cycle_still_running, EVENT_JOB_MAX_INSTANCES)
        self._scheduler.start()
        self.ops.start(self._scheduler, sd_notify)
        self._arm_node_trigger()
        self._check_checkpoint_dirs()
        sd_notify(f"READY=1\nSTATUS=tracking (poll every {self.config.poll_interval_s:g} s)")
        log.info("daemon.started", version=__version__, pid=os.getpid(),
                 socket=self.config.socket, slurm=self.slurm.name,
                 poll_interval_s=self.config.poll_interval_s)
        self._stop.wait()
        sd_notify("STOPPING=1")
        log.info("daemon.stopping")
        # wait=True: a cycle in progress finishes; its intents are already recorded.
        self._scheduler.shutdown(wait=True)
        self.ops.stop()
        return self._shut_down()

    def _shut_down(self) -> int:
        if self._server is not None:
            self._server.stop()
        if self._lease is not None:
            self._lease.release()
        self.store.close()
        log.info("daemon.stopped", exit_code=self.exit_code)
        return self.exit_code

    def _become_active(self) -> bool:
        """Wait as a standby (answering b300ctl) until the lease is ours; False if stopped."""
        lease = self._lease
        if lease is None:
            return True
        sd_notify(f"READY=1\nSTATUS=standby (lease {lease.name})")
        interval = watchdog_interval_s(os.environ.get("WATCHDOG_USEC"))
        standby_dog = (Watchdog(interval, lambda: not self._stop.is_set(), sd_notify)
                       if interval is not None else None)
        if standby_dog is not None:
            standby_dog.start()
        try:
            if not lease.acquire(self._stop):
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
        self.store.daemon_identity = f"{lease.identity} e{lease.epoch}"
        try:
            self.store.append_events([NewEvent(kind, data=data)], self.clock())
        except StoreError as exc:
            log.warning("ha.event_not_recorded", kind=kind, error=str(exc))
        log.info(kind, **data)
        lease.start_heartbeat(self._stop, self._lease_lost)
        return not self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> threading.Event:
        """Set once the daemon is asked to stop (also ends a standby's wait)."""
        return self._stop

    def scheduler_running(self) -> bool:
        return bool(self._scheduler.running) and not self._stop.is_set()

    def request_reload(self) -> None:
        """SIGHUP: reload the config soon, in the scheduler (not in the signal handler)."""
        try:
            self._scheduler.add_job(self.reload_config, id="reload", replace_existing=True)
        except Exception:  # the scheduler is not running (starting up or stopping)
            log.warning("config.reload_skipped", why="scheduler not running")

    def reload_config(self) -> None:
        """Re-read the config file; apply what is safe live, keep the old one if it is bad."""
        try:
            new = load_config(self.config.path)
        except ConfigError as exc:
            log.error("config.refused", path=self.config.path, reason=str(exc))
            self._record_config_event(Kind.CONFIG_REFUSED, {"reason": str(exc)})
            return
        change = plan_reload(self.config, new)
        with self._lock:
            old, self.config = self.config, change.config
            if self.recovery is not None and "recovery" in change.applied:
                self.recovery.reconfigure(change.config.recovery)
        if ("log_level" in change.applied or "log_format" in change.applied):
            configure_logging(change.config.log_format, change.config.log_level)
        if "poll_interval_s" in change.applied:
            self._scheduler.reschedule_job("poll", trigger="interval",
                                           seconds=change.config.poll_interval_s)
        if "admin_group" in change.applied and self._server is not None:
            self._server.set_group(change.config.admin_group)
        self.ops.reconfigure(old, change.config)
        log.info("config.reloaded", path=self.config.path, changed=list(change.applied),
                 needs_restart=list(change.needs_restart))
        self._record_config_event(Kind.CONFIG_RELOADED, {"changed": list(change.applied),
                                                      "needs_restart": list(change.needs_restart)})

    def _record_config_event(self, kind: str, data: dict[str, Any]) -> None:
        try:
            self.store.append_events([NewEvent(kind, data=data)], self.clock())
        except StoreError as exc:
            log.warning("config.event_not_recorded", kind=kind, error=str(exc))

    def _check_checkpoint_dirs(self) -> None:
        """At start: one line per active run whose checkpoint folder this daemon cannot
        write (a folder left out of the unit's ReadWritePaths, a read-only mount)."""
        try:
            runs = [r for r in self.store.list_runs() if not r.state.is_terminal]
        except StoreError as exc:
            log.warning("checkpoint.access_unchecked", error=str(exc))
            return
        for run in runs:
            try:
                spec = parse_spec(run.spec_toml, where=f"run {run.id}")
            except B300Error:
                continue
            if spec.checkpoint.dir and (why := checkpoint_dir_problem(
                    spec.checkpoint.dir, self.config.checkpoints.roots)):
                log.error("checkpoint.not_writable", run=run.id, why=why)

    def _arm_node_trigger(self) -> None:
        """Have slurmctld wake us when a node goes down (``strigger``); polling
        stays the safety net. The program is a tiny script in the state dir
        (see :func:`_trigger_script`), so slurmctld runs no string of ours
        through a shell."""
        if self.recovery is None or not self.config.recovery.node_trigger:
            return
        program = trigger_program(self.config)
        script = _trigger_script(self.config.socket)
        try:
            tmp = program + ".tmp"
            with open(tmp, "w") as f:
                f.write(script)
            os.chmod(tmp, 0o755)  # noqa: S103 - slurmctld (SlurmUser) must execute it
            os.replace(tmp, program)
            armed = self.slurm.ensure_node_down_trigger(program)
        except (OSError, SlurmError) as exc:
            log.warning("trigger.not_armed", error=str(exc))
            return
        log.info("trigger.armed" if armed else "trigger.not_allowed", program=program)


def _trigger_script(socket_path: str) -> str:
    """The node-down trigger program: Python in isolated mode without site-packages
    (``-IS``: no import of b300, its dependencies or anything on the path), one
    ``wake`` request on the control socket. slurmctld runs it as the user who set the
    trigger; that user must be allowed on the socket (root, b300, or the admin group)."""
    return (f"#!{sys.executable} -IS\n"
            "# Written by b300d: slurmctld runs this when a node goes down (strigger).\n"
            "# Standard library only: ask the daemon for a poll cycle now.\n"
            "import json, socket, sys\n"
            f"SOCKET = {json.dumps(socket_path)}\n"
            "why = ('node-down ' + ' '.join(sys.argv[1:]))[:200]\n"
            "with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:\n"
            "    s.settimeout(10)\n"
            "    s.connect(SOCKET)\n"
            "    s.sendall(json.dumps({'op': 'wake', 'why': why}).encode() + b'\\n')\n"
            "    reply = s.makefile('rb').readline()\n"
            "sys.exit(0 if reply and json.loads(reply).get('ok') else 1)\n")
