"""Training health in the poll cycle: each running attempt's progress read, judged, reported.

A step of the poll cycle (:mod:`b300.cycle.pipeline`), run under the action lock with
the cycle's clock. For every running attempt whose spec names a ``[health]
progress_file`` (``{host}``/``{rank}`` expanded from the attempt's nodes) or sets
``megatron_log`` (the job's output file), each cycle:

1. polls a :class:`~.reader.ProgressTailer` per file (at most ``[training]
   max_read_bytes`` per file: a backlog is read over several cycles);
2. feeds the records to the attempt's :class:`~.monitor.TrainingMonitor` and asks it
   for findings as of the cycle's ``now``;
3. records each finding as a ``training.*`` event (the alert scanner delivers it
   within its scan interval, at most a minute), the first read problem per file as
   ``training.progress_problem``, an ``exit_intent`` the job wrote as
   ``training.exit_intent`` (recovery reads it when the attempt ends), and every 5
   minutes the attempt's figures as ``training.figures`` (the weekly report's MFU
   and tokens/s);
4. keeps the figures of the last cycle for ``/metrics`` (:meth:`TrainingWatch.figures`);
5. saves the monitor's and the tailers' JSON state to ``state_dir/training/`` (one
   small file per attempt, replaced atomically), so a restarted daemon carries on
   without re-alarming or forgetting. Without a state file (first start, a failover
   to a host that did not write it) it re-reads the files' last ``backfill_bytes`` and
   drops findings the event log already has for the attempt.

When an attempt ends, :meth:`TrainingWatch.finish` reads its files a last time (the
exit intent is written just before exiting), then forgets it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ..events import TRAINING_FINDINGS, Kind
from ..interfaces import NewEvent, Store
from ..model import Attempt, AttemptState
from ..payloads import TrainingFinding, TrainingProgressProblem
from ..spec import JobSpec, spec_of
from .detectors import MfuInputs, TrainingMonitor, TrainingSnapshot
from .findings import Finding, FindingKind
from .protocol import MAX_LINE_BYTES, ProgressRecord
from .reader import ProgressTailer, TailState, never_complete
from .state_files import StateFiles
from .thresholds import TrainingConfig, TrainingSpec

if TYPE_CHECKING:
    from ..recovery.straggler_drain import StragglerDrainer

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]
#: ``training.figures`` events: the first figures of an attempt, then at most this often.
FIGURES_EVERY = timedelta(minutes=5)
#: The most files one attempt's ``{rank}`` pattern expands to.
MAX_FILES = 4096

FINDING_KINDS: Mapping[FindingKind, Kind] = {
    FindingKind.LOSS_SPIKE: Kind.TRAINING_LOSS_SPIKE,
    FindingKind.LOSS_NAN: Kind.TRAINING_LOSS_NAN,
    FindingKind.THROUGHPUT_DROP: Kind.TRAINING_THROUGHPUT_DROP,
    FindingKind.STRAGGLER: Kind.TRAINING_STRAGGLER,
    FindingKind.CHECKPOINT_STALLED: Kind.TRAINING_CHECKPOINT_STALLED,
}


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One running attempt's figures for ``/metrics``."""

    run_id: str
    attempt: int
    snapshot: TrainingSnapshot
    seconds_per_step: float | None = None
    host_step_time_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Watched:
    attempt_id: int
    run_id: str
    number: int
    monitor: TrainingMonitor
    tailers: list[ProgressTailer]
    problem_files: set[str] = field(default_factory=set)
    intent_recorded: bool = False
    figures_at: datetime | None = None
    # Findings the event log already has for this attempt (kind, host, step): a monitor
    # rebuilt from backfill finds them again and must not report them twice.
    known: set[tuple[str, str | None, int | None]] = field(default_factory=set)
    last_steps: list[tuple[int, float]] = field(default_factory=list)  # two newest (step, time)
    host_step_time: dict[str, float] = field(default_factory=dict)
    saved: str = ""
    # What the watch was built from, to apply a reloaded [training] (SIGHUP) in place.
    files: list[tuple[str, bool]] = field(default_factory=list)
    tspec: TrainingSpec | None = None
    cfg: TrainingConfig | None = None
    mfu: MfuInputs | None = None


