"""The daemon's periodic checkpoint pass: list, fingerprint, and check the schedule.

Every ``check_interval`` the daemon, for each run that is not finished and
has a checkpoint folder:

- lists its checkpoints through the run's layout and records them;
- makes the checksum manifest of complete checkpoints that have none yet
  (newest first, a bounded number per pass, outside the action lock: hashing
  a multi-GB checkpoint must not hold up recovery), so that a resume can
  later verify the bytes it resumes from;
  (runs that ended in the last week too: their last checkpoints still need
  a manifest before they can be copied offsite);
- checks the schedule (:class:`~.schedule.ScheduleEnforcer`): one
  ``checkpoint.overdue`` alert per overdue episode, one ``checkpoint.signal``
  event per signal sent to a job whose spec opts in (at most one per interval),
  one ``checkpoint.ok`` when a running attempt's schedule is met again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import structlog

from ..errors import B300Error
from ..events import SCHEDULE, Kind
from ..interfaces import CheckpointLayout, CheckpointRepository, SlurmClient, Store
from ..model import Run, RunState
from ..payloads import CheckpointOk, CheckpointOverdue, CheckpointSignal, Recorded
from ..plugin_registry import PluginRegistry
from ..spec import parse_spec
from .cadence import HISTORY, ScheduleEnforcer
from .layouts import load_layout
from .manifest import ensure_manifest, read_manifest, verify

log = structlog.get_logger(__name__)
_ACTIVE = [RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING, RunState.RECOVERING]
ENDED_RUNS_KEPT_FOR = timedelta(days=7)


def runs_to_look_after(store: Store, now: datetime) -> list[Run]:
    """Runs whose checkpoints the daemon looks after: not ended, or ended in the last week."""
    return [r for r in store.list_runs()
            if not r.state.is_terminal or now - r.updated_at <= ENDED_RUNS_KEPT_FOR]


class CheckpointPass:
    """One object for the daemon's life; :meth:`run_once` is the scheduled job."""

    def __init__(
        self,
        store: Store,
        checkpoints: CheckpointRepository,
        slurm: SlurmClient,
        clock: Callable[[], datetime],
        *,
        plugins: PluginRegistry,
        allow_signals: bool = True,
        signal_grace_s: float = 300.0,
        manifests_per_pass: int = 2,
        signals_held_back: str = "",
    ) -> None:
        self._store = store
        self._plugins = plugins
        self._checkpoints = checkpoints
        self._clock = clock
        self._per_pass = manifests_per_pass
        self._watcher = ScheduleEnforcer(slurm, self._layout, allow_signals=allow_signals,
                                          signal_grace_s=signal_grace_s, held_back=signals_held_back)
        self._restored = False

    def _layout(self, name: str) -> CheckpointLayout:
        return load_layout(name, self._plugins)

    def run_once(self) -> None:
        """One pass; failures are logged, never raised into the scheduler."""
        try:
            self._pass()
        except B300Error as exc:
            log.warning("checkpoints.pass_failed", error=str(exc))
        except Exception:
            log.exception("checkpoints.pass_crashed")

    def _fingerprint(self, run: Run) -> None:
        """List the run's checkpoints; give the newest ones without a verdict a manifest.

        A checkpoint with a manifest but no verdict in the store (the daemon
        stopped between the two, or the files changed since) is verified against it.
        """
        spec = parse_spec(run.spec_toml, where=f"run {run.id}")
        root = spec.checkpoint.dir
        if not root:
            return
        found = self._layout(spec.checkpoint.layout).list_checkpoints(root)
        self._checkpoints.record_listing(run.id, found, self._clock())
        verdicts = {c.info.path: c.verified for c in self._checkpoints.checkpoints(run.id)}
        made = 0
        for ckpt in sorted(found, key=lambda c: c.step, reverse=True):
            if made >= self._per_pass:
                break
            if not ckpt.complete or verdicts.get(ckpt.path) is not None:
                continue
            if read_manifest(ckpt.path) is None:
                ensure_manifest(ckpt.path, self._clock(), root=root)
                ok, problems = True, tuple[str, ...]()
            else:
                result = verify(ckpt.path, root=root)
                ok, problems = result.ok, result.problems
            self._checkpoints.record_verification(run.id, ckpt.path, ok, self._clock(), problems)
            made += 1

    def _pass(self) -> None:
        for run in runs_to_look_after(self._store, self._clock()):
            try:
                self._fingerprint(run)
            except B300Error as exc:
                log.warning("checkpoints.run_failed", run=run.id, error=str(exc))
        runs = self._store.list_runs(_ACTIVE)
        now = self._clock()
        if not self._restored:
            # Episodes open before a restart: no second page, no signal sooner than one interval.
            self._watcher.restore(self._store.events(kinds=list(SCHEDULE), since=now - HISTORY))
            self._restored = True
        pairs = [(run, self._store.attempts(run.id)) for run in runs]
        history = self._store.attempts_since(now - HISTORY)
        events = self._watcher.check(pairs, history, now)
        if events:
            self._store.append_events(events, now)
            for e in events:
                log.warning(e.kind, run=e.run_id, message=_message(e))


def _message(e: Recorded) -> str:
    """What an event of the checkpoint schedule says, in words."""
    if e.kind == Kind.CHECKPOINT_OVERDUE:
        return CheckpointOverdue.of(e).message
    if e.kind == Kind.CHECKPOINT_SIGNAL:
        return CheckpointSignal.of(e).message
    return CheckpointOk.of(e).message if e.kind == Kind.CHECKPOINT_OK else ""
