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
- checks the schedule: a run whose newest complete checkpoint is older than
  its interval raises a ``checkpoint.overdue`` event once (and its job gets
  the configured signal, e.g. USR1, at most once per interval).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import structlog

from ..errors import B300Error
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Run, RunState
from ..spec import parse_spec
from ..store.checkpoint_store import CheckpointStore
from .layouts import load_layout
from .manifest import ensure_manifest, read_manifest, verify
from .schedule import CheckpointWatcher

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
        checkpoints: CheckpointStore,
        slurm: SlurmClient,
        clock: Callable[[], datetime],
        *,
        signal: str | None = "USR1",
        manifests_per_pass: int = 2,
    ) -> None:
        self._store = store
        self._checkpoints = checkpoints
        self._clock = clock
        self._per_pass = manifests_per_pass
        self._watcher = CheckpointWatcher(slurm, load_layout, signal=signal)
        self._overdue: set[str] = set()

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
        found = load_layout(spec.checkpoint.layout).list_checkpoints(root)
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
        pairs = [(run, self._store.attempts(run.id)) for run in runs]
        now = self._clock()
        alerts = self._watcher.check(pairs, now)
        overdue = {a.run_id for a in alerts}
        events = [NewEvent(a.kind, run_id=a.run_id, data={"message": a.message, **a.data})
                  for a in alerts if a.run_id not in self._overdue]
        events += [NewEvent("checkpoint.ok", run_id=r, data={"message": "schedule met again"})
                   for r in self._overdue - overdue]
        if events:
            self._store.append_events(events, now)
            for a in alerts:
                if a.run_id not in self._overdue:
                    log.warning(a.kind, run=a.run_id, message=a.message)
        self._overdue = overdue
