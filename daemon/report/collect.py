"""Read what the weekly report needs from the store (the I/O edge of ``compute``)."""

from __future__ import annotations

from datetime import datetime, timedelta

import structlog

from ..checkpoints.advice import run_schedule
from ..checkpoints.cadence import HISTORY
from ..errors import B300Error
from ..events import TRIAGE, Kind
from ..interfaces import Store
from ..spec import parse_spec
from ..triage.figures import triage_figures
from .compute import RunInput, WeeklyReport, Window, weekly_report
from .spares import SpareRun, spare_figures

log = structlog.get_logger(__name__)
# Events this long before the window still explain attempts inside it (classified, progress).
_LOOKBEHIND = timedelta(days=7)


def collect_report(store: Store, window: Window, now: datetime) -> WeeklyReport:
    """Build the report for ``window`` from the store's runs, attempts, events and checkpoints."""
    events = store.events(since=window.since - _LOOKBEHIND)
    events = [e for e in events if e.ts < window.until]
    ckpt_store = store.checkpoints
    history = store.attempts_since(now - HISTORY)
    inputs: list[RunInput] = []
    spare_runs: list[SpareRun] = []
    for run in store.list_runs():
        attempts = store.attempts(run.id)
        if not attempts or run.created_at >= window.until:
            continue
        try:
            spec = parse_spec(run.spec_toml, where=f"run {run.id}")
        except B300Error as exc:
            log.warning("report.bad_spec", run=run.id, error=str(exc))
            continue
        ckpts = None
        interval = None
        advice = None
        # Where each attempt began: step 0 (from scratch) or its checkpoint's step. Known only
        # where b300 hands the job its checkpoint ([checkpoint] dir): a job that finds its own
        # (Megatron's --load) may start anywhere.
        starts: dict[int, int] = {a.id: 0 for a in attempts if not a.resume_from} if spec.checkpoint.dir else {}
        if spec.checkpoint.dir and any(a.resume_from for a in attempts):
            by_path = {c.info.path: c.info.step for c in ckpt_store.checkpoints(run.id)}
            starts |= {a.id: by_path[a.resume_from] for a in attempts
                       if a.resume_from and a.resume_from in by_path}
        if spec.checkpoint.dir:
            interval = spec.checkpoint.interval_s
            stored = [c for c in ckpt_store.checkpoints(run.id) if c.info.complete]
            ckpts = [(c.info.step, c.info.mtime, c.info.size_bytes, c.replicated_to, frozenset(c.replicas))
                     for c in stored]
            sched = run_schedule(run, spec, [c.info for c in stored], attempts, history, now)
            advice = sched.young_daly if sched else None
        inputs.append(RunInput(run, attempts, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
                               checkpoint_interval_s=interval, checkpoints=ckpts, young_daly=advice,
                               start_steps=starts))
        spare_runs.append(SpareRun(spec.partition, spec.gpus_per_node, spec.spare_nodes, attempts))
    # Every spares.pool event there is (one per change of a pool: few): the one before the
    # window says what a pool held when the window began, however old it is.
    pool_events = store.events(kinds=[Kind.SPARES_POOL])
    spares = spare_figures(spare_runs, events, pool_events, window.since, min(window.until, now))
    # Node triage (b300.triage): every drain, return and verdict there is (few per node).
    triage = triage_figures(store.events(kinds=[*TRIAGE, Kind.DRIFT_CLEARED]), window.since,
                            min(window.until, now))
    return weekly_report(inputs, events, window, now, drift_open=len(store.drift.open_findings()),
                         spares=spares, triage=triage)
