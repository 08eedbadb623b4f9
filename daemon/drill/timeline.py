"""The pure part of a failure drill: may this run be drilled, on which node, and the
drill's figures computed from the event log (no I/O, no clock).

A drill's record is its events (:data:`b300.events.DRILLS`): ``drill.started`` (written
right before the failure is injected; its time is the drill's zero), ``drill.injected``
and ``drill.finished`` (the figures). Every figure is seconds from the zero to the first
event that shows the milestone, so it can be recomputed from the store at any time:

- **detect**: the daemon first saw the failure: its own checks (``liveness.dead``), the
  node lost by the attempt (``attempt.node_lost``), Slurm showing the node bad
  (``node.state``) or the attempt ending (``attempt.state``);
- **drain**: the node drained (``node.drained``);
- **excluded**: the node kept off the run: drained, or named in the exclude list of the
  run's next attempt (``attempt.intent``), whichever came first;
- **resubmit**: the next attempt's job submitted (``attempt.submitted``);
- **allocation**: the next attempt running (``attempt.state`` to RUNNING);
- **training again**: the run's progress file showed a step past the resume step (seen
  by the daemon; passed in, as it is not an event);
- **steps lost**: the last step the run reached (when the node was pulled, or later: the
  job may run on until the failure takes hold, and save a newer checkpoint meanwhile),
  minus the step the next attempt resumed at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..events import Kind
from ..model import Attempt, AttemptState, Event, Run, RunState
from ..payloads import AttemptIntent, AttemptStateChange, DrillFinished, NodeState

METHODS = ("down", "crash")
MAX_TIMEOUT_S = 3600.0
_BAD = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "UNKNOWN", "INVAL", "POWER", "MAINT", "REBOOT")


def node_healthy(state: str, reason: str = "") -> bool:
    """A node in service as Slurm shows it (idle, allocated, mixed, completing; not
    down, drained, failing or not responding)."""
    s = state.upper()
    return bool(s) and not s.endswith("*") and not any(b in s for b in _BAD) \
        and "NOT RESPONDING" not in reason.upper()


@dataclass(frozen=True, slots=True)
class DrillPlan:
    """What a drill is about to do (the refusal rules passed)."""

    run_id: str
    attempt: Attempt
    node: str
    method: str


def drill_refusal(run: Run, attempts: Sequence[Attempt], *, node: str | None, method: str,
                  has_checkpoint: bool, has_progress_file: bool, recovery_on: bool,
                  crash_command: bool, open_drill: int | None) -> str | None:
    """Why this drill may not run (one line), or None."""
    if method not in METHODS:
        return f"unknown drill method {method!r} (one of {', '.join(METHODS)})"
    if not recovery_on:
        return "recovery is off ([recovery] enabled = false): a drill would only end the run"
    current = attempts[-1] if attempts else None
    if run.state is not RunState.RUNNING or current is None or current.state is not AttemptState.RUNNING \
            or not current.nodes or current.slurm_job_id is None:
        state = current.state.value if current is not None else "no attempt"
        return f"run {run.id} is not running ({run.state.value}, {state}): nothing to drill"
    if open_drill is not None:
        return f"run {run.id} is being drilled already (drill {open_drill})"
    if not has_checkpoint:
        return f"run {run.id} has no verified checkpoint: a drill would lose all its progress"
    if not has_progress_file:
        return f"run {run.id} has no [health] progress_file: a drill could not see it train again"
    if node is not None and node not in current.nodes:
        return (f"node {node} is not in run {run.id}'s attempt {current.number} "
                f"(nodes {','.join(current.nodes)})")
    if method == "crash" and not crash_command:
        return "--method crash needs [drill] crash_command in the config"
    return None


def pick_node(attempt: Attempt, node: str | None) -> str:
    """The node to pull: the one given, else the attempt's last one (rank 0, where the
    batch script and the progress file's writer usually run, is its first)."""
    return node if node is not None else attempt.nodes[-1]


@dataclass(frozen=True, slots=True)
class DrillStart:
    """A ``drill.started`` event, read back."""

    id: int
    ts: datetime
    run_id: str
    attempt_id: int
    attempt: int
    node: str
    method: str
    step_at_failure: int | None
    resume_step: int | None
    node_was_healthy: bool
    node_state: str
    timeout_s: float

    @classmethod
    def of(cls, e: Event) -> DrillStart:
        d = e.data
        return cls(id=e.id, ts=e.ts, run_id=e.run_id or "", attempt_id=e.attempt_id or 0,
                   attempt=_int(d.get("attempt")) or 0, node=str(d.get("node", "")),
                   method=str(d.get("method", "")), step_at_failure=_int(d.get("step_at_failure")),
                   resume_step=_int(d.get("resume_step")), node_was_healthy=bool(d.get("node_was_healthy")),
                   node_state=str(d.get("node_state", "")),
                   timeout_s=float(d.get("timeout_s") or MAX_TIMEOUT_S))


