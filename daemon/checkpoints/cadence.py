"""The checkpoint schedule: is a running run's newest complete checkpoint too old, and
what interval would lose least?

Pure parts: :func:`schedule_status` (how old the newest checkpoint is, counted
from the attempt's start when there is none from this attempt), :func:`save_time`
(the save time the daemon saw: a checkpoint's first file to its completion
marker), :func:`failure_history` (node-hours per infrastructure failure, from
the run's and the cluster's attempts) and :func:`young_daly` (the interval
``sqrt(2 * save_time * MTBF)`` with the inputs it used).

:class:`ScheduleEnforcer` runs them for every running run and turns what it
finds into events. One overdue *episode* (an attempt whose newest checkpoint is
older than its interval, until a new one arrives) gives

- one ``checkpoint.signal`` event per signal sent, at most one per interval, and
  only to a job whose spec opts in (``[checkpoint] signal = "USR1"``): the daemon
  never signals a job that did not say it handles the signal;
- one ``checkpoint.overdue`` event (the alert), at once for a job that is not
  signalled, or ``signal_grace`` after the first signal if the job did not answer
  (a job that checkpoints on the signal pages nobody);
- one ``checkpoint.ok`` when a new checkpoint ends it, only while the attempt runs
  (a run that ended gets nothing).

The episodes live in memory and are rebuilt from those events after a restart,
so a restart neither pages again nor signals sooner than one interval.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog

from ..errors import B300Error
from ..events import SCHEDULE, Kind
from ..interfaces import CheckpointLayout, NewEvent, SlurmClient
from ..model import Attempt, AttemptState, CheckpointInfo, Event, Run
from ..spec import JobSpec, parse_spec

log = structlog.get_logger(__name__)

#: Attempt outcomes/states that count as a failure of the machines (for the MTBF).
_INFRA_STATES = frozenset({AttemptState.NODE_FAIL, AttemptState.BOOT_FAIL})
_INFRA_OUTCOMES = frozenset({"INFRA", "HANG"})
#: The outcome of an attempt that ended within ``signal_grace`` of the daemon's signal.
SIGNALLED = "SIGNALLED"
#: Save times of this many newest checkpoints make the figure (their median).
SAVE_SAMPLES = 5
#: How far back the cluster's attempts count for the failure rate.
HISTORY = timedelta(days=30)


def format_span(seconds: float) -> str:
    """A duration as a person reads it, with the precision the figure has: 69.9 s, 12.5 min, 3.2 h."""
    if abs(seconds) < 120:
        return f"{seconds:.1f} s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True, slots=True)
class ScheduleStatus:
    """``counted_from`` is ``"checkpoint"`` (age of the newest complete one) or ``"start"``
    (no checkpoint since the attempt started: the age is the attempt's)."""

    run_id: str
    interval_s: float
    age_s: float
    overdue: bool
    newest: CheckpointInfo | None
    counted_from: str


def schedule_status(
    run_id: str,
    checkpoints: Sequence[CheckpointInfo],
    interval_s: float,
    running_since: datetime,
    now: datetime,
) -> ScheduleStatus:
    """How old the run's newest complete checkpoint is, counted from when the attempt started
    if that is later (a job that just started has had no chance to save yet)."""
    complete = [c for c in checkpoints if c.complete]
    newest = max(complete, key=lambda c: (c.mtime, c.step)) if complete else None
    if newest is not None and newest.mtime >= running_since:
        since, counted_from = newest.mtime, "checkpoint"
    else:
        since, counted_from = running_since, "start"
    age = (now - since).total_seconds()
    return ScheduleStatus(run_id, interval_s, age, age > interval_s, newest, counted_from)


def young_daly_interval(save_time_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that loses least: ``sqrt(2 * save_time * MTBF)`` (Young, Daly)."""
    if save_time_s <= 0 or mtbf_s <= 0:
        raise ValueError("save time and MTBF must be positive")
    return math.sqrt(2.0 * save_time_s * mtbf_s)


def save_time(checkpoints: Iterable[CheckpointInfo]) -> tuple[float | None, int]:
    """The median save time of the newest complete checkpoints that have one, and how many."""
    timed = sorted((c for c in checkpoints if c.complete and c.save_s is not None and c.save_s > 0),
                   key=lambda c: (c.step, c.mtime), reverse=True)[:SAVE_SAMPLES]
    if not timed:
        return None, 0
    return statistics.median(c.save_s for c in timed if c.save_s is not None), len(timed)


@dataclass(frozen=True, slots=True)
class FailureHistory:
    """Infrastructure failures and the node-seconds of attempt run time they happened in:
    this run's, and the whole cluster's (this run included)."""

    run_failures: int = 0
    run_node_s: float = 0.0
    cluster_failures: int = 0
    cluster_node_s: float = 0.0

    def mtbf_s(self, nodes: int) -> float | None:
        """Seconds between failures for a job on ``nodes`` nodes (the node MTBF over the nodes),
        ``None`` before the first failure."""
        if not self.cluster_failures or self.cluster_node_s <= 0:
            return None
        return self.cluster_node_s / self.cluster_failures / max(1, nodes)


def is_infra_failure(a: Attempt) -> bool:
    return a.state in _INFRA_STATES or a.outcome in _INFRA_OUTCOMES


def failure_history(run_id: str, attempts: Iterable[Attempt], now: datetime) -> FailureHistory:
    """Failures per node-second over ``attempts`` (the cluster's, this run's among them)."""
    return FailureIndex(attempts, now).of(run_id)


class FailureIndex:
    """:func:`failure_history` of every run of one attempt list, from one pass over it
    (a scrape of many runs reads the cluster's history once, not once per run)."""

    def __init__(self, attempts: Iterable[Attempt], now: datetime) -> None:
        self._runs: dict[str, tuple[int, float]] = {}
        failures, node_s_total = 0, 0.0
        for a in attempts:
            node_s = 0.0
            if a.start is not None:
                node_s = max(0.0, ((a.end or now) - a.start).total_seconds()) * max(1, len(a.nodes))
            failed = int(is_infra_failure(a))
            failures += failed
            node_s_total += node_s
            f, s = self._runs.get(a.run_id, (0, 0.0))
            self._runs[a.run_id] = (f + failed, s + node_s)
        self._cluster = (failures, node_s_total)

    def of(self, run_id: str) -> FailureHistory:
        run_f, run_s = self._runs.get(run_id, (0, 0.0))
        return FailureHistory(run_f, run_s, *self._cluster)


def observed_mtbf(attempts: Iterable[Attempt], now: datetime) -> float | None:
    """Seconds of attempt run time per infrastructure failure, ``None`` before the first failure."""
    running = 0.0
    failures = 0
    for a in attempts:
        if a.start is not None:
            running += max(0.0, ((a.end or now) - a.start).total_seconds())
        failures += is_infra_failure(a)
    return running / failures if failures and running > 0 else None


@dataclass(frozen=True, slots=True)
class YoungDaly:
    """The Young/Daly interval and every input it came from; ``interval_s`` is None with
    ``why_none`` saying what is missing."""

    interval_s: float | None
    configured_s: float
    save_s: float | None
    save_samples: int
    mtbf_s: float | None
    nodes: int
    history: FailureHistory
    why_none: str = ""

    def to_dict(self) -> dict[str, Any]:
        h = self.history
        return {
            "interval_s": None if self.interval_s is None else round(self.interval_s, 1),
            "configured_s": self.configured_s,
            "save_s": None if self.save_s is None else round(self.save_s, 3),
            "save_samples": self.save_samples,
            "mtbf_s": None if self.mtbf_s is None else round(self.mtbf_s, 1),
            "nodes": self.nodes,
            "run_failures": h.run_failures, "run_node_hours": round(h.run_node_s / 3600, 3),
            "cluster_failures": h.cluster_failures, "cluster_node_hours": round(h.cluster_node_s / 3600, 3),
            "why_none": self.why_none or None,
        }

    def describe(self) -> str:
        """One line: the advice beside the configured interval, with its inputs."""
        h = self.history
        inputs = (f"save {format_span(self.save_s)} (median of {self.save_samples})" if self.save_s
                  else "save time unknown")
        rate = (f"MTBF {format_span(self.mtbf_s)} on {self.nodes} node(s): "
                f"{h.cluster_failures} failure(s) in {format_span(h.cluster_node_s)} of node time on the "
                f"cluster, {h.run_failures} in this run's {format_span(h.run_node_s)}"
                if self.mtbf_s else
                f"no failure yet in {format_span(h.cluster_node_s)} of node time on the cluster")
        if self.interval_s is None:
            return (f"Young/Daly: no advice yet ({self.why_none}); configured {format_span(self.configured_s)}"
                    f"; {inputs}; {rate}")
        return (f"Young/Daly {format_span(self.interval_s)} vs configured {format_span(self.configured_s)}"
                f"; {inputs}; {rate}")


def young_daly(checkpoints: Iterable[CheckpointInfo], history: FailureHistory, nodes: int,
               configured_s: float) -> YoungDaly:
    """The Young/Daly advice for a run from its checkpoints' save times and the failure history."""
    save, samples = save_time(checkpoints)
    mtbf = history.mtbf_s(nodes)
    missing = [why for why, absent in (("no checkpoint save time measured", save is None),
                                       ("no infrastructure failure in the history", mtbf is None)) if absent]
    interval = young_daly_interval(save, mtbf) if save and mtbf else None
    return YoungDaly(interval, configured_s, save, samples, mtbf, nodes, history, "; ".join(missing))


@dataclass(slots=True)
class _Episode:
    """One overdue stretch of one attempt, as far as the watcher has acted on it."""

    since: datetime
    alerted: bool = False
    first_signal: datetime | None = None
    last_signal: datetime | None = None
    signals: int = 0


class ScheduleEnforcer:
    """Checks every running run's checkpoint schedule and signals overdue jobs that opted in.

    ``allow_signals`` False never signals anyone (the daemon-wide switch); ``held_back``
    (observe mode) does the same and says so in the overdue event as a withheld signal;
    ``signal_grace_s`` is how long a signalled job has to checkpoint before the alert.
    """

    def __init__(
        self,
        slurm: SlurmClient,
        layout_for: Callable[[str], CheckpointLayout],
        *,
        allow_signals: bool = True,
        signal_grace_s: float = 300.0,
        held_back: str = "",
    ) -> None:
        self._slurm = slurm
        self._layout_for = layout_for
        self.allow_signals = allow_signals
        # Why the daemon may not signal at all (observe mode): said in the overdue event.
        self.held_back = held_back
        self.signal_grace_s = signal_grace_s
        self._episodes: dict[int, _Episode] = {}

    def restore(self, events: Iterable[Event]) -> None:
        """Rebuild the open episodes from recorded ``checkpoint.*`` events (after a restart)."""
        for e in sorted(events, key=lambda e: e.id):
            if e.attempt_id is None or e.kind not in SCHEDULE:
                continue
            if e.kind == Kind.CHECKPOINT_OK:
                self._episodes.pop(e.attempt_id, None)
                continue
            ep = self._episodes.setdefault(e.attempt_id, _Episode(since=e.ts))
            if e.kind == Kind.CHECKPOINT_OVERDUE:
                ep.alerted = True
            else:
                ep.first_signal = ep.first_signal or e.ts
                ep.last_signal = e.ts
                ep.signals += 1

    def check(self, runs_with_attempts: Sequence[tuple[Run, Sequence[Attempt]]], history: Sequence[Attempt],
              now: datetime) -> list[NewEvent]:
        """The events of this check for every run given (``history``: the cluster's recent attempts)."""
        events: list[NewEvent] = []
        live: set[int] = set()
        for run, attempts in runs_with_attempts:
            running = [a for a in attempts if a.state == AttemptState.RUNNING and a.slurm_job_id]
            if not running:
                continue
            attempt = running[-1]
            live.add(attempt.id)
            try:
                spec = parse_spec(run.spec_toml, where=f"run {run.id}")
                events += self._check_one(run, spec, attempts, attempt, history, now)
            except B300Error as exc:
                log.warning("checkpoint.check_failed", run=run.id, error=str(exc))
        # Attempts that ended: their episodes end without a word (no "met again" for a run that ended).
        self._episodes = {k: v for k, v in self._episodes.items() if k in live}
        return events

    def _check_one(self, run: Run, spec: JobSpec, attempts: Sequence[Attempt], attempt: Attempt,
                   history: Sequence[Attempt], now: datetime) -> list[NewEvent]:
        policy = spec.checkpoint
        if policy.dir is None:
            return []
        found = self._layout_for(policy.layout).list_checkpoints(policy.dir)
        status = schedule_status(run.id, found, policy.interval_s, attempt.start or attempt.updated_at, now)
        episode = self._episodes.get(attempt.id)
        if not status.overdue:
            if episode is None:
                return []
            del self._episodes[attempt.id]
            return [self._ok_event(run, attempt, status, episode, spec, now)]
        if episode is None:
            episode = self._episodes[attempt.id] = _Episode(since=now)
        events: list[NewEvent] = []
        why_not = self._why_not_signal(spec, attempts)
        interval = timedelta(seconds=policy.interval_s)
        if not why_not and (episode.last_signal is None or now - episode.last_signal >= interval):
            event, error = self._signal(run, spec, attempt, status, episode, now)
            if event is not None:
                events.append(event)
            elif episode.first_signal is None:
                why_not = f"sending {spec.checkpoint.signal} failed: {error}"
        if episode.alerted:
            return events
        if episode.first_signal is None or (now - episode.first_signal).total_seconds() >= self.signal_grace_s:
            episode.alerted = True
            advice = young_daly(found, failure_history(run.id, history, now), spec.nodes, policy.interval_s)
            events.append(self._overdue_event(run, attempt, status, episode, advice, why_not))
        return events

    def _why_not_signal(self, spec: JobSpec, attempts: Sequence[Attempt]) -> str:
        """Why the job is not signalled ('' = it is)."""
        if spec.checkpoint.signal is None:
            return "the spec does not opt in to a signal ([checkpoint] signal)"
        if self.held_back:
            return f"would send {spec.checkpoint.signal}, withheld: {self.held_back}"
        if not self.allow_signals:
            return "signals are off in the daemon's config ([checkpoints] allow_signals = false)"
        died = [a.number for a in attempts if a.outcome == SIGNALLED]
        if died:
            return (f"attempt {died[-1]} died of {spec.checkpoint.signal}: not signalled again "
                    "(the job must trap it, see docs/design/checkpoints.md)")
        return ""

    def _signal(self, run: Run, spec: JobSpec, attempt: Attempt, status: ScheduleStatus,
                episode: _Episode, now: datetime) -> tuple[NewEvent | None, str]:
        sig, to = spec.checkpoint.signal, spec.checkpoint.signal_to
        assert sig is not None and attempt.slurm_job_id is not None
        try:
            self._slurm.cancel(attempt.slurm_job_id, signal=sig, batch_only=to == "batch", full=to == "all")
        except B300Error as exc:
            log.warning("checkpoint.signal_failed", run=run.id, job_id=attempt.slurm_job_id, error=str(exc))
            return None, str(exc)
        episode.first_signal = episode.first_signal or now
        episode.last_signal = now
        episode.signals += 1
        where = "the batch shell" if to == "batch" else "the batch shell, its children and every step"
        return NewEvent(Kind.CHECKPOINT_SIGNAL, run_id=run.id, attempt_id=attempt.id, data={
            "message": (f"run {run.id}: sent {sig} to {where} of job {attempt.slurm_job_id} "
                        f"({_age_words(status)}; signal {episode.signals} of this episode)"),
            "job_id": attempt.slurm_job_id, "signal": sig, "to": to, "age_s": round(status.age_s, 1),
            "interval_s": status.interval_s, "grace_s": self.signal_grace_s, "number": episode.signals}), ""

    def _overdue_event(self, run: Run, attempt: Attempt, status: ScheduleStatus, episode: _Episode,
                       advice: YoungDaly, why_not: str) -> NewEvent:
        if episode.first_signal is not None:
            acted = (f"no checkpoint {format_span(self.signal_grace_s)} after "
                     f"{episode.signals} signal(s)")
        else:
            acted = f"not signalled: {why_not}"
        newest = status.newest
        return NewEvent(Kind.CHECKPOINT_OVERDUE, run_id=run.id, attempt_id=attempt.id, data={
            "message": f"run {run.id}: {_age_words(status)}; {acted}. {advice.describe()}",
            "age_s": round(status.age_s, 1), "interval_s": status.interval_s,
            "counted_from": status.counted_from,
            "newest": newest.path if newest else None, "newest_step": newest.step if newest else None,
            "job_id": attempt.slurm_job_id, "signals": episode.signals, "young_daly": advice.to_dict()})

    def _ok_event(self, run: Run, attempt: Attempt, status: ScheduleStatus, episode: _Episode,
                  spec: JobSpec, now: datetime) -> NewEvent:
        newest = status.newest
        step = f"step {newest.step}" if newest else "a checkpoint"
        answer = ""
        if newest is not None and episode.last_signal is not None and newest.mtime >= episode.last_signal:
            after = (newest.mtime - episode.last_signal).total_seconds()
            answer = f", {format_span(after)} after {spec.checkpoint.signal}"
        return NewEvent(Kind.CHECKPOINT_OK, run_id=run.id, attempt_id=attempt.id, data={
            "message": f"run {run.id}: schedule met again: {step}{answer}",
            "newest_step": newest.step if newest else None, "age_s": round(status.age_s, 1),
            "signals": episode.signals, "alerted": episode.alerted,
            "overdue_for_s": round((now - episode.since).total_seconds(), 1)})


def _age_words(status: ScheduleStatus) -> str:
    interval = format_span(status.interval_s)
    if status.newest is None:
        return f"no checkpoint yet, {format_span(status.age_s)} after the attempt started (interval {interval})"
    if status.counted_from == "start":
        return (f"no checkpoint yet in this attempt, {format_span(status.age_s)} after it started "
                f"(interval {interval}; newest is step {status.newest.step}, from before)")
    return (f"newest complete checkpoint (step {status.newest.step}) is {format_span(status.age_s)} old "
            f"(interval {interval})")
