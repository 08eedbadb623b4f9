"""Recovery: drain the nodes behind a failure and resubmit from a good checkpoint.

Runs inside the daemon's poll cycle, under its action lock. Each step is
idempotent or recorded before it acts, so a crash anywhere in it is finished
on the next cycle after a restart:

- the classification, the node strikes and the drains of an attempt are
  recorded once (the attempt's ``outcome`` marks it classified);
- draining a node already drained is skipped;
- the resubmission is an intent (:class:`b300.runs.RunService`), so it reaches
  Slurm at most once.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog

from ..config import RecoveryConfig
from ..errors import SlurmError
from ..events import END_CAUSES, STRIKE_RESETS, STRIKES, Kind
from ..faults import crashpoint
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Attempt, AttemptState, NodeRecord, Run, RunState
from ..runs import RunService
from ..slurm.script import expand_output_pattern, output_pattern
from ..spec import JobSpec, parse_spec
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

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]
_LOG_TAIL_BYTES = 256 * 1024
# attempt.progress events: the first step, then at most this often (report: restart, recompute).
_PROGRESS_EVENT_EVERY = timedelta(minutes=5)
_FINAL = {Outcome.COMPLETED: RunState.COMPLETED, Outcome.CANCELLED: RunState.CANCELLED}


@dataclass(slots=True)
class _Progress:
    step: str
    since: datetime


class RecoveryService:
    """Decides and acts on runs whose last attempt ended without completing."""

    def __init__(
        self,
        store: Store,
        slurm: SlurmClient,
        runs: RunService,
        clock: Clock,
        config: RecoveryConfig,
        *,
        job_log_dir: str | None = None,
    ) -> None:
        self._store = store
        self._slurm = slurm
        self._runs = runs
        self._clock = clock
        self._config = config
        self._log_dir = job_log_dir
        self._blackhole = BlackHolePolicy(config.blackhole_failures, config.blackhole_window_s)
        self._progress: dict[int, _Progress] = {}
        self._progress_recorded: dict[int, datetime] = {}
        # Steps already in the event log per attempt (read once per attempt, so a
        # restarted daemon does not record them again).
        self._recorded_steps: dict[int, set[int]] = {}
        self._waiting: set[int] = set()

    def reconfigure(self, config: RecoveryConfig) -> None:
        """Take new thresholds (SIGHUP); in-memory progress tracking is kept."""
        self._config = config
        self._blackhole = BlackHolePolicy(config.blackhole_failures, config.blackhole_window_s)

    # -- ended attempts ---------------------------------------------------

    def recover_all(self) -> int:
        """Handle every run in RECOVERING; returns how many were decided."""
        decided = 0
        for run in self._store.list_runs([RunState.RECOVERING]):
            try:
                if self.recover(run):
                    decided += 1
            except SlurmError as exc:
                log.warning("recovery.deferred", run=run.id, error=str(exc))
        return decided

    def recover(self, run: Run) -> bool:
        """Decide about one RECOVERING run. False when it must wait for more evidence."""
        attempts = self._store.attempts(run.id)
        if not attempts or not attempts[-1].state.is_terminal:
            return False
        last = attempts[-1]
        spec = parse_spec(run.spec_toml, where=f"run {run.id}")
        now = self._clock()
        nodes_now = {n.name: n for n in self._store.list_nodes()}
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
        if not verdict.resubmit:
            state = _FINAL.get(outcome, RunState.FAILED)
            self._finish(run, state, f"{outcome.value}: not resubmitted", now)
            return True
        infra, preempt = retries_used(attempts)
        if outcome is Outcome.PREEMPTED and preempt > spec.retries.preemption:
            self._finish(run, RunState.FAILED, f"preemption retry budget spent "
                         f"({spec.retries.preemption})", now, alert=True)
            return True
        if outcome is not Outcome.PREEMPTED and infra > spec.retries.infra:
            self._finish(run, RunState.FAILED, f"infrastructure retry budget spent "
                         f"({spec.retries.infra})", now, alert=True)
            return True
        from ..checkpoints.resume_point import newest_verified

        resume, checked = newest_verified(spec)
        failed = [Exclusion(n, "failed", f"failed attempt {last.number} (job "
                            f"{last.slurm_job_id}, {outcome.value})") for n in verdict.suspects]
        self._store.append_events([NewEvent(
            Kind.RECOVERY_RESUBMIT, run_id=run.id, attempt_id=last.id, actor="recovery",
            data={"outcome": outcome.value, "resume_from": resume,
                  "suspects": list(verdict.suspects), "checkpoints_checked": checked})], now)
        self._runs.resubmit(run.id, actor="recovery", failed=failed, resume_from=resume,
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
                 nodes_now: dict[str, NodeRecord], now: datetime) -> Verdict:
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
        sent = (SignalSent(signals[-1].ts, str(signals[-1].data.get("signal", "?")),
                           float(signals[-1].data.get("grace_s", 0)))
                if signals else None)
        return classify_end(
            last, spec, nodes_now, self._log_tail(last, spec),
            cancel_requested=Kind.RUN_CANCEL in kinds, hang_detected=Kind.ATTEMPT_HANG in kinds,
            now=now, settle_s=self._config.settle_s, signal_sent=sent,
        )

    def _record_verdict(self, run: Run, last: Attempt, verdict: Verdict, now: datetime) -> Attempt:
        strikes = [NewEvent(Kind.NODE_FAILED, run_id=run.id, attempt_id=last.id, node=n,
                            data={"job_id": last.slurm_job_id, "outcome": verdict.outcome.value})
                   for n in verdict.suspects]
        strikes += [NewEvent(Kind.NODE_SUSPECT, run_id=run.id, attempt_id=last.id, node=n,
                             data={"job_id": last.slurm_job_id, "outcome": verdict.outcome.value})
                    for n in verdict.implicated]
        log.info("recovery.classified", run=run.id, job_id=last.slurm_job_id,
                 outcome=verdict.outcome.value, suspects=list(verdict.suspects))
        return self._store.update_attempt(
            last.id, now, outcome=verdict.outcome.value, evidence=verdict.evidence(),
            events=[NewEvent(Kind.ATTEMPT_CLASSIFIED, run_id=run.id, attempt_id=last.id,
                             data=verdict.evidence()), *strikes])

    def _drain(self, run: Run, last: Attempt, nodes: tuple[str, ...],
               nodes_now: dict[str, NodeRecord], now: datetime) -> set[str]:
        """Drain the suspects of ``last`` once each (also across a crash); the drained set."""
        done = {e.node for e in self._store.events(run_id=run.id, kinds=[Kind.NODE_DRAINED])
                if e.attempt_id == last.id and e.node}
        drained: set[str] = set()
        for node in nodes:
            rec = nodes_now.get(node)
            if node in done or (rec is not None and "DRAIN" in rec.state.upper()
                                and rec.reason.startswith("b300")):
                drained.add(node)
                continue
            reason = (f"b300: run {run.id} job {last.slurm_job_id} {last.state.value}"
                      f"{' exit ' + str(last.exit_code) if last.exit_code else ''}"
                      f"{' (' + rec.state.lower() + ': ' + rec.reason + ')' if rec and rec.reason else ''}")
            self._slurm.drain_node(node, reason)
            self._store.append_events([NewEvent(
                Kind.NODE_DRAINED, run_id=run.id, attempt_id=last.id, node=node,
                data={"reason": reason})], now)
            log.warning("node.drained", node=node, run=run.id, reason=reason)
            drained.add(node)
        return drained

    def _drain_black_holes(self, run: Run, last: Attempt, nodes_now: dict[str, NodeRecord],
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
            self._slurm.drain_node(hole.node, reason)
            self._store.append_events([NewEvent(
                Kind.NODE_DRAINED, run_id=run.id, attempt_id=last.id, node=hole.node,
                data={"reason": reason, "black_hole": list(hole.runs)})], now)
            log.warning("node.drained", node=hole.node, run=run.id, reason=reason)

    def _finish(self, run: Run, state: RunState, why: str, now: datetime, *,
                alert: bool = False) -> None:
        kind = Kind.RECOVERY_BUDGET_SPENT if alert else Kind.RECOVERY_STOPPED
        self._store.set_run_state(run.id, state, now, events=[
            NewEvent(kind, run_id=run.id, data={"why": why}),
            NewEvent(Kind.RUN_STATE, run_id=run.id, data={"from": run.state.value,
                                                       "to": state.value})])
        (log.error if alert else log.info)(kind, run=run.id, why=why)

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

    def on_requeued(self, before: Attempt, after: Attempt) -> None:
        """Slurm requeued a running job itself (same job id, PENDING again).

        No new submission: drain the nodes it ran on that Slurm now shows as
        bad, and update the pending job's excluded nodes so it restarts away
        from them (Slurm's own requeue does not exclude them).
        """
        now = self._clock()
        nodes_now = {n.name: n for n in self._store.list_nodes()}
        bad = tuple(n for n in before.nodes if node_is_bad(nodes_now.get(n)))
        run = self._store.get_run(before.run_id)
        self._store.append_events([NewEvent(
            Kind.ATTEMPT_REQUEUED, run_id=run.id, attempt_id=before.id,
            data={"job_id": before.slurm_job_id, "nodes": list(before.nodes),
                  "suspects": list(bad)})], now)
        self._store.append_events([NewEvent(Kind.NODE_FAILED, run_id=run.id, attempt_id=before.id,
                                            node=n, data={"job_id": before.slurm_job_id,
                                                          "outcome": "REQUEUED"}) for n in bad],
                                  now)
        self._drain(run, before, bad, nodes_now, now)
        if after.slurm_job_id is None:
            return
        spec = parse_spec(run.spec_toml, where=f"run {run.id}")
        failed = [Exclusion(n, "failed", f"failed attempt {before.number} (job "
                            f"{before.slurm_job_id}, requeued by Slurm)") for n in bad]
        plan = self._runs.plan_exclusions(spec, [*failed, *self._runs.attempt_exclusions(before)],
                                          fresh=bad)
        if plan.nodes != sorted(after.excluded_nodes):
            self._slurm.exclude_nodes(after.slurm_job_id, plan.nodes)
            self._store.update_attempt(after.id, now, excluded_nodes=plan.nodes, events=[
                NewEvent(Kind.ATTEMPT_EXCLUDED, run_id=run.id, attempt_id=after.id,
                         data={"exclude": plan.nodes,
                               "exclusions": [e.to_dict() for e in plan.kept]})])

    # -- running attempts: hangs ------------------------------------------

    def check_hangs(self) -> int:
        """Cancel running attempts whose progress file has not advanced in time."""
        now = self._clock()
        hung = 0
        live = {a.id for a in self._store.active_attempts()}
        for gone in set(self._progress) - live:
            self._record_last_progress(gone, self._progress[gone])
        self._progress = {k: v for k, v in self._progress.items() if k in live}
        self._progress_recorded = {k: v for k, v in self._progress_recorded.items() if k in live}
        self._recorded_steps = {k: v for k, v in self._recorded_steps.items() if k in live}
        for attempt in self._store.active_attempts():
            if attempt.state is not AttemptState.RUNNING or attempt.slurm_job_id is None:
                continue
            run = self._store.get_run(attempt.run_id)
            spec = parse_spec(run.spec_toml, where=f"run {run.id}")
            if not spec.health.progress_file:
                continue
            self._seed_progress(attempt)
            step = _read_progress(spec.health.progress_file, attempt.start)
            seen = self._progress.get(attempt.id)
            if step == "":
                # No step yet in this attempt: it is still starting up.
                since = attempt.start or now
                limit = spec.health.startup_timeout_s
            else:
                if seen is None or seen.step != step:
                    self._progress[attempt.id] = _Progress(step, now)
                    self._record_progress(attempt, step, now)
                    continue
                since, limit = seen.since, spec.health.hang_timeout_s
            stalled = (now - since).total_seconds()
            if stalled < limit:
                continue
            data = {"job_id": attempt.slurm_job_id, "last_step": step or None,
                    "stalled_s": round(stalled, 1), "progress_file": spec.health.progress_file}
            self._store.append_events([NewEvent(Kind.ATTEMPT_HANG, run_id=run.id,
                                                attempt_id=attempt.id, data=data)], now)
            log.warning("attempt.hang", run=run.id, **data)
            self._slurm.cancel(attempt.slurm_job_id)
            hung += 1
        return hung

    def _seed_progress(self, attempt: Attempt) -> None:
        """What an earlier daemon already recorded of this attempt's progress (once)."""
        if attempt.id in self._recorded_steps:
            return
        mine = [e for e in self._store.events(run_id=attempt.run_id, kinds=[Kind.ATTEMPT_PROGRESS])
                if e.attempt_id == attempt.id]
        self._recorded_steps[attempt.id] = {int(e.data["step"]) for e in mine
                                            if isinstance(e.data.get("step"), int)}
        if mine:
            self._progress_recorded[attempt.id] = mine[-1].ts

    def _record_progress(self, attempt: Attempt, step: str, now: datetime) -> None:
        """An ``attempt.progress`` event: the first step seen, then at most every 5 minutes
        (the weekly report's restart and recompute times come from these)."""
        last = self._progress_recorded.get(attempt.id)
        if not step.isdigit() or (last is not None and now - last < _PROGRESS_EVENT_EVERY):
            return
        steps = self._recorded_steps.setdefault(attempt.id, set())
        if int(step) in steps:
            return
        steps.add(int(step))
        self._progress_recorded[attempt.id] = now
        self._store.append_events([NewEvent(Kind.ATTEMPT_PROGRESS, run_id=attempt.run_id,
                                            attempt_id=attempt.id, data={"step": int(step)})], now)

    def _record_last_progress(self, attempt_id: int, seen: _Progress) -> None:
        """The last step an ended attempt reached, stamped when it was first seen (if not recorded
        yet): the steps after its checkpoint that the next attempt must redo."""
        recorded = self._progress_recorded.get(attempt_id)
        if not seen.step.isdigit() or (recorded is not None and recorded >= seen.since):
            return
        if int(seen.step) in self._recorded_steps.get(attempt_id, set()):
            return
        run_id = self._store.get_attempt(attempt_id).run_id
        self._store.append_events([NewEvent(Kind.ATTEMPT_PROGRESS, run_id=run_id, attempt_id=attempt_id,
                                            data={"step": int(seen.step), "last": True})], seen.since)


def _read_progress(path: str, started: datetime | None) -> str:
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


def _job_log_path(attempt: Attempt, spec: JobSpec, log_dir: str | None) -> str | None:
    pattern = output_pattern(spec, log_dir)
    if attempt.slurm_job_id is None or pattern is None:
        return None
    # The daemon submits as itself; the batch script runs on the allocation's first node.
    return expand_output_pattern(pattern, job_id=attempt.slurm_job_id, job_name=attempt.tag,
                                 user=pwd.getpwuid(os.geteuid()).pw_name,
                                 batch_host=attempt.nodes[0] if attempt.nodes else "")
