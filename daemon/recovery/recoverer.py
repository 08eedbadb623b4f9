"""Recovery: drain the nodes behind a failure and resubmit from a good checkpoint.

Runs as a step of the poll cycle (:mod:`b300.cycle.pipeline`), under the daemon's
action lock, on the cycle's :class:`~b300.cycle.view.ClusterView` (the nodes as
Slurm showed them this cycle; nothing is re-read per run). Each step is
idempotent or recorded before it acts, so a crash anywhere in it is finished on
the next cycle after a restart:

- the classification, the node strikes and the drains of an attempt are
  recorded once (the attempt's ``outcome`` marks it classified);
- draining a node already drained is skipped;
- the resubmission is an intent (:class:`b300.cycle.run_actions.RunActions`), so it
  reaches Slurm at most once.

Before resubmitting, two training-health checks may end the run instead
(:mod:`b300.training.restarts`): an exit code the spec declares "do not restart"
(``[health] no_restart_exit_codes``) or the job's own ``exit_intent`` with
``restart: false`` ends it FAILED with ``recovery.no_restart``; ``[training]
restart_loop.attempts`` ended attempts in a row that did not advance the run's newest
checkpoint step end it FAILED with ``recovery.restart_loop`` (both alerted). The
newest checkpoint step at each attempt's end is recorded in its classification
(``newest_step``), so the row survives restarts.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

import structlog

from ..checkpoints.resume_point import newest_verified
from ..config import RecoveryConfig
from ..cycle.node_actions import NodeActions, drained_by_us
from ..cycle.run_actions import RunActions
from ..cycle.view import ClusterView
from ..errors import B300Error, SlurmError
from ..events import END_CAUSES, STRIKE_RESETS, STRIKES, Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Attempt, NodeRecord, Run, RunState
from ..payloads import CheckpointSignal, TrainingExitIntent
from ..plugin_registry import PluginRegistry
from ..safety.faults import crashpoint
from ..slurm.script import expand_output_pattern, output_pattern
from ..spec import JobSpec, spec_of
from ..training.thresholds import TrainingConfig, TrainingSpec
from .classify import (
    BlackHolePolicy,
    NodeStrikes,
    Outcome,
    SignalSent,
    Verdict,
    black_holes,
    classify_end,
    last_returns,
    node_is_bad,
    retries_used,
)
from .exclusions import Exclusion
from .node_loss import node_lost
from .relaunch import relaunches
from .straggler_drain import ours, straggler_drained

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]
_LOG_TAIL_BYTES = 256 * 1024
_FINAL = {Outcome.COMPLETED: RunState.COMPLETED, Outcome.CANCELLED: RunState.CANCELLED}


class Recoverer:
    """Decides and acts on runs whose last attempt ended without completing."""

    def __init__(
        self,
        store: Store,
        slurm: SlurmClient,
        actions: RunActions,
        clock: Clock,
        config: RecoveryConfig,
        *,
        job_log_dir: str | None = None,
        node_health: Callable[[Sequence[str]], dict[str, str]] | None = None,
        detect_window_s: float = 0.0,
        plugins: PluginRegistry | None = None,
        training: TrainingConfig | None = None,
    ) -> None:
        self._plugins = plugins
        self._training = training if training is not None else TrainingConfig()
        # node_health: the daemon's own liveness checks (b300.recovery.node_loss), if on.
        self._node_health = node_health
        self._detect_window_s = detect_window_s
        self._store = store
        self._slurm = slurm
        self._actions = actions
        self._nodes = NodeActions(store, slurm, clock)
        self._clock = clock
        self._config = config
        self._log_dir = job_log_dir
        self._blackhole = BlackHolePolicy(config.blackhole_failures, config.blackhole_window_s)
        self._waiting: set[int] = set()

    def reconfigure(self, config: RecoveryConfig, training: TrainingConfig | None = None) -> None:
        """Take new thresholds (SIGHUP)."""
        self._config = config
        if training is not None:
            self._training = training
        self._blackhole = BlackHolePolicy(config.blackhole_failures, config.blackhole_window_s)

    # -- ended attempts ---------------------------------------------------

    def recover_all(self, view: ClusterView) -> int:
        """Handle every run in RECOVERING; returns how many were decided."""
        decided = 0
        for run in self._store.list_runs([RunState.RECOVERING]):
            with structlog.contextvars.bound_contextvars(run=run.id):
                try:
                    if self.recover(run, view.nodes):
                        decided += 1
                except SlurmError as exc:
                    log.warning("recovery.deferred", error=str(exc))
        return decided

    def recover(self, run: Run, nodes_now: Mapping[str, NodeRecord]) -> bool:
        """Decide about one RECOVERING run. False when it must wait for more evidence."""
        attempts = self._store.attempts(run.id)
        if not attempts or not attempts[-1].state.is_terminal:
            return False
        last = attempts[-1]
        spec = spec_of(run)
        now = self._clock()
        with structlog.contextvars.bound_contextvars(attempt=last.number, job_id=last.slurm_job_id):
            verdict = self._verdict(run, last, spec, nodes_now, now)
            if verdict.wait:
                if last.id not in self._waiting:
                    self._waiting.add(last.id)
                    self._store.append_events([NewEvent(
                        Kind.RECOVERY_WAITING, run_id=run.id, attempt_id=last.id,
                        data={"why": verdict.reasons[-1], "log": list(verdict.log_lines)})], now)
                return False
            self._waiting.discard(last.id)
            if not last.outcome:
                last = self._record_verdict(run, last, verdict, now)
                attempts[-1] = last
                crashpoint("recovery_classified")
            drained = self._drain(run, last, verdict.suspects, nodes_now, now)
            outcome = Outcome(last.outcome)
            if outcome is Outcome.INFRA:
                # Only an infrastructure failure says anything about the nodes it ran on.
                self._drain_black_holes(run, last, nodes_now, drained, now)
            stop = self._training_stop(run, last, spec, attempts, verdict.resubmit)
            if stop is not None:
                kind, why, data = stop
                self._finish(run, RunState.FAILED, why, now, kind=kind, data=data)
                return True
            if not verdict.resubmit:
                self._finish(run, _FINAL.get(outcome, RunState.FAILED),
                             f"{outcome.value}: not resubmitted", now)
                return True
            infra, preempt = retries_used(attempts)
            infra += len(relaunches(self._store, run.id))  # in-allocation restarts count too
            if outcome is Outcome.PREEMPTED and preempt > spec.retries.preemption:
                self._finish(run, RunState.FAILED, f"preemption retry budget spent "
                             f"({spec.retries.preemption})", now, alert=True)
                return True
            if outcome is not Outcome.PREEMPTED and infra > spec.retries.infra:
                self._finish(run, RunState.FAILED, f"infrastructure retry budget spent "
                             f"({spec.retries.infra})", now, alert=True)
                return True
            resume, checked = newest_verified(spec, self._plugins)
            failed = [Exclusion(n, "failed", f"failed attempt {last.number} (job "
                                f"{last.slurm_job_id}, {outcome.value})") for n in verdict.suspects]
            self._store.append_events([NewEvent(
                Kind.RECOVERY_RESUBMIT, run_id=run.id, attempt_id=last.id, actor="recovery",
                data={"outcome": outcome.value, "resume_from": resume,
                      "suspects": list(verdict.suspects), "checkpoints_checked": checked})], now)
            self._actions.resubmit(run.id, actor="recovery", failed=failed, resume_from=resume,
                                   from_scratch=resume is None, checked=checked)
            return True

    def black_hole_nodes(self) -> set[str]:
        """Nodes inside the black-hole window now (counted since each one's last return)."""
        return {h.node for h in self._black_holes(self._clock())}

    def _black_holes(self, now: datetime) -> list[NodeStrikes]:
        since = now - timedelta(seconds=self._blackhole.window_s)
        strikes = self._store.events(kinds=list(STRIKES), since=since)
        if not strikes:
            return []
        back = last_returns(self._store.events(kinds=list(STRIKE_RESETS), since=since))
        return black_holes(strikes, self._blackhole, now, back)

    def _verdict(self, run: Run, last: Attempt, spec: JobSpec,
                 nodes_now: Mapping[str, NodeRecord], now: datetime) -> Verdict:
        if last.outcome:
            # Classified before a crash or an earlier wait: keep that decision.
            ev = last.evidence
            return Verdict(outcome=Outcome(last.outcome), resubmit=bool(ev.get("resubmit")),
                           suspects=tuple(ev.get("suspects", ())),
                           implicated=tuple(ev.get("implicated", ())),
                           reasons=tuple(ev.get("reasons", ())), log_lines=tuple(ev.get("log", ())))
        mine = [e for e in self._store.events(run_id=run.id, kinds=list(END_CAUSES))
                if e.attempt_id == last.id]
        kinds = {e.kind for e in mine}
        signals = [e for e in mine if e.kind == Kind.CHECKPOINT_SIGNAL]
        lost = tuple(n for e in mine if e.kind == Kind.ATTEMPT_NODE_LOST for n in node_lost(e.data))
        sent = (SignalSent(signals[-1].ts, (s := CheckpointSignal.of(signals[-1])).signal, s.grace_s)
                if signals else None)
        return classify_end(
            last, spec, dict(nodes_now), self._log_tail(last, spec),
            cancel_requested=Kind.RUN_CANCEL in kinds, hang_detected=Kind.ATTEMPT_HANG in kinds,
            now=now, settle_s=self._config.settle_s, signal_sent=sent, lost=lost,
            node_health=self._node_health(last.nodes) if self._node_health else None,
            detect_window_s=self._detect_window_s,
            drained_working=self._straggler_drained(run, last, nodes_now),
        )

    def _straggler_drained(self, run: Run, last: Attempt, nodes_now: Mapping[str, NodeRecord]) -> set[str]:
        """The nodes of ``last`` drained as the run's straggler that respond now. The stored
        records keep no sinfo flags (a dead drained node is ``drained*`` with our reason),
        so sinfo is asked again, only when such a node exists (SlurmError: deferred)."""
        mine = [n for n in last.nodes if ours(nodes_now.get(n), run.id)]
        if not mine:
            return set()
        return straggler_drained(mine, {o.name: o for o in self._slurm.nodes()}, run.id)

    def _record_verdict(self, run: Run, last: Attempt, verdict: Verdict, now: datetime) -> Attempt:
        strikes = [NewEvent(Kind.NODE_FAILED, run_id=run.id, attempt_id=last.id, node=n,
                            data={"job_id": last.slurm_job_id, "outcome": verdict.outcome.value})
                   for n in verdict.suspects]
        strikes += [NewEvent(Kind.NODE_SUSPECT, run_id=run.id, attempt_id=last.id, node=n,
                             data={"job_id": last.slurm_job_id, "outcome": verdict.outcome.value})
                    for n in verdict.implicated]
        log.info("recovery.classified", outcome=verdict.outcome.value, suspects=list(verdict.suspects))
        # The newest checkpoint step when the attempt ended: the restart-loop breaker's record.
        evidence = {**verdict.evidence(), "newest_step": self._newest_step(spec_of(run))}
        return self._store.update_attempt(
            last.id, now, outcome=verdict.outcome.value, evidence=evidence,
            events=[NewEvent(Kind.ATTEMPT_CLASSIFIED, run_id=run.id, attempt_id=last.id,
                             data=evidence), *strikes])

    def _drain(self, run: Run, last: Attempt, nodes: tuple[str, ...],
               nodes_now: Mapping[str, NodeRecord], now: datetime) -> set[str]:
        """Drain the suspects of ``last`` once each (also across a crash); the drained set."""
        done = self._nodes.drained_for(run.id, last.id)
        drained: set[str] = set()
        for node in nodes:
            rec = nodes_now.get(node)
            if node in done or drained_by_us(rec):
                drained.add(node)
                continue
            reason = (f"b300: run {run.id} job {last.slurm_job_id} {last.state.value}"
                      f"{' exit ' + str(last.exit_code) if last.exit_code else ''}"
                      f"{' (' + rec.state.lower() + ': ' + rec.reason + ')' if rec and rec.reason else ''}")
            self._nodes.drain(node, reason, run_id=run.id, attempt_id=last.id, nodes_now=nodes_now)
            drained.add(node)
        return drained

    def _drain_black_holes(self, run: Run, last: Attempt, nodes_now: Mapping[str, NodeRecord],
                           drained: set[str], now: datetime) -> None:
        """Drain the nodes of ``last`` that are black holes now; a node drained already
        (by this failure or before) keeps its drain and its more specific reason."""
        for hole in self._black_holes(now):
            rec = nodes_now.get(hole.node)
            if hole.node not in last.nodes or hole.node in drained or node_is_bad(rec):
                continue
            names = ", ".join(hole.runs[:3]) + (f" +{len(hole.runs) - 3} more"
                                                if len(hole.runs) > 3 else "")
            reason = (f"b300: black hole: failed {len(hole.runs)} runs in "
                      f"{self._blackhole.window_s / 3600:g} h ({names})")
            self._nodes.drain(hole.node, reason, run_id=run.id, attempt_id=last.id, nodes_now={},
                              data={"black_hole": list(hole.runs)})

    def _finish(self, run: Run, state: RunState, why: str, now: datetime, *,
                alert: bool = False, kind: Kind | None = None,
                data: dict[str, object] | None = None) -> None:
        kind = kind or (Kind.RECOVERY_BUDGET_SPENT if alert else Kind.RECOVERY_STOPPED)
        self._store.set_run_state(run.id, state, now, events=[
            NewEvent(kind, run_id=run.id, data={"why": why, **(data or {})})])
        (log.error if alert or kind is not Kind.RECOVERY_STOPPED else log.info)(kind.value, why=why)

    # -- training health: "do not restart" and the restart-loop breaker ------

    def _training_stop(self, run: Run, last: Attempt, spec: JobSpec, attempts: Sequence[Attempt],
                       resubmit: bool) -> tuple[Kind, str, dict[str, object]] | None:
        """Why the run must end now instead of being resubmitted (or ending as it would),
        or None. A declared "do not restart" exit is honoured whatever the outcome (except
        a completed or cancelled run); the loop breaker only stops a resubmission."""
        from ..training.protocol import ExitIntent
        from ..training.restarts import (
            AttemptCheckpoints,
            ExitVerdict,
            classify_exit,
            restart_loop_decision,
        )

        outcome = Outcome(last.outcome)
        tspec = spec.health.training or TrainingSpec()
        if outcome not in (Outcome.COMPLETED, Outcome.CANCELLED):
            intents = [e for e in self._store.events(run_id=run.id, kinds=[Kind.TRAINING_EXIT_INTENT])
                       if e.attempt_id == last.id]
            intent = (ExitIntent((i := TrainingExitIntent.of(intents[-1])).restart, i.why)
                      if intents else None)
            exit_ = classify_exit(last.exit_code, no_restart_exit_codes=tspec.no_restart_exit_codes,
                                  intent=intent)
            if exit_.verdict is ExitVerdict.NO_RESTART:
                return Kind.RECOVERY_NO_RESTART, f"not resubmitted: {exit_.reason}", {
                    "exit_code": last.exit_code}
        if not resubmit or not self._training.enabled or not spec.checkpoint.dir:
            return None
        thresholds = self._training.for_run(tspec).restart_loop
        # The row starts after the newest attempt without a recorded checkpoint step
        # (classified before this was recorded: its progress is unknown, so it breaks the row).
        row: list[AttemptCheckpoints] = []
        for a in attempts:
            if not a.state.is_terminal or not a.outcome:
                continue
            if "newest_step" not in a.evidence:
                row = []
                continue
            step = a.evidence.get("newest_step")
            row.append(AttemptCheckpoints(a.number, a.outcome, step if isinstance(step, int) else None))
        # start_step None: the first attempt of the row is credited with the checkpoints the
        # folder held when it ended (conservative: at most one attempt more before a stop).
        decision = restart_loop_decision(row, thresholds, start_step=None)
        if not decision.stop:
            return None
        return Kind.RECOVERY_RESTART_LOOP, decision.reason, {
            "attempts": list(decision.attempts), "newest_step": decision.newest_step}

    def _newest_step(self, spec: JobSpec) -> int | None:
        """The newest complete checkpoint's step in the run's folder now (None: none)."""
        if not spec.checkpoint.dir:
            return None
        from ..checkpoints.layouts import load_layout

        try:
            found = load_layout(spec.checkpoint.layout, self._plugins).list_checkpoints(spec.checkpoint.dir)
        except (OSError, B300Error) as exc:
            log.warning("recovery.checkpoints_unlisted", error=str(exc))
            return None
        steps = [c.step for c in found if c.complete]
        return max(steps) if steps else None

    def _log_tail(self, attempt: Attempt, spec: JobSpec) -> list[str]:
        path = _job_log_path(attempt, spec, self._log_dir)
        if path is None:
            return []
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - _LOG_TAIL_BYTES))
                return f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return []


def job_log_path(attempt: Attempt, spec: JobSpec, log_dir: str | None) -> str | None:
    """The job's output file for ``attempt`` (the batch host's view of its output pattern)."""
    return _job_log_path(attempt, spec, log_dir)


def _job_log_path(attempt: Attempt, spec: JobSpec, log_dir: str | None) -> str | None:
    pattern = output_pattern(spec, log_dir)
    if attempt.slurm_job_id is None or pattern is None:
        return None
    # The daemon submits as itself; the batch script runs on the allocation's first node.
    return expand_output_pattern(pattern, job_id=attempt.slurm_job_id, job_name=attempt.tag,
                                 user=pwd.getpwuid(os.geteuid()).pw_name,
                                 batch_host=attempt.nodes[0] if attempt.nodes else "")
