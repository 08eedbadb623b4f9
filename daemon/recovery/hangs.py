"""Hang detection: a running attempt whose training step stops advancing is cancelled.

A step of the poll cycle. For every running attempt whose spec names a
``[health] progress_file``, the step in that file is compared with the last one
seen: no new step within ``hang_timeout`` (or no first step within
``startup_timeout``) is a hang, recorded as ``attempt.hang`` with the evidence,
and the job is cancelled; recovery then resubmits it (outcome HANG).

What to do is decided each cycle by :func:`hang_decision` (pure) from the attempt,
its limits, the step read, the step seen before and whether an ``attempt.hang`` is
already recorded for the attempt: a hang recorded before the daemon died, whose job
still runs, is cancelled again on the next cycle (``scancel`` again is harmless),
never recorded a second time nor timed again from zero (the hangs recorded are read
from the event log once per attempt, with its progress). :class:`HangWatch` reads,
asks, acts and records.

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
from enum import StrEnum
from pathlib import Path

import structlog

from ..errors import SlurmError
from ..events import Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Attempt, AttemptState
from ..payloads import AttemptProgress
from ..safety.faults import crashpoint
from ..spec import HealthPolicy, spec_of

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]
# attempt.progress events: the first step, then at most this often (report: restart, recompute).
_PROGRESS_EVENT_EVERY = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class StepSeen:
    """A step of an attempt as the watch first saw it."""

    step: str
    since: datetime              # the cycle that first saw it
    at: datetime | None = None   # when the job wrote that step: the progress file's mtime


class HangAction(StrEnum):
    NOTHING = "nothing"
    PROGRESS = "progress"            # a new step: the stall timer starts again
    HANG = "hang"                    # record attempt.hang, then cancel the job
    CANCEL = "cancel"                # attempt.hang recorded earlier and the job still runs: cancel again
    HANG_WITHHELD = "hang_withheld"  # observe mode: record attempt.hang, withhold the cancel
    WITHHELD = "withheld"            # observe mode, attempt.hang recorded earlier: the cancel stays withheld


@dataclass(frozen=True, slots=True)
class HangDecision:
    action: HangAction
    step: str = ""                 # the step read this cycle ('' none yet)
    seen: StepSeen | None = None   # the step seen to keep for the next cycle
    moved: bool = False            # ``seen`` is new this cycle (its attempt.progress may be due)
    stalled_s: float = 0.0         # how long without a new step (of the limit that applies)

    @property
    def records_hang(self) -> bool:
        return self.action in (HangAction.HANG, HangAction.HANG_WITHHELD)

    @property
    def cancels(self) -> bool:
        return self.action in (HangAction.HANG, HangAction.CANCEL)

    @property
    def withholds(self) -> bool:
        return self.action in (HangAction.HANG_WITHHELD, HangAction.WITHHELD)


def hang_decision(attempt: Attempt, health: HealthPolicy, step: str, seen: StepSeen | None, *,
                  hang_recorded: bool, withholding: bool, now: datetime,
                  mtime: datetime | None = None) -> HangDecision:
    """What the hang watch does about ``attempt`` this cycle (pure).

    ``step``: the step read this cycle ('' none yet); ``seen``: the step seen before (None:
    none, or a daemon that just started); ``hang_recorded``: an ``attempt.hang`` of this
    attempt is in the event log; ``withholding``: observe mode, the cancel is withheld;
    ``mtime``: the progress file's mtime, kept as when a new step was written if it lies
    inside the attempt.

    An attempt that is not RUNNING (or has no job, or whose spec names no progress file) is
    left alone. A recorded hang of a running attempt is cancelled again, whatever the step,
    and never recorded again. Otherwise a new step starts the timer again; no step yet is
    measured from the attempt's start against ``startup_timeout_s``, an unchanged step from
    when it was first seen against ``hang_timeout_s``."""
    if attempt.state is not AttemptState.RUNNING or attempt.slurm_job_id is None \
            or not health.progress_file:
        return HangDecision(HangAction.NOTHING, step, seen)
    moved = step != "" and (seen is None or seen.step != step)
    if moved:
        seen = StepSeen(step, now, _inside(mtime, attempt, now))
    if hang_recorded and not withholding:
        return HangDecision(HangAction.CANCEL, step, seen, moved)
    if moved:
        return HangDecision(HangAction.PROGRESS, step, seen, True)
    if step == "" or seen is None:
        since, limit = attempt.start or now, health.startup_timeout_s
    else:
        since, limit = seen.since, health.hang_timeout_s
    stalled = (now - since).total_seconds()
    if stalled < limit:
        action = HangAction.NOTHING
    elif hang_recorded:
        action = HangAction.WITHHELD
    else:
        action = HangAction.HANG_WITHHELD if withholding else HangAction.HANG
    return HangDecision(action, step, seen, stalled_s=stalled)


def _mtime(path: str | None) -> datetime | None:
    if not path:
        return None
    try:
        return datetime.fromtimestamp(os.stat(path).st_mtime, UTC)
    except (OSError, ValueError, OverflowError):
        return None


def _inside(at: datetime | None, attempt: Attempt, now: datetime) -> datetime | None:
    """``at`` (the progress file's mtime) if it lies inside ``attempt`` (between its start, its
    end and ``now``), else None: when the job wrote the step, which a poll sees up to one
    interval late."""
    if at is None:
        return None
    lo = attempt.start
    # Slurm's end time is in whole seconds: the job's last write may be up to 1 s past it.
    hi = min(now, attempt.end + timedelta(seconds=1)) if attempt.end is not None else now
    if (lo is not None and at < lo) or at > hi:
        return None
    return at


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
        # withheld (b300.safety.mode.Withheld, once per daemon life); the job is left running.
        self._withheld = withheld
        # progress: the training watch's step of an attempt ('' none yet), None where it does not
        # read the attempt (then the progress file is read here, as a pre-v1 snapshot).
        self._progress_of = progress
        self._store = store
        self._slurm = slurm
        self._clock = clock
        self._progress: dict[int, StepSeen] = {}
        self._progress_recorded: dict[int, datetime] = {}
        # Steps already in the event log per attempt (read once per attempt, so a
        # restarted daemon does not record them again).
        self._recorded_steps: dict[int, set[int]] = {}
        # Attempts with an attempt.hang in the event log: read with the steps (once per
        # attempt, so a restarted daemon knows the hangs an earlier one recorded), then
        # kept as this watch records them (the only writer of attempt.hang).
        self._hang_recorded: set[int] = set()

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
        self._hang_recorded &= live
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
        """Read, decide (:func:`hang_decision`), act, record."""
        assert attempt.slurm_job_id is not None
        health = spec_of(self._store.get_run(attempt.run_id)).health
        path = health.progress_file
        if not path:
            return 0
        self._seed(attempt)
        watched = self._progress_of(attempt) if self._progress_of is not None else None
        step = watched if watched is not None else read_progress(path, attempt.start)
        mtime = _mtime(path)
        if watched and mtime is not None and attempt.start is not None and mtime < attempt.start:
            step = ""   # the snapshot an earlier attempt left: no step of this one yet
        decision = hang_decision(attempt, health, step, self._progress.get(attempt.id),
                                 hang_recorded=attempt.id in self._hang_recorded,
                                 withholding=self._withheld is not None, now=now, mtime=mtime)
        if decision.moved and decision.seen is not None:
            self._progress[attempt.id] = decision.seen
            self._record_progress(attempt, step, now, decision.seen.at)
        if decision.records_hang:
            data = {"job_id": attempt.slurm_job_id, "last_step": step or None,
                    "stalled_s": round(decision.stalled_s, 1), "progress_file": path}
            self._store.append_events([NewEvent(Kind.ATTEMPT_HANG, run_id=attempt.run_id,
                                                attempt_id=attempt.id, data=data)], now)
            self._hang_recorded.add(attempt.id)
            log.warning("attempt.hang", **data)
            crashpoint("hang_recorded", attempt.number)
        if decision.withholds and self._withheld is not None:
            self._withheld("cancel", f"job {attempt.slurm_job_id}", now, run_id=attempt.run_id,
                           detail=f"no progress for {decision.stalled_s:.0f} s (hang_timeout)")
            return 0
        if not decision.cancels:
            return 0
        if decision.action is HangAction.CANCEL:
            log.info("hangs.cancel_again", reason="attempt.hang recorded, the job still runs")
        self._slurm.cancel(attempt.slurm_job_id)
        return 1

    def _seed(self, attempt: Attempt) -> None:
        """What an earlier daemon already recorded of this attempt (once): its progress, and
        whether it recorded a hang."""
        if attempt.id in self._recorded_steps:
            return
        recorded = [e for e in self._store.events(run_id=attempt.run_id,
                                                  kinds=[Kind.ATTEMPT_PROGRESS, Kind.ATTEMPT_HANG])
                    if e.attempt_id == attempt.id]
        if any(e.kind == Kind.ATTEMPT_HANG for e in recorded):
            self._hang_recorded.add(attempt.id)
        mine = [e for e in recorded if e.kind == Kind.ATTEMPT_PROGRESS]
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

    def _record_last_progress(self, attempt_id: int, seen: StepSeen) -> None:
        """The last step an ended attempt reached, stamped when it was first seen (if not recorded
        yet): the steps after its checkpoint that the next attempt must redo.

        The progress file is read once more first: the job may have gone on for up to a poll
        interval after the step last seen. That reading counts only while the file was last
        written inside the ended attempt (no newer attempt has written it yet)."""
        attempt = self._store.get_attempt(attempt_id)
        spec = spec_of(self._store.get_run(attempt.run_id))
        now = self._clock()
        path = spec.health.progress_file
        final = read_progress(path, attempt.start) if path else ""
        at = _inside(_mtime(path), attempt, now) if _is_step(final) else None
        if at is not None and _is_step(seen.step) and int(final) > int(seen.step) \
                and (seen.at is None or at >= seen.at):
            seen = StepSeen(final, now, at)
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
