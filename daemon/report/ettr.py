"""Each run's ETTR split and its interruptions by cause, from store records only (pure).

Effective training time ratio (ETTR) per run over the window: of the run's
wall time, the time its jobs trained. The time lost is split into

- **detect**: an interrupted attempt's last progress step (the job dead or hung from
  then on, whatever Slurm showed) -> the daemon classified it (``attempt.classified``);
  without a recorded last step, from the attempt's end;
- **queue**: an attempt was submitted (created) -> its job started;
- **restart**: a job started -> its first progress step (``attempt.progress`` events);
  without progress events it is counted 0 and the run says so;
- **recompute**: steps redone after a resume, i.e. from the first progress step of
  the new attempt until it passes the previous attempt's last step (interpolated
  between the progress points around it; past the newest one at the attempt's own
  pace). Without progress events it is *unknown* (never estimated);
- **other**: the rest of the wall time no attempt ran or waited (decisions,
  settle time, gaps).

Interruptions are ended attempts that were neither completed, cancelled nor
timed out, by cause: GPU, network, node down, hang, preemption, job error,
checkpoint signal (b300d's signal ended it), other infrastructure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..checkpoints.cadence import YoungDaly
from ..events import Kind
from ..model import Attempt, Event, Run
from ..payloads import AttemptProgress

CAUSES = ("GPU", "network", "node down", "hang", "preemption", "job error", "checkpoint signal",
          "other infrastructure")
NOT_INTERRUPTIONS = {"", "COMPLETED", "CANCELLED", "TIMEOUT"}
_GPU = re.compile(r"\bXid\b|NVRM|ECC|GPU has fallen off|nvidia-smi .*fail|row remap", re.IGNORECASE)
_NODE_DOWN = re.compile(r"NODE_FAIL|node fail|node down|Node failure|lost contact|not responding|"
                        r"DOWN\b", re.IGNORECASE)
_NETWORK = re.compile(r"NCCL|gloo|Connection (?:closed|reset|refused)|network|\bIB\b|infiniband|"
                      r"\bmlx5|link down|timed? ?out.*collective", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Window:
    since: datetime
    until: datetime

    @property
    def seconds(self) -> float:
        return (self.until - self.since).total_seconds()

    def overlap(self, start: datetime | None, end: datetime | None) -> float:
        """Seconds of [start, end) inside the window (end None: until the window's end)."""
        if start is None:
            return 0.0
        lo, hi = max(start, self.since), min(end or self.until, self.until)
        return max(0.0, (hi - lo).total_seconds())

    def contains(self, ts: datetime | None) -> bool:
        return ts is not None and self.since <= ts < self.until


@dataclass(frozen=True, slots=True)
class RunFigures:
    run_id: str
    name: str
    state: str
    attempts: int
    wall_s: float
    running_s: float
    detect_s: float
    queue_s: float
    restart_s: float
    recompute_s: float | None      # None: unknown (no progress events)
    other_s: float
    training_s: float
    notes: tuple[str, ...] = ()

    @property
    def ettr(self) -> float | None:
        return self.training_s / self.wall_s if self.wall_s > 0 else None


@dataclass(frozen=True, slots=True)
class Interruption:
    run_id: str
    attempt: int
    job_id: int | None
    ended: datetime
    outcome: str
    cause: str
    why: str


@dataclass(frozen=True, slots=True)
class RunInput:
    """One run as the report needs it: its record, attempts, spec figures, checkpoints."""

    run: Run
    attempts: Sequence[Attempt]
    nodes: int = 1
    gpus_per_node: int = 8
    checkpoint_interval_s: float | None = None
    checkpoints: Sequence[tuple[int, datetime, int, frozenset[str], frozenset[str]]] | None = None
    # (step, mtime, size_bytes, replicated_to, all targets tried) of the stored, not deleted ones
    young_daly: YoungDaly | None = None
    # attempt id -> the step it began at (0: from scratch, else its checkpoint's), where known
    start_steps: Mapping[int, int] = field(default_factory=dict)


def interruption_cause(attempt: Attempt) -> str:
    """The cause of an interruption, from the attempt's outcome and recorded evidence."""
    outcome = attempt.outcome
    if outcome == "PREEMPTED":
        return "preemption"
    if outcome == "HANG":
        return "hang"
    if outcome == "JOB_ERROR":
        return "job error"
    if outcome == "SIGNALLED":  # the daemon's checkpoint signal ended it (recovery.classify)
        return "checkpoint signal"
    ev = attempt.evidence or {}
    text = "\n".join(str(x) for key in ("log", "reasons") for x in (ev.get(key) or []))
    if _GPU.search(text):
        return "GPU"
    if attempt.state.value == "NODE_FAIL" or _NODE_DOWN.search(text):
        return "node down"
    if _NETWORK.search(text):
        return "network"
    return "other infrastructure"


def _progress_of(events: Sequence[Event], attempt_id: int) -> tuple[list[tuple[datetime, int]],
                                                                     tuple[datetime, int] | None]:
    """An attempt's progress points (time, step), oldest first, and its ``last`` point (the last
    step the ended attempt reached, None if not recorded). The time is when the job wrote the
    step (``at``: the progress file's mtime) where the daemon recorded it, else the event's."""
    points: list[tuple[datetime, int]] = []
    last: tuple[datetime, int] | None = None
    for e in events:
        if e.kind != Kind.ATTEMPT_PROGRESS or e.attempt_id != attempt_id:
            continue
        p = AttemptProgress.of(e)
        step = p.step
        if step is None:
            continue
        ts = e.ts
        if p.at is not None:
            try:
                ts = datetime.fromtimestamp(p.at, e.ts.tzinfo)
            except (OverflowError, OSError, ValueError):
                ts = e.ts
        points.append((ts, step))
        if p.last:
            last = (ts, step)
    points.sort()
    return points, last


_OWN_PACE = timedelta(minutes=1)


def _rate(points: Sequence[tuple[datetime, int]]) -> float | None:
    """Steps per second between the first and the last point, None if it cannot be told."""
    if len(points) < 2:
        return None
    (t0, s0), (t1, s1) = points[0], points[-1]
    dt = (t1 - t0).total_seconds()
    return (s1 - s0) / dt if dt > 0 and s1 > s0 else None


def _caught_up(points: Sequence[tuple[datetime, int]], target: int, rate: float | None,
               end: datetime | None) -> datetime | None:
    """When an attempt whose progress is ``points`` passed step ``target`` (the step the
    interrupted attempt before it had reached): between the two points around it, linearly;
    past its last point, at ``rate`` steps/s; never after ``end`` (its training end; None:
    the window's end). None: at ``end``."""
    prev = points[0]
    for ts, step in points:
        if step >= target:
            if step == prev[1]:
                return ts
            frac = (target - prev[1]) / (step - prev[1])
            return prev[0] + (ts - prev[0]) * max(0.0, min(1.0, frac))
        prev = (ts, step)
    if rate is None:
        return end
    ts, step = points[-1]
    eta = ts + timedelta(seconds=(target - step) / rate)
    return eta if end is None or eta < end else end


def run_figures(ri: RunInput, events: Sequence[Event], window: Window) -> RunFigures | None:
    """ETTR and lost time of one run in ``window``; None if it did not live in the window.

    An attempt trains from its first progress step to its end, or, when it was interrupted
    and the daemon recorded the last step it reached, to that step: the time from there to
    the daemon's classification is detection (the job was dead or hung, whatever Slurm
    said). Without progress events an attempt trains from its start to its end."""
    attempts = sorted(ri.attempts, key=lambda a: a.number)
    if not attempts:
        return None
    begin = min(ri.run.created_at, attempts[0].created_at)
    end = ri.run.updated_at if ri.run.state.is_terminal else None
    wall = window.overlap(begin, end)
    if wall <= 0:
        return None
    notes: list[str] = []
    classified = {e.attempt_id: e.ts for e in events if e.kind == Kind.ATTEMPT_CLASSIFIED}
    running = detect = queue = restart = training = 0.0
    recompute: float | None = 0.0
    restart_known = True
    prev_last_step: int | None = None
    pace_steps = 0
    pace_s = 0.0
    prev_interrupted = False
    # Whether the run's job reports progress at all (some attempt has a progress point).
    ids = {a.id for a in attempts}
    tracked = any(e.kind == Kind.ATTEMPT_PROGRESS and e.attempt_id in ids for e in events)
    for a in attempts:
        started = a.start
        stopped = a.end or (a.updated_at if a.state.is_terminal else None)
        interrupted = a.outcome not in NOT_INTERRUPTIONS or a.outcome == "TIMEOUT"
        points, last = _progress_of(events, a.id)
        queue += window.overlap(a.created_at, started if started is not None else a.end)
        if len(points) >= 2 and points[-1][1] > points[0][1]:
            pace_steps += points[-1][1] - points[0][1]
            pace_s += (points[-1][0] - points[0][0]).total_seconds()
        # Steps per second: the attempt's own pace over a minute or more, else the run's,
        # pooled over its attempts so far (a short attempt's two points alone are noise).
        own = points[-1][0] - points[0][0] if len(points) >= 2 else timedelta()
        rate = _rate(points) if own >= _OWN_PACE else (pace_steps / pace_s if pace_s > 0 else None)
        first_step = ri.start_steps.get(a.id)
        if points and started is not None and rate and first_step is not None \
                and points[0][1] > first_step + 1:
            # The first step the daemon saw is a poll after the job's first: go back to that
            # one (the attempt's start step + 1) at the attempt's pace, not before its start.
            t_obs, s_obs = points[0]
            back = t_obs - timedelta(seconds=(s_obs - first_step - 1) / rate)
            if back >= started:   # else the start step or the pace is wrong: keep what was seen
                points.insert(0, (back, first_step + 1))
        # Where this attempt's training ended: its last step if it was interrupted and that
        # step is known, else its end (None: still running at the window's end).
        train_end = last[0] if interrupted and last is not None and stopped is not None else stopped
        if a.end is not None and a.outcome not in ("", "COMPLETED", "CANCELLED"):
            detect += window.overlap(train_end if train_end is not None else a.end,
                                     classified.get(a.id, a.end))
        if started is not None:
            running += window.overlap(started, stopped)
            if points:
                restart += window.overlap(started, points[0][0])
                training += window.overlap(points[0][0], train_end)
            elif tracked:
                # The run reports progress, this attempt never did: all of it was start-up.
                restart += window.overlap(started, stopped)
            else:
                restart_known = False
                training += window.overlap(started, train_end)
        if prev_interrupted and started is not None and (points or not tracked):
            if points and prev_last_step is not None:
                if recompute is not None and points[0][1] < prev_last_step:
                    caught = _caught_up(points, prev_last_step, rate, train_end)
                    recompute += window.overlap(points[0][0], caught)
            else:
                recompute = None
        if points:
            # The run's high-water mark: a step any earlier attempt reached is redone work
            # (kept across attempts that made no progress: never started, stuck in start-up).
            top = max(s for _, s in points)
            prev_last_step = top if prev_last_step is None else max(prev_last_step, top)
        prev_interrupted = interrupted
    if not restart_known:
        notes.append("restart time counted as 0: no progress events for some attempts")
    if recompute is None:
        notes.append("recompute time unknown: no progress events around a resume")
    training = max(0.0, training - (recompute or 0.0))
    other = max(0.0, wall - training - restart - (recompute or 0.0) - detect - queue)
    return RunFigures(ri.run.id, ri.run.name, ri.run.state.value, len(attempts), wall, running, detect,
                      queue, restart, recompute, other, training, tuple(notes))
