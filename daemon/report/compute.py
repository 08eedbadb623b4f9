"""The weekly report's figures, computed from store records only (pure: no I/O, no clock).

Each run's ETTR split and the interruptions' causes are :mod:`b300.report.ettr`
(re-exported here); this module adds checkpoints, node changes, drills, training
figures and findings, and puts the week together (:func:`weekly_report`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from ..events import DRAINS, RETURNS, Kind
from ..model import Event
from ..payloads import DriftCleared, DriftFinding, DrillFinished, NodeDrained, TrainingFigures, TrainingFinding
from ..training.stats import median
from ..triage.figures import TriageFigures
from .ettr import (
    CAUSES,
    NOT_INTERRUPTIONS,
    Interruption,
    RunFigures,
    RunInput,
    Window,
    interruption_cause,
    run_figures,
)
from .spares import SpareFigures

__all__ = [
    "CAUSES", "CheckpointFigures", "DrillRow", "Interruption", "NodeChange", "RunFigures", "RunInput",
    "TrainingFindingRow", "TrainingRunFigures", "WeeklyReport", "Window", "checkpoint_figures",
    "drill_rows", "interruption_cause", "run_figures", "training_figures", "training_findings",
    "week_key", "weekly_report",
]


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


def drill_rows(events: Sequence[Event], window: Window) -> tuple[DrillRow, ...]:
    """The drills that finished in ``window``, oldest first."""
    rows = []
    for e in events:
        if e.kind != Kind.DRILL_FINISHED or not window.contains(e.ts):
            continue
        d = DrillFinished.of(e)
        rows.append(DrillRow(e.ts, e.run_id or "?", d.node or e.node or "?", d.method, d.outcome,
                             d.detect_s, d.excluded_s, d.resubmit_s, d.allocation_s, d.training_s,
                             d.resume_step, d.steps_lost))
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


def training_figures(f: RunFigures, events: Sequence[Event], window: Window) -> TrainingRunFigures:
    """MFU and tokens/s (medians of the run's ``training.figures`` in the window), queue time
    per attempt and recovery frequency (``recovery.resubmit`` per day of the run's wall time)."""
    mine = [e for e in events if e.run_id == f.run_id and window.contains(e.ts)]

    figures = [TrainingFigures.of(e) for e in mine if e.kind == Kind.TRAINING_FIGURES]

    def med(values: Iterable[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return median(known) if known else None

    recoveries = sum(e.kind == Kind.RECOVERY_RESUBMIT for e in mine)
    return TrainingRunFigures(
        f.run_id, med(x.mfu for x in figures), med(x.tokens_per_s for x in figures),
        f.queue_s / f.attempts if f.attempts else None,
        recoveries, recoveries / (f.wall_s / 86400) if f.wall_s > 0 else None)


def training_findings(events: Sequence[Event], window: Window) -> tuple[TrainingFindingRow, ...]:
    """The loss spikes (and NaN losses) and stragglers of the window, oldest first."""
    kinds = (Kind.TRAINING_LOSS_SPIKE, Kind.TRAINING_LOSS_NAN, Kind.TRAINING_STRAGGLER)
    found = [(e, TrainingFinding.of(e)) for e in events if e.kind in kinds and window.contains(e.ts)]
    rows = [TrainingFindingRow(e.ts, e.run_id or "?", e.kind.removeprefix("training."), e.node,
                               t.step, t.evidence[:200])
            for e, t in found]
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
            if a.outcome not in NOT_INTERRUPTIONS and window.contains(a.end):
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
        return tuple(NodeChange(e.ts, e.node or "?", e.kind, e.actor, _reason(e))
                     for e in in_window if e.kind in kinds and e.node)
    drift: dict[str, int] = {}
    for e in in_window:
        if e.kind == Kind.DRIFT_FINDING:
            probe = DriftFinding.of(e).probe or "?"
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


def _reason(e: Event) -> str:
    """The reason a node was drained, or brought back by the drift scan (a resume gives none)."""
    if e.kind in DRAINS:
        return NodeDrained.of(e).reason
    return DriftCleared.of(e).reason if e.kind == Kind.DRIFT_CLEARED else ""
