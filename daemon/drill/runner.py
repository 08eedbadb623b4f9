"""The daemon's side of ``b300ctl drill``: inject the failure, measure, record.

:meth:`DrillWatch.start` (a control request from an admin) checks the refusal rules
(:func:`b300.drill.timeline.drill_refusal`), records ``drill.started`` with what the run
was at (the drill's zero), injects the failure outside the action lock (``down``:
``scontrol update state=down`` through the Slurm client; ``crash``: the site's
``[drill] crash_command``, an argv with the node as an element of its own, never a
shell), and records ``drill.injected``. From then on the daemon owns the drill, not
the client: a scheduled job (:meth:`tick`, every half second while a drill is open,
also after a restart of the daemon: open drills are events in the store) watches the
run's next attempt and its progress file until the run trains again past the resume
step, or the drill's timeout passes, or the run ends. It then returns the node to
service if it was healthy before (``[drill] restore_command`` first for a crash),
and records ``drill.finished`` with the figures (:func:`b300.drill.timeline.drill_figures`).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import structlog

from ..checkpoints.layouts import load_layout
from ..checkpoints.resume_point import newest_verified
from ..config import Config
from ..cycle.node_actions import NodeActions
from ..errors import B300Error, NotFoundError, SlurmError, UsageError
from ..events import DRILLS, Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Attempt, AttemptState, Event
from ..payloads import DrillFinished, DrillInjected
from ..plugin_registry import PluginRegistry
from ..recovery.hangs import read_progress
from ..scheduling import table as timed
from ..spec import spec_of
from .crash_config import node_argv
from .timeline import (
    MAX_TIMEOUT_S,
    DrillStart,
    drill_figures,
    drill_refusal,
    next_attempt,
    node_healthy,
    open_drills,
    pick_node,
    trained_again,
)

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]
TICK_S = 0.5
_JOB_ID = "drill"
# Open drills are looked for this far back (the longest drill, and the time to finish it).
_LOOKBACK = timedelta(seconds=MAX_TIMEOUT_S + 900)


class DrillError(B300Error):
    """The failure could not be injected (the drill is recorded as failed)."""


class DrillWatch:
    """Failure drills of the running daemon (one object for its life)."""

    def __init__(self, store: Store, slurm: SlurmClient, *, config: Callable[[], Config],
                 lock: threading.Lock, clock: Clock, fence: Callable[[str], None],
                 plugins: PluginRegistry | None, wake: Callable[[], None]) -> None:
        self._store = store
        self._slurm = slurm
        self._config = config
        self._lock = lock
        self._clock = clock
        self._fence = fence
        self._plugins = plugins
        self._wake = wake
        self._scheduler: Any = None
        self._trained: dict[int, tuple[datetime, int]] = {}
        self._last_step: dict[int, int] = {}          # highest step of the drilled attempt seen
        self._resume_steps: dict[int, dict[str, int]] = {}  # checkpoint steps by path, per drill

    # -- scheduling ------------------------------------------------------------

    def attach(self, scheduler: Any) -> None:
        """The daemon's scheduler (once active); a drill left open by an earlier daemon goes on."""
        self._scheduler = scheduler
        try:
            if open_drills(self._drill_events()):
                log.info("drill.resumed_watching")
                self._arm()
        except B300Error as exc:
            log.warning("drill.not_resumed", error=str(exc))

    def _arm(self) -> None:
        if self._scheduler is not None:
            timed.every(self._scheduler, _JOB_ID, self.tick, TICK_S)

    def _disarm(self) -> None:
        try:
            timed.drop(self._scheduler, _JOB_ID)
        except Exception:  # already removed, or the scheduler is stopping
            log.debug("drill.disarm_skipped")

    # -- a drill begins ------------------------------------------------------------

    def start(self, run_id: str, *, node: str | None, method: str, timeout_s: float, actor: str,
              dropped: Callable[[], str | None]) -> dict[str, Any]:
        """Check, record, inject; the drill's first record (the measuring goes on here)."""
        cfg = self._config()
        run = self._store.get_run(run_id)
        spec = spec_of(run)
        # The checkpoint folder is read outside the lock (a parallel filesystem may be slow).
        resume, _ = newest_verified(spec, self._plugins)
        steps = self._checkpoint_steps(spec)
        with self._lock:
            if why := dropped():
                raise DrillError(f"drill dropped: {why}")
            run = self._store.get_run(run_id)
            attempts = self._store.attempts(run_id)
            now = self._clock()
            mine = [d for d in open_drills(self._drill_events(run_id)) if d.run_id == run_id]
            why = drill_refusal(run, attempts, node=node, method=method, has_checkpoint=resume is not None,
                                has_progress_file=bool(spec.health.progress_file),
                                recovery_on=cfg.recovery.enabled,
                                crash_command=bool(cfg.drill.crash_command),
                                open_drill=mine[0].id if mine else None)
            if why:
                raise UsageError(why)
            attempt = attempts[-1]
            victim = pick_node(attempt, node)
            state, reason = self._node_state(victim)
            at_failure = trained_again(read_progress(spec.health.progress_file or "", attempt.start), -1)
            self._fence(f"drill of run {run_id} on {victim}")
            data = {"node": victim, "method": method, "attempt": attempt.number,
                    "job_id": attempt.slurm_job_id, "step_at_failure": at_failure,
                    "resume_step": steps.get(resume or ""), "node_state": state,
                    "node_was_healthy": node_healthy(state, reason), "timeout_s": timeout_s}
            [started] = self._store.append_events([NewEvent(
                Kind.DRILL_STARTED, run_id=run_id, attempt_id=attempt.id, node=victim, actor=actor,
                data=data)], now)
        log.warning("drill.started", drill=started.id, run=run_id, node=victim, method=method, by=actor)
        t0 = time.monotonic()
        try:
            output = self._inject(started.id, victim, method, actor)
        except B300Error as exc:
            self._store.append_events([NewEvent(
                Kind.DRILL_FINISHED, run_id=run_id, attempt_id=attempt.id, node=victim, actor=actor,
                data={"drill": started.id, "node": victim, "method": method,
                      "outcome": "injection failed", "error": str(exc)[:500],
                      "returned": "untouched"})], self._clock())
            raise
        inject_s = round(time.monotonic() - t0, 3)
        self._store.append_events([NewEvent(
            Kind.DRILL_INJECTED, run_id=run_id, attempt_id=attempt.id, node=victim, actor=actor,
            data={"drill": started.id, "node": victim, "method": method, "inject_s": inject_s,
                  "output": output[-500:]})], self._clock())
        self._arm()
        self._wake()
        return {"drill": started.id, "run": run_id, "started_at": started.ts.isoformat(), **data,
                "inject_s": inject_s}

    def _inject(self, drill: int, node: str, method: str, actor: str) -> str:
        if method == "down":
            NodeActions(self._store, self._slurm, self._clock).down(node, f"b300 drill {drill} by {actor}")
            return ""
        argv = node_argv(self._config().drill.crash_command, node)
        return self._command(argv, "crash")

    def _command(self, argv: list[str], what: str) -> str:
        timeout = self._config().drill.command_timeout_s
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            raise DrillError(f"the {what} command did not end within {timeout:g} s") from None
        except OSError as exc:
            raise DrillError(f"the {what} command could not run: {exc}") from None
        out = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            last = out.splitlines()[-1] if out else ""
            raise DrillError(f"the {what} command exited {proc.returncode}: {last[:300]}")
        return out

    def _node_state(self, node: str) -> tuple[str, str]:
        try:
            for n in self._slurm.nodes():
                if n.name == node:
                    return n.state, n.reason
        except SlurmError as exc:
            log.warning("drill.node_state_unknown", node=node, error=str(exc))
        return "", ""

    def _checkpoint_steps(self, spec: Any) -> dict[str, int]:
        if not spec.checkpoint.dir:
            return {}
        return {c.path: c.step for c in load_layout(spec.checkpoint.layout, self._plugins)
                .list_checkpoints(spec.checkpoint.dir)}

    # -- measuring ------------------------------------------------------------------

    def tick(self) -> None:
        """One look at every open drill (scheduled; never raises into the scheduler)."""
        try:
            opened = open_drills(self._drill_events())
            if not opened:
                self._disarm()
                return
            for d in opened:
                with structlog.contextvars.bound_contextvars(drill=d.id, run=d.run_id):
                    self._measure(d)
        except B300Error as exc:
            log.warning("drill.tick_failed", error=str(exc))
        except Exception:
            log.exception("drill.tick_crashed")

    def _measure(self, d: DrillStart) -> None:
        now = self._clock()
        run = self._store.get_run(d.run_id)
        spec = spec_of(run)
        attempts = self._store.attempts(d.run_id)
        later = next_attempt(d, attempts)
        progress = spec.health.progress_file or ""
        if later is None or later.state is not AttemptState.RUNNING:
            # The drilled attempt may run on for a while (and even save a checkpoint).
            drilled = next((a for a in attempts if a.id == d.attempt_id), None)
            step = trained_again(read_progress(progress, drilled.start if drilled else None), -1)
            if step is not None:
                self._last_step[d.id] = max(step, self._last_step.get(d.id, step))
        steps = self._steps(d, spec, later)
        resume_step = steps.get(later.resume_from or "", d.resume_step) if later else d.resume_step
        if later is not None and d.id not in self._trained and later.state is AttemptState.RUNNING:
            step = trained_again(read_progress(progress, later.start), resume_step)
            if step is not None:
                self._trained[d.id] = (now, step)
                log.info("drill.training_again", step=step, after_s=round((now - d.ts).total_seconds(), 2))
        if d.id in self._trained:
            self._finish(d, attempts, steps, "trained again")
        elif (now - d.ts).total_seconds() >= d.timeout_s:
            self._finish(d, attempts, steps, f"timed out after {d.timeout_s:g} s")
        elif run.state.is_terminal:
            self._finish(d, attempts, steps, f"run ended {run.state.value}")

    def _steps(self, d: DrillStart, spec: Any, later: Attempt | None) -> dict[str, int]:
        """Checkpoint steps by path: the store's records, and the run's folder listed once
        the next attempt names a checkpoint they do not know yet (saved after the drill began)."""
        steps = self._resume_steps.get(d.id)
        if steps is None:
            steps = {c.info.path: c.info.step for c in self._store.checkpoints.checkpoints(d.run_id)}
        if later is not None and later.resume_from and later.resume_from not in steps:
            steps = {**steps, **self._checkpoint_steps(spec)}
        self._resume_steps[d.id] = steps
        return steps

    def _finish(self, d: DrillStart, attempts: list[Attempt], steps: dict[str, int], outcome: str) -> None:
        figures = drill_figures(d, self._events_since(d), attempts, trained=self._trained.get(d.id),
                                resume_steps=steps, last_step=self._last_step.get(d.id))
        returned = self._return_node(d)
        self._store.append_events([NewEvent(
            Kind.DRILL_FINISHED, run_id=d.run_id, attempt_id=d.attempt_id, node=d.node, actor="drill",
            data={"drill": d.id, "node": d.node, "method": d.method, "outcome": outcome,
                  "returned": returned, **figures.as_data()})], self._clock())
        for memo in (self._trained, self._last_step, self._resume_steps):
            memo.pop(d.id, None)
        log.warning("drill.finished", outcome=outcome, returned=returned, **figures.as_data())

    def _return_node(self, d: DrillStart) -> str:
        """Put the node back in service if it was healthy before the drill; what was done."""
        if not d.node_was_healthy:
            return f"left as it is: it was {d.node_state or 'unknown'} before the drill"
        restore = self._config().drill.restore_command
        if d.method == "crash" and restore:
            try:
                self._command(node_argv(restore, d.node), "restore")
            except DrillError as exc:
                log.warning("drill.restore_failed", node=d.node, error=str(exc))
                return f"not returned: {exc}"
        try:
            with self._lock:
                self._fence(f"drill {d.id}: resume {d.node}")
                NodeActions(self._store, self._slurm, self._clock).resume(d.node, actor="drill")
        except SlurmError as exc:
            log.warning("drill.resume_failed", node=d.node, error=str(exc))
            return f"not returned: {exc}"
        return "resumed"

    # -- reading ----------------------------------------------------------------------

    def status(self, drill_id: int) -> dict[str, Any]:
        """A drill's record: its events by kind (``started``, ``injected``, ``finished``)."""
        mine = [e for e in self._store.events(kinds=list(DRILLS), after_id=max(0, drill_id - 1))
                if _drill_of(e) == drill_id]
        if not mine or mine[0].kind != Kind.DRILL_STARTED:
            raise NotFoundError(f"unknown drill {drill_id}")
        out: dict[str, Any] = {"drill": drill_id, "run": mine[0].run_id}
        for e in mine:
            out[e.kind.removeprefix("drill.")] = {"ts": e.ts.isoformat(), "actor": e.actor, **e.data}
        return out

    def _drill_events(self, run_id: str | None = None) -> list[Event]:
        return self._store.events(run_id=run_id, kinds=list(DRILLS), since=self._clock() - _LOOKBACK)

    def _events_since(self, d: DrillStart) -> list[Event]:
        by_id = {e.id: e for e in self._store.events(run_id=d.run_id, since=d.ts)}
        by_id.update((e.id, e) for e in self._store.events(node=d.node, since=d.ts))
        return list(by_id.values())


def _drill_of(e: Event) -> int | None:
    """The drill an event of :data:`b300.events.DRILLS` belongs to (a drill's id is the id of
    its ``drill.started``)."""
    if e.kind == Kind.DRILL_STARTED:
        return e.id
    return (DrillInjected.of(e).drill if e.kind == Kind.DRILL_INJECTED else DrillFinished.of(e).drill)