@dataclass(frozen=True, slots=True)
class DrillFigures:
    """Seconds from the drill's zero to each milestone (None: not reached)."""

    detect_s: float | None = None
    detected_by: str = ""
    drain_s: float | None = None
    excluded_s: float | None = None
    resubmit_s: float | None = None
    allocation_s: float | None = None
    training_s: float | None = None
    trained_step: int | None = None
    new_attempt: int | None = None
    resume_step: int | None = None
    last_step: int | None = None
    steps_lost: int | None = None

    def as_data(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in (
            ("detect_s", self.detect_s), ("detected_by", self.detected_by), ("drain_s", self.drain_s),
            ("excluded_s", self.excluded_s), ("resubmit_s", self.resubmit_s),
            ("allocation_s", self.allocation_s), ("training_s", self.training_s),
            ("trained_step", self.trained_step), ("new_attempt", self.new_attempt),
            ("resume_step", self.resume_step), ("last_step", self.last_step),
            ("steps_lost", self.steps_lost))}


def next_attempt(start: DrillStart, attempts: Sequence[Attempt]) -> Attempt | None:
    """The run's first attempt after the drilled one (the one recovery submitted)."""
    later = [a for a in attempts if a.number > start.attempt]
    return later[0] if later else None


def drill_figures(start: DrillStart, events: Sequence[Event], attempts: Sequence[Attempt], *,
                  trained: tuple[datetime, int] | None = None,
                  resume_steps: Mapping[str, int] | None = None,
                  last_step: int | None = None) -> DrillFigures:
    """The figures of ``start``'s drill from the events since it (any order; others ignored),
    the run's attempts, when the progress file was first seen past the resume step
    (``trained``: time, step), the steps of the run's checkpoints by path and the highest
    step seen of the drilled attempt (``last_step``)."""
    zero = start.ts
    later = next_attempt(start, attempts)
    later_ids = {a.id for a in attempts if a.number > start.attempt}

    def first(match: Any) -> tuple[float, Event] | None:
        hits = sorted((e for e in events if e.ts >= zero and match(e)), key=lambda e: (e.ts, e.id))
        return ((hits[0].ts - zero).total_seconds(), hits[0]) if hits else None

    node = start.node
    detect = first(lambda e: (e.kind == Kind.LIVENESS_DEAD and e.node == node)
                   or (e.kind == Kind.ATTEMPT_NODE_LOST and e.attempt_id == start.attempt_id)
                   or (e.kind == Kind.NODE_STATE and e.node == node
                       and not node_healthy((s := NodeState.of(e)).state, s.reason))
                   or (e.kind == Kind.ATTEMPT_STATE and e.attempt_id == start.attempt_id
                       and _ended(AttemptStateChange.of(e).to_state)))
    drain = first(lambda e: e.kind == Kind.NODE_DRAINED and e.node == node)
    kept_off = first(lambda e: e.kind == Kind.ATTEMPT_INTENT and e.run_id == start.run_id
                     and node in AttemptIntent.of(e).exclude)
    resubmit = first(lambda e: e.kind == Kind.ATTEMPT_SUBMITTED and e.attempt_id in later_ids)
    allocation = first(lambda e: e.kind == Kind.ATTEMPT_STATE and e.attempt_id in later_ids
                       and AttemptStateChange.of(e).to_state == AttemptState.RUNNING.value)
    excluded = min((x[0] for x in (drain, kept_off) if x is not None), default=None)
    resume_step = start.resume_step
    if later is not None and later.resume_from and resume_steps and later.resume_from in resume_steps:
        resume_step = resume_steps[later.resume_from]
    training_s = trained_step = None
    if trained is not None and later is not None:
        training_s, trained_step = (trained[0] - zero).total_seconds(), trained[1]
    reached = max((s for s in (start.step_at_failure, last_step) if s is not None), default=None)
    lost = max(0, reached - resume_step) if reached is not None and resume_step is not None else None
    return DrillFigures(
        detect_s=detect[0] if detect else None, detected_by=detect[1].kind if detect else "",
        drain_s=drain[0] if drain else None, excluded_s=excluded,
        resubmit_s=resubmit[0] if resubmit else None, allocation_s=allocation[0] if allocation else None,
        training_s=training_s, trained_step=trained_step,
        new_attempt=later.number if later is not None else None, resume_step=resume_step,
        last_step=reached, steps_lost=lost)


def trained_again(step: str, resume_step: int | None) -> int | None:
    """The step in a progress file when it is past ``resume_step`` (a fresh start: past 0)."""
    try:
        n = int(step)
    except ValueError:
        return None
    return n if n > (resume_step or 0) else None


def open_drills(events: Sequence[Event]) -> list[DrillStart]:
    """The drills started among ``events`` that have no ``drill.finished`` yet."""
    finished = {DrillFinished.of(e).drill for e in events if e.kind == Kind.DRILL_FINISHED}
    return [DrillStart.of(e) for e in events if e.kind == Kind.DRILL_STARTED and e.id not in finished]


def _ended(state: str) -> bool:
    try:
        return AttemptState(state).is_terminal
    except ValueError:
        return False


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
