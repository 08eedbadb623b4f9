"""The weekly report's figures, computed from store records only (pure: no I/O, no clock).

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
from ..events import DRAINS, RETURNS, Kind
from ..model import Attempt, Event, Run
from ..training.stats import median
from ..triage.figures import TriageFigures
from .spares import SpareFigures

CAUSES = ("GPU", "network", "node down", "hang", "preemption", "job error", "checkpoint signal",
          "other infrastructure")
_NOT_INTERRUPTIONS = {"", "COMPLETED", "CANCELLED", "TIMEOUT"}
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
class NodeChange:
    ts: datetime
    node: str
    kind: str
    actor: str
    reason: str


@dataclass(frozen=True, slots=True)
class CheckpointFigures:
    run_id: str
    newest_step: int | None
    newest_age_s: float | None
    interval_s: float
    overdue: bool
    stored_bytes: int
    count: int
    replication_lag_s: float | None   # age of the newest checkpoint not yet replicated (0: all are)
    targets: tuple[str, ...] = ()
    young_daly_s: float | None = None  # the Young/Daly interval beside interval_s (None: not known yet)
    save_s: float | None = None        # its inputs: the median save time...
    mtbf_s: float | None = None        # ...and the time between failures for the run's nodes
    young_daly: str = ""               # the advice in words, with every input


@dataclass(frozen=True, slots=True)
class TrainingRunFigures:
    """A run's training figures in the window (issue 17): the medians of the
    ``training.figures`` records (None: the job reports no progress, or no MFU inputs),
    queue time per attempt, and how often recovery resubmitted it."""

    run_id: str
    mfu: float | None
    tokens_per_s: float | None
    queue_s_per_attempt: float | None
    recoveries: int
    recoveries_per_day: float | None


@dataclass(frozen=True, slots=True)
class TrainingFindingRow:
    """A loss spike or a straggler found in the window."""

    ts: datetime
    run_id: str
    kind: str
    host: str | None
    step: int | None
    evidence: str


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


@dataclass(frozen=True, slots=True)
class DrillRow:
    """One failure drill of the window (``b300ctl drill``): its ``drill.finished`` figures."""

    ts: datetime
    run_id: str
    node: str
    method: str
    outcome: str
    detect_s: float | None
    excluded_s: float | None
    resubmit_s: float | None
    allocation_s: float | None
    training_s: float | None
    resume_step: int | None
    steps_lost: int | None


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _step(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def drill_rows(events: Sequence[Event], window: Window) -> tuple[DrillRow, ...]:
    """The drills that finished in ``window``, oldest first."""
    rows = []
    for e in events:
        if e.kind != Kind.DRILL_FINISHED or not window.contains(e.ts):
            continue
        d = e.data
        rows.append(DrillRow(e.ts, e.run_id or "?", str(d.get("node") or e.node or "?"),
                             str(d.get("method", "")), str(d.get("outcome", "")),
                             _num(d.get("detect_s")), _num(d.get("excluded_s")),
                             _num(d.get("resubmit_s")), _num(d.get("allocation_s")), _num(d.get("training_s")),
                             _step(d.get("resume_step")), _step(d.get("steps_lost"))))
    return tuple(sorted(rows, key=lambda r: r.ts))


@dataclass(frozen=True, slots=True)
class WeeklyReport:
    window: Window
    generated_at: datetime
    runs: tuple[RunFigures, ...]
    interruptions: tuple[Interruption, ...]
    by_cause: dict[str, int]
    drained: tuple[NodeChange, ...]
    returned: tuple[NodeChange, ...]
    drift_findings: dict[str, int]        # probe -> findings opened in the window
    drift_open: int | None                # open findings now (None: drift not configured)
    checkpoints: tuple[CheckpointFigures, ...] | None
    jobs: int
    gpu_hours: float
    notes: tuple[str, ...] = field(default=())
    drills: tuple[DrillRow, ...] = field(default=())
    training: tuple[TrainingRunFigures, ...] = ()
    training_findings: tuple[TrainingFindingRow, ...] = ()
    spares: SpareFigures | None = None    # None: no pool held, no run with spare nodes
    triage: TriageFigures | None = None   # drains per cause, time to return, verdicts, lemons

    @property
    def ettr(self) -> float | None:
        """Cluster ETTR: training time over wall time, all runs together."""
        wall = sum(r.wall_s for r in self.runs)
        return sum(r.training_s for r in self.runs) / wall if wall > 0 else None


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
        step = e.data.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        at = e.data.get("at")
        ts = e.ts
        if isinstance(at, int | float) and not isinstance(at, bool):
            try:
                ts = datetime.fromtimestamp(float(at), e.ts.tzinfo)
            except (OverflowError, OSError, ValueError):
                ts = e.ts
        points.append((ts, step))
        if e.data.get("last") is True:
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
        interrupted = a.outcome not in _NOT_INTERRUPTIONS or a.outcome == "TIMEOUT"
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


def training_figures(f: RunFigures, events: Sequence[Event], window: Window) -> TrainingRunFigures:
    """MFU and tokens/s (medians of the run's ``training.figures`` in the window), queue time
    per attempt and recovery frequency (``recovery.resubmit`` per day of the run's wall time)."""
    mine = [e for e in events if e.run_id == f.run_id and window.contains(e.ts)]

    def med(key: str) -> float | None:
        values = [float(v) for e in mine if e.kind == Kind.TRAINING_FIGURES
                  and isinstance(v := e.data.get(key), int | float) and not isinstance(v, bool)]
        return median(values) if values else None

    recoveries = sum(e.kind == Kind.RECOVERY_RESUBMIT for e in mine)
    return TrainingRunFigures(
        f.run_id, med("mfu"), med("tokens_per_s"), f.queue_s / f.attempts if f.attempts else None,
        recoveries, recoveries / (f.wall_s / 86400) if f.wall_s > 0 else None)


def training_findings(events: Sequence[Event], window: Window) -> tuple[TrainingFindingRow, ...]:
    """The loss spikes (and NaN losses) and stragglers of the window, oldest first."""
    kinds = (Kind.TRAINING_LOSS_SPIKE, Kind.TRAINING_LOSS_NAN, Kind.TRAINING_STRAGGLER)
    rows = [TrainingFindingRow(e.ts, e.run_id or "?", e.kind.removeprefix("training."), e.node,
                               step if isinstance(step := e.data.get("step"), int) else None,
                               str(e.data.get("evidence", ""))[:200])
            for e in events if e.kind in kinds and window.contains(e.ts)]
    return tuple(sorted(rows, key=lambda r: r.ts))


def checkpoint_figures(ri: RunInput, now: datetime) -> CheckpointFigures | None:
    if ri.checkpoints is None or ri.checkpoint_interval_s is None:
        return None
    ckpts = sorted(ri.checkpoints, key=lambda c: c[0])
    newest = ckpts[-1] if ckpts else None
    age = (now - newest[1]).total_seconds() if newest else None
    targets = sorted({t for c in ckpts for t in c[4]})
    lag: float | None = None
    if targets:
        pending = [c for c in ckpts if not set(targets) <= c[3]]
        lag = max(0.0, (now - min(c[1] for c in pending)).total_seconds()) if pending else 0.0
    yd = ri.young_daly
    return CheckpointFigures(
        ri.run.id, newest[0] if newest else None, age, ri.checkpoint_interval_s,
        age is None or age > ri.checkpoint_interval_s, sum(c[2] for c in ckpts), len(ckpts), lag,
        tuple(targets), young_daly_s=yd.interval_s if yd else None, save_s=yd.save_s if yd else None,
        mtbf_s=yd.mtbf_s if yd else None, young_daly=yd.describe() if yd else "")


def weekly_report(
    runs: Sequence[RunInput],
    events: Sequence[Event],
    window: Window,
    now: datetime,
    *,
    drift_open: int | None = None,
    checkpoints_available: bool = True,
    spares: SpareFigures | None = None,
    triage: TriageFigures | None = None,
) -> WeeklyReport:
    """The report for ``window`` from the runs (with their attempts) and the events in it."""
    figures: list[RunFigures] = []
    interruptions: list[Interruption] = []
    jobs = 0
    gpu_hours = 0.0
    ckpt: list[CheckpointFigures] = []
    for ri in runs:
        f = run_figures(ri, events, window)
        if f is not None:
            figures.append(f)
        for a in ri.attempts:
            ran = window.overlap(a.start, a.end) if a.start else 0.0
            if a.slurm_job_id is not None and ran > 0:
                jobs += 1
                gpu_hours += (len(a.nodes) or ri.nodes) * ri.gpus_per_node * ran / 3600
            if a.outcome not in _NOT_INTERRUPTIONS and window.contains(a.end):
                assert a.end is not None
                reasons = [str(x) for x in (a.evidence or {}).get("reasons") or []]
                interruptions.append(Interruption(ri.run.id, a.number, a.slurm_job_id, a.end, a.outcome,
                                                  interruption_cause(a), "; ".join(reasons)[:200]))
        if f is not None and not ri.run.state.is_terminal:
            c = checkpoint_figures(ri, now)
            if c is not None:
                ckpt.append(c)
    by_cause = {cause: 0 for cause in CAUSES}
    for i in interruptions:
        by_cause[i.cause] += 1
    in_window = [e for e in events if window.contains(e.ts)]
    def changes(kinds: tuple[str, ...]) -> tuple[NodeChange, ...]:
        return tuple(NodeChange(e.ts, e.node or "?", e.kind, e.actor, str(e.data.get("reason") or ""))
                     for e in in_window if e.kind in kinds and e.node)
    drift: dict[str, int] = {}
    for e in in_window:
        if e.kind == Kind.DRIFT_FINDING:
            probe = str(e.data.get("probe", "?"))
            drift[probe] = drift.get(probe, 0) + 1
    notes: list[str] = []
    if not checkpoints_available:
        notes.append("checkpoint figures not available (no checkpoint records in this store)")
    return WeeklyReport(
        window=window, generated_at=now, runs=tuple(sorted(figures, key=lambda r: r.run_id)),
        interruptions=tuple(sorted(interruptions, key=lambda i: i.ended)), by_cause=by_cause,
        drained=changes(DRAINS), returned=changes(RETURNS), drift_findings=drift,
        drift_open=drift_open, checkpoints=tuple(ckpt) if checkpoints_available else None,
        jobs=jobs, gpu_hours=gpu_hours, notes=tuple(notes), drills=drill_rows(events, window),
        training=tuple(training_figures(f, events, window) for f in sorted(figures, key=lambda r: r.run_id)),
        training_findings=training_findings(events, window), spares=spares,
        triage=triage)


def week_key(window: Window) -> str:
    """The ISO week the window starts in, e.g. ``2026-W48`` (the report mail's identity)."""
    year, week, _ = window.since.isocalendar()
    return f"{year}-W{week:02d}"