def progress_paths(pattern: str, nodes: Sequence[str], ranks: int) -> list[str]:
    """The files of ``pattern`` for an attempt on ``nodes`` with ``ranks`` ranks.

    ``{host}`` takes each node, ``{rank}`` each rank; with both, rank r is on node
    ``r // (ranks / nodes)`` (Slurm's default block distribution). Without either it is
    one file. At most :data:`MAX_FILES`."""
    has_host, has_rank = "{host}" in pattern, "{rank}" in pattern
    if not has_host and not has_rank:
        return [pattern]
    if has_rank:
        per_node = max(1, ranks // max(1, len(nodes))) if nodes else ranks
        out = []
        for r in range(min(ranks, MAX_FILES)):
            host = nodes[min(r // per_node, len(nodes) - 1)] if nodes else ""
            out.append(pattern.replace("{rank}", str(r)).replace("{host}", host))
        return out
    return [pattern.replace("{host}", n) for n in nodes[:MAX_FILES]]


class TrainingWatch:
    """The training-health step of the poll cycle (one per daemon)."""

    def __init__(self, store: Store, clock: Clock, config: Callable[[], TrainingConfig], *,
                 state_dir: str | None, output_path: Callable[[Attempt, JobSpec], str | None],
                 gpus_per_node_default: int = 8,
                 drainer: StragglerDrainer | None = None) -> None:
        # drainer: acts on a straggler under [training] straggler_action = "drain".
        self._drainer = drainer
        self._store = store
        self._clock = clock
        self._config = config
        self._state = StateFiles(Path(state_dir) / "training" if state_dir else None)
        self._output_path = output_path
        self._gpus_default = gpus_per_node_default
        self._watched: dict[int, _Watched] = {}
        # Running attempts whose spec asks for no progress reading (not parsed every cycle).
        self._unwatched: set[int] = set()
        self._finished: set[int] = set()  # attempts read a last time by this process
        self._figures: dict[str, RunFigures] = {}
        self._swept = False

    # -- the cycle's entry points ---------------------------------------------------------

    def check(self, active: Sequence[Attempt]) -> int:
        """Read and judge every running attempt of ``active``; how many findings were recorded."""
        cfg = self._config()
        if not cfg.enabled:
            self._figures = {}
            return 0
        now = self._clock()
        found = 0
        running = {a.id: a for a in active if a.state is AttemptState.RUNNING and a.slurm_job_id}
        for gone in set(self._watched) - set(running):
            self._forget(gone)
        self._unwatched &= set(running)
        figures: dict[str, RunFigures] = {}
        for attempt in running.values():
            with structlog.contextvars.bound_contextvars(run=attempt.run_id, attempt=attempt.number,
                                                         job_id=attempt.slurm_job_id):
                try:
                    w = self._watch(attempt, cfg)
                    if w is None:
                        continue
                    if w.cfg is not cfg and w.cfg != cfg:
                        self._retune(w, cfg)
                    found += self._poll(w, cfg, now, attempt)
                    figures[w.run_id] = self._run_figures(w, now)
                    self._save(w)
                except Exception:  # one run's odd files must not stop the cycle
                    log.exception("training.check_failed")
        self._figures = figures
        if not self._swept:
            self._sweep({a.id for a in active})
        return found

    def finish(self, attempt: Attempt) -> None:
        """``attempt`` ended: read its files a last time (an exit intent is written just
        before exiting), record what they say, forget it. Once per attempt and process:
        the cycle asks again for every ended attempt recovery has not classified (after a
        crash between the end and this read), and only the first ask reads."""
        cfg = self._config()
        if not cfg.enabled or attempt.id in self._finished:
            return
        self._finished.add(attempt.id)
        now = self._clock()
        with structlog.contextvars.bound_contextvars(run=attempt.run_id, attempt=attempt.number):
            try:
                w = self._watched.get(attempt.id) or self._restore(attempt, cfg)
                if w is not None:
                    self._poll(w, cfg, now)
            except Exception:
                log.exception("training.finish_failed")
        self._forget(attempt.id)

    def progress_step(self, attempt: Attempt) -> str | None:
        """The newest step read of ``attempt`` as text ('' before its first), for hang
        detection; None when this watch does not read it (training health off, no files)."""
        w = self._watched.get(attempt.id)
        if w is None or not self._config().enabled:
            return None
        snap = w.monitor.snapshot(self._clock())
        return "" if snap.step is None else str(snap.step)

    def figures(self) -> dict[str, RunFigures]:
        """The running attempts' figures as of the last cycle, by run (for ``/metrics``)."""
        return dict(self._figures)

    # -- per attempt ----------------------------------------------------------------------

    def _watch(self, attempt: Attempt, cfg: TrainingConfig) -> _Watched | None:
        w = self._watched.get(attempt.id)
        if w is None and attempt.id not in self._unwatched:
            w = self._restore(attempt, cfg)
            if w is None:
                if attempt.nodes:  # without its nodes yet, {host} has nothing to expand to
                    self._unwatched.add(attempt.id)
                return None
            self._watched[attempt.id] = w
        return w

    def _restore(self, attempt: Attempt, cfg: TrainingConfig) -> _Watched | None:
        """A watch for ``attempt``: from its state file, else fresh with backfill. None when
        the spec asks for no progress reading."""
        spec = spec_of(self._store.get_run(attempt.run_id))
        tspec = spec.health.training or TrainingSpec()
        files = self._files(attempt, spec, tspec)
        if not files:
            return None
        thresholds = cfg.for_run(tspec)
        gpus = len(attempt.nodes or ()) * (spec.gpus_per_node or 0)
        mfu = MfuInputs(tspec.model_params, gpus, cfg.peak.per_gpu, tspec.tokens_per_sample)
        start = attempt.start.timestamp() if attempt.start else None
        state = self._state.load(attempt.id)
        if state is not None and state.get("files") == [p for p, _ in files]:
            monitor = TrainingMonitor.from_state(attempt.run_id, thresholds, state["monitor"],
                                                 attempt_start=start, mfu=mfu,
                                                 rate_window_s=cfg.rate_window)
            tails = state.get("tails", [])
            tailers = [self._tailer(path, megatron, cfg,
                                    TailState.from_dict(tails[i]) if i < len(tails) and tails[i] else None)
                       for i, (path, megatron) in enumerate(files)]
            w = _Watched(attempt.id, attempt.run_id, attempt.number, monitor, tailers,
                         problem_files=set(state.get("problem_files", [])),
                         intent_recorded=bool(state.get("intent_recorded")),
                         last_steps=[(int(s), float(t)) for s, t in state.get("last_steps", [])],
                         host_step_time={str(k): float(v) for k, v in state.get("host_step_time", {}).items()})
            if state.get("figures_at"):
                w.figures_at = datetime.fromisoformat(state["figures_at"])
            w.files, w.tspec, w.cfg, w.mfu = files, tspec, cfg, mfu
            return w
        monitor = TrainingMonitor(attempt.run_id, thresholds, attempt_start=start, mfu=mfu,
                                  rate_window_s=cfg.rate_window)
        tailers = [self._tailer(path, megatron, cfg, None) for path, megatron in files]
        w = _Watched(attempt.id, attempt.run_id, attempt.number, monitor, tailers,
                     files=files, tspec=tspec, cfg=cfg, mfu=mfu)
        # What an earlier daemon already recorded for this attempt is not recorded again.
        kinds = [*TRAINING_FINDINGS, Kind.TRAINING_PROGRESS_PROBLEM, Kind.TRAINING_EXIT_INTENT,
                 Kind.TRAINING_FIGURES]
        for e in self._store.events(run_id=attempt.run_id, kinds=kinds):
            if e.attempt_id != attempt.id:
                continue
            if e.kind == Kind.TRAINING_PROGRESS_PROBLEM:
                w.problem_files.add(TrainingProgressProblem.of(e).path)
            elif e.kind == Kind.TRAINING_EXIT_INTENT:
                w.intent_recorded = True
            elif e.kind == Kind.TRAINING_FIGURES:
                w.figures_at = e.ts
            else:
                w.known.add((e.kind, e.node, TrainingFinding.of(e).step))
        return w

    def _retune(self, w: _Watched, cfg: TrainingConfig) -> None:
        """A reloaded ``[training]`` (SIGHUP): the attempt's detectors take the new thresholds
        (merged again with the spec's overrides) and keep what they saw (through their JSON
        state, as across a restart); the tailers keep their offsets. Thresholds the spec's
        overrides do not fit with keep the old ones (logged)."""
        tspec = w.tspec or TrainingSpec()
        try:
            thresholds = cfg.for_run(tspec)
        except ValueError as exc:  # pydantic's ValidationError is one
            log.warning("training.reload_refused", error=str(exc).splitlines()[0][:300])
            w.cfg = cfg
            return
        old = w.monitor
        mfu = w.mfu
        if mfu is not None:
            mfu = MfuInputs(mfu.params, mfu.gpus, cfg.peak.per_gpu, mfu.tokens_per_sample)
        w.monitor = TrainingMonitor.from_state(w.run_id, thresholds, old.to_state(),
                                               attempt_start=old.attempt_start, mfu=mfu,
                                               rate_window_s=cfg.rate_window)
        if w.files and len(w.files) == len(w.tailers):
            w.tailers = [self._tailer(path, megatron, cfg, t.state)
                         for (path, megatron), t in zip(w.files, w.tailers, strict=True)]
        w.cfg, w.mfu = cfg, mfu
        log.info("training.reconfigured")

    def _files(self, attempt: Attempt, spec: JobSpec, tspec: TrainingSpec) -> list[tuple[str, bool]]:
        files: list[tuple[str, bool]] = []
        if spec.health.progress_file:
            ranks = len(attempt.nodes or ()) * (spec.ntasks_per_node or 1)
            files += [(p, False) for p in progress_paths(spec.health.progress_file,
                                                          list(attempt.nodes), max(1, ranks))]
        if tspec.megatron_log:
            out = self._output_path(attempt, spec)
            if out:
                files.append((out, True))
        return files

    def _tailer(self, path: str, megatron: bool, cfg: TrainingConfig,
                state: TailState | None) -> ProgressTailer:
        if megatron:
            from zoneinfo import ZoneInfo

            from .megatron import MAX_LOG_LINE_BYTES, megatron_line_parser

            tz = ZoneInfo(cfg.megatron_tz) if cfg.megatron_tz else None
            return ProgressTailer(path, parse_line=megatron_line_parser(tz), accept_tail=never_complete,
                                  legacy=False, max_line_bytes=MAX_LOG_LINE_BYTES, report_long_lines=False,
                                  max_read_bytes=cfg.max_read_bytes, backfill_bytes=cfg.backfill_bytes,
                                  state=state)
        return ProgressTailer(path, max_line_bytes=MAX_LINE_BYTES, max_read_bytes=cfg.max_read_bytes,
                              backfill_bytes=cfg.backfill_bytes, state=state)

    def _poll(self, w: _Watched, cfg: TrainingConfig, now: datetime, attempt: Attempt | None = None) -> int:
        """Read, judge, record. ``attempt``: the running attempt (None once it ended: its
        stragglers are not acted on)."""
        events: list[NewEvent] = []
        records: list[ProgressRecord] = []
        for tailer in w.tailers:
            read = tailer.poll(now.timestamp())
            records += read.records
            if read.problems and tailer.path not in w.problem_files:
                w.problem_files.add(tailer.path)
                p = read.problems[0]
                events.append(NewEvent(Kind.TRAINING_PROGRESS_PROBLEM, run_id=w.run_id,
                                       attempt_id=w.attempt_id,
                                       data={"path": tailer.path, "offset": p.offset, "problem": p.what[:300]}))
        w.monitor.observe(records)
        self._note_steps(w, records)
        found = 0
        for f in w.monitor.evaluate(now):
            kind = FINDING_KINDS.get(f.kind)
            if kind is None or (kind.value, f.host, f.step) in w.known:
                continue
            found += 1
            events.append(self._finding_event(w, kind, f))
            if (kind is Kind.TRAINING_STRAGGLER and f.host and attempt is not None
                    and self._drainer is not None and cfg.straggler_action == "drain"):
                # Drained before the finding is recorded; both recorded together (a crash
                # in between re-finds it: see b300.recovery.straggler_drain).
                events.append(self._drainer.decide(attempt, f.host, f.evidence, f.step,
                                                   cfg.straggler_drain_every, now))
        intent = w.monitor.exit_intent
        if intent is not None and not w.intent_recorded:
            w.intent_recorded = True
            step = w.monitor.snapshot(now).step
            events.append(NewEvent(Kind.TRAINING_EXIT_INTENT, run_id=w.run_id, attempt_id=w.attempt_id,
                                   data={"restart": intent.restart, "why": intent.why[:500], "step": step}))
        if w.figures_at is None or now - w.figures_at >= FIGURES_EVERY:
            fig = self._run_figures(w, now)
            data = _figures_data(fig)
            if data.get("step") is not None:
                w.figures_at = now
                events.append(NewEvent(Kind.TRAINING_FIGURES, run_id=w.run_id, attempt_id=w.attempt_id,
                                       data=data))
        if events:
            self._store.append_events(events, now)
            for e in events:
                if e.kind in TRAINING_FINDINGS:
                    log.warning(str(e.kind), **e.data)
        return found

    def _finding_event(self, w: _Watched, kind: Kind, f: Finding) -> NewEvent:
        data = f.event_data()
        for key in ("value", "threshold"):
            if isinstance(data.get(key), float):
                data[key] = _sig(data[key]) if data[key] == data[key] else None
        data = {k: v for k, v in data.items() if v is not None}
        return NewEvent(kind, run_id=w.run_id, attempt_id=w.attempt_id, node=f.host, data=data)

    def _note_steps(self, w: _Watched, records: Sequence[ProgressRecord]) -> None:
        for r in records:
            if r.step_time_s is not None and r.host and (
                    len(w.host_step_time) < MAX_FILES or r.host in w.host_step_time):
                w.host_step_time[r.host] = r.step_time_s
            if r.rank not in (None, 0) or r.event is not None:
                continue
            if not w.last_steps or r.step > w.last_steps[-1][0]:
                w.last_steps = [*w.last_steps[-1:], (r.step, r.time)]
            elif r.step < w.last_steps[-1][0]:
                w.last_steps = [(r.step, r.time)]  # resumed from an earlier step

    def _run_figures(self, w: _Watched, now: datetime) -> RunFigures:
        per_step = None
        if len(w.last_steps) == 2:
            (s0, t0), (s1, t1) = w.last_steps
            if s1 > s0 and t1 >= t0:
                per_step = (t1 - t0) / (s1 - s0)
        return RunFigures(w.run_id, w.number, w.monitor.snapshot(now), per_step, dict(w.host_step_time))

    # -- state files ----------------------------------------------------------------------

    def _save(self, w: _Watched) -> None:
        state: dict[str, Any] = {
            "files": [t.path for t in w.tailers], "monitor": w.monitor.to_state(),
            "tails": [t.state.to_dict() if t.state else None for t in w.tailers],
            "problem_files": sorted(w.problem_files), "intent_recorded": w.intent_recorded,
            "figures_at": w.figures_at.isoformat() if w.figures_at else None,
            "last_steps": w.last_steps, "host_step_time": w.host_step_time}
        w.saved = self._state.save(w.attempt_id, state, w.saved)

    def _forget(self, attempt_id: int) -> None:
        self._watched.pop(attempt_id, None)
        self._state.remove(attempt_id)

    def _sweep(self, active: set[int]) -> None:
        """Once: state files of attempts that are no longer active (ended while no daemon ran)."""
        self._swept = True
        self._state.sweep(lambda n: n in active or n in self._watched)


def _figures_data(fig: RunFigures) -> dict[str, Any]:
    s = fig.snapshot
    data: dict[str, Any] = {"step": s.step}
    for key, value in (("loss", s.loss), ("tokens_per_s", s.tokens_per_s), ("samples_per_s", s.samples_per_s),
                       ("mfu", s.mfu), ("seconds_per_step", fig.seconds_per_step)):
        if value is not None and value == value and abs(value) != float("inf"):
            data[key] = _sig(value)
    if s.stragglers:
        data["stragglers"] = sorted(s.stragglers)
    return data


def _sig(value: float) -> float:
    """Six significant digits (an MFU of 1e-10 stays 1e-10, not 0.0)."""
    return float(f"{value:.6g}")
