"""Hang detection: a running attempt whose training step stops advancing is cancelled.

A step of the poll cycle. For every running attempt whose spec names a
``[health] progress_file``, the step in that file is compared with the last one
seen: no new step within ``hang_timeout`` (or no first step within
``startup_timeout``) is a hang, recorded as ``attempt.hang`` with the evidence,
and the job is cancelled; recovery then resubmits it (outcome HANG).

The steps seen are also the run's progress record (``attempt.progress`` events:
the first step, then at most every 5 minutes, and the last step an attempt
reached), which the weekly report turns into restart and recompute times. They
are idempotent across daemon restarts: the steps already recorded are read once
per attempt.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog

from ..errors import SlurmError
from ..events import Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Attempt, AttemptState
from ..payloads import AttemptProgress
from ..spec import spec_of

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]
# attempt.progress events: the first step, then at most this often (report: restart, recompute).
_PROGRESS_EVENT_EVERY = timedelta(minutes=5)


@dataclass(slots=True)
class _Progress:
    step: str
    since: datetime
    at: datetime | None = None   # when the job wrote that step: the progress file's mtime


def _written_at(path: str | None, attempt: Attempt, now: datetime) -> datetime | None:
    """The progress file's mtime if it lies inside ``attempt`` (between its start, its end and
    ``now``), else None: when the job wrote the step, which a poll sees up to one interval late."""
    if not path:
        return None
    try:
        at = datetime.fromtimestamp(os.stat(path).st_mtime, UTC)
    except (OSError, ValueError, OverflowError):
        return None
    lo = attempt.start
    # Slurm's end time is in whole seconds: the job's last write may be up to 1 s past it.
    hi = min(now, attempt.end + timedelta(seconds=1)) if attempt.end is not None else now
    if (lo is not None and at < lo) or at > hi:
        return None
    return at


def _older_than(path: str | None, start: datetime | None) -> bool:
    """Whether the progress file (a plain path) was last written before ``start``."""
    if not path or start is None:
        return False
    try:
        return datetime.fromtimestamp(os.stat(path).st_mtime, UTC) < start
    except (OSError, ValueError, OverflowError):
        return False


def _is_step(text: str) -> bool:
    """A step number as the job wrote it: ASCII digits only (``'²'.isdigit()`` is true)."""
    return text.isascii() and text.isdigit()


def _at_field(at: datetime | None) -> dict[str, float]:
    return {"at": round(at.timestamp(), 3)} if at is not None else {}


class HangWatch:
    """Follows running attempts' progress files; cancels the ones that stopped advancing."""

    def __init__(self, store: Store, slurm: SlurmClient, clock: Clock, *,
                 progress: Callable[[Attempt], str | None] | None = None,
                 withheld: Callable[..., None] | None = None) -> None:
        # withheld set (observe mode, recovery off): a hang is recorded once and its cancel
        # withheld (b300.safety.mode.Withheld); the job is left running.
        self._withheld = withheld
        self._held: set[int] = set()
        # progress: the training watch's step of an attempt ('' none yet), None where it does not
        # read the attempt (then the progress file is read here, as a pre-v1 snapshot).
        self._progress_of = progress
        self._store = store
        self._slurm = slurm
        self._clock = clock
        self._progress: dict[int, _Progress] = {}
        self._progress_recorded: dict[int, datetime] = {}
        # Steps already in the event log per attempt (read once per attempt, so a
        # restarted daemon does not record them again).
        self._recorded_steps: dict[int, set[int]] = {}

    def check(self, active: Sequence[Attempt]) -> int:
        """Look at the ``active`` attempts (the cycle's, after tracking); how many were cancelled."""
        now = self._clock()
        hung = 0
        live = {a.id for a in active}
        for gone in sorted(set(self._progress) - live):
            seen = self._progress.pop(gone)   # popped first: a failure here is not retried forever
            try:
                self._record_last_progress(gone, seen)
            except SlurmError:
                raise
            except Exception:  # one ended attempt's record must not stop the watch of the others
                log.exception("hangs.last_progress_failed", attempt_id=gone)
        self._progress = {k: v for k, v in self._progress.items() if k in live}
        self._progress_recorded = {k: v for k, v in self._progress_recorded.items() if k in live}
        self._recorded_steps = {k: v for k, v in self._recorded_steps.items() if k in live}
        for attempt in active:
            if attempt.state is not AttemptState.RUNNING or attempt.slurm_job_id is None:
                continue
            with structlog.contextvars.bound_contextvars(run=attempt.run_id, attempt=attempt.number,
                                                         job_id=attempt.slurm_job_id):
                try:
                    hung += self._check_one(attempt, now)
                except SlurmError:
                    raise
                except Exception:  # e.g. a spec or progress file that cannot be read: the others go on
                    log.exception("hangs.check_failed")
        return hung

    def _check_one(self, attempt: Attempt, now: datetime) -> int:
        assert attempt.slurm_job_id is not None
        spec = spec_of(self._store.get_run(attempt.run_id))
        if not spec.health.progress_file:
            return 0
        self._seed_progress(attempt)
        watched = self._progress_of(attempt) if self._progress_of is not None else None
        if watched and _older_than(spec.health.progress_file, attempt.start):
            watched = ""   # the snapshot an earlier attempt left: no step of this one yet
        step = watched if watched is not None else read_progress(spec.health.progress_file, attempt.start)
        seen = self._progress.get(attempt.id)
        if step == "":
            # No step yet in this attempt: it is still starting up.
            since = attempt.start or now
            limit = spec.health.startup_timeout_s
        else:
            if seen is None or seen.step != step:
                at = _written_at(spec.health.progress_file, attempt, now)
                self._progress[attempt.id] = _Progress(step, now, at)
                self._record_progress(attempt, step, now, at)
                return 0
            since, limit = seen.since, spec.health.hang_timeout_s
        stalled = (now - since).total_seconds()
        if stalled < limit:
            return 0
        if attempt.id in self._held:
            return 0
        data = {"job_id": attempt.slurm_job_id, "last_step": step or None,
                "stalled_s": round(stalled, 1), "progress_file": spec.health.progress_file}
        self._store.append_events([NewEvent(Kind.ATTEMPT_HANG, run_id=attempt.run_id,
                                            attempt_id=attempt.id, data=data)], now)
        log.warning("attempt.hang", **data)
        if self._withheld is not None:
            self._held.add(attempt.id)
            self._withheld("cancel", f"job {attempt.slurm_job_id}", now, run_id=attempt.run_id,
                           detail=f"no progress for {stalled:.0f} s (hang_timeout)")
            return 0
        self._slurm.cancel(attempt.slurm_job_id)
        return 1

    def _seed_progress(self, attempt: Attempt) -> None:
        """What an earlier daemon already recorded of this attempt's progress (once)."""
        if attempt.id in self._recorded_steps:
            return
        mine = [e for e in self._store.events(run_id=attempt.run_id, kinds=[Kind.ATTEMPT_PROGRESS])
                if e.attempt_id == attempt.id]
        self._recorded_steps[attempt.id] = {s for e in mine if (s := AttemptProgress.of(e).step) is not None}
        if mine:
            self._progress_recorded[attempt.id] = mine[-1].ts

    def _record_progress(self, attempt: Attempt, step: str, now: datetime, at: datetime | None = None) -> None:
        """An ``attempt.progress`` event: the first step seen, then at most every 5 minutes
        (the weekly report's restart and recompute times come from these); ``at``: when the
        job wrote it (the file's mtime), which the report prefers to the event's time."""
        last = self._progress_recorded.get(attempt.id)
        if not _is_step(step) or (last is not None and now - last < _PROGRESS_EVENT_EVERY):
            return
        steps = self._recorded_steps.setdefault(attempt.id, set())
        if int(step) in steps:
            return
        steps.add(int(step))
        self._progress_recorded[attempt.id] = now
        self._store.append_events([NewEvent(Kind.ATTEMPT_PROGRESS, run_id=attempt.run_id,
                                            attempt_id=attempt.id,
                                            data={"step": int(step), **_at_field(at)})], now)

    def _record_last_progress(self, attempt_id: int, seen: _Progress) -> None:
        """The last step an ended attempt reached, stamped when it was first seen (if not recorded
        yet): the steps after its checkpoint that the next attempt must redo.

        The progress file is read once more first: the job may have gone on for up to a poll
        interval after the step last seen. That reading counts only while the file was last
        written inside the ended attempt (no newer attempt has written it yet)."""
        attempt = self._store.get_attempt(attempt_id)
        spec = spec_of(self._store.get_run(attempt.run_id))
        now = self._clock()
        final = read_progress(spec.health.progress_file, attempt.start) if spec.health.progress_file else ""
        at = _written_at(spec.health.progress_file, attempt, now) if _is_step(final) else None
        if at is not None and _is_step(seen.step) and int(final) > int(seen.step) \
                and (seen.at is None or at >= seen.at):
            seen = _Progress(final, now, at)
        recorded = self._progress_recorded.get(attempt_id)
        if not _is_step(seen.step) or (recorded is not None and recorded >= seen.since):
            return
        if int(seen.step) in self._recorded_steps.get(attempt_id, set()):
            return
        self._store.append_events([NewEvent(Kind.ATTEMPT_PROGRESS, run_id=attempt.run_id, attempt_id=attempt_id,
                                            data={"step": int(seen.step), "last": True,
                                                  **_at_field(seen.at)})], seen.since)


def read_progress(path: str, started: datetime | None) -> str:
    """The step in a progress file (JSON ``{"step": N}`` or a number), '' if none yet.

    A file older than the attempt's start belongs to an earlier attempt."""
    try:
        st = os.stat(path)
        if started is not None and datetime.fromtimestamp(st.st_mtime, UTC) < started:
            return ""
        text = Path(path).read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return ""
    try:
        doc = json.loads(text)
    except ValueError:
        return text.strip()[:64]
    if isinstance(doc, dict):
        return str(doc.get("step", ""))[:64]
    return str(doc)[:64]
