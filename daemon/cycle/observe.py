"""What an observation of Slurm means for a tracked attempt (pure functions).

No I/O and no clock reads: the tracker passes in what it saw and what time it
is, and gets back the change to record, if any.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..events import Kind
from ..interfaces import NewEvent
from ..model import Attempt, AttemptState, JobObservation, RunState, SlurmState

_ACTIVE_MAP = {
    SlurmState.PENDING: AttemptState.PENDING,
    SlurmState.CONFIGURING: AttemptState.PENDING,
    SlurmState.REQUEUED: AttemptState.PENDING,
    SlurmState.EXPEDITING: AttemptState.PENDING,
    SlurmState.REQUEUE_HOLD: AttemptState.PENDING,
    SlurmState.REQUEUE_FED: AttemptState.PENDING,
    SlurmState.RESV_DEL_HOLD: AttemptState.PENDING,
    SlurmState.SPECIAL_EXIT: AttemptState.PENDING,
    SlurmState.RUNNING: AttemptState.RUNNING,
    SlurmState.RESIZING: AttemptState.RUNNING,
    SlurmState.SIGNALING: AttemptState.RUNNING,
    SlurmState.STAGE_OUT: AttemptState.RUNNING,
    SlurmState.COMPLETING: AttemptState.COMPLETING,
    SlurmState.SUSPENDED: AttemptState.SUSPENDED,
    SlurmState.STOPPED: AttemptState.SUSPENDED,
    SlurmState.REVOKED: AttemptState.CANCELLED,
}


def attempt_state_for(state: SlurmState) -> AttemptState:
    """The attempt state that a Slurm job state stands for."""
    if state in _ACTIVE_MAP:
        return _ACTIVE_MAP[state]
    return AttemptState(state.value)


@dataclass(frozen=True, slots=True)
class AttemptChange:
    """Fields of an attempt to change, and the event that says so."""

    attempt_id: int
    state: AttemptState
    nodes: tuple[str, ...]
    reason: str
    exit_code: int | None
    signal: int | None
    start: datetime | None
    end: datetime | None
    event: NewEvent | None


def observe_attempt(
    attempt: Attempt,
    live: JobObservation | None,
    accounted: JobObservation | None,
    *,
    terminal_since: datetime | None,
    now: datetime,
    accounting_grace_s: float,
) -> AttemptChange | None:
    """The change that ``attempt`` needs given what squeue and sacct said.

    - A job the controller shows as active is taken as the controller says
      (it is fresher than accounting, e.g. after Slurm requeued it).
    - An ended job is final once sacct has it (that is where the exit code
      is); if the controller says it ended but sacct has no record yet, the
      attempt waits ``accounting_grace_s`` from ``terminal_since`` and then
      ends with the controller's state and an unknown exit code.
    - A job neither shows is unknown: nothing changes (an outage or a lag
      must never look like a failure).
    """
    obs: JobObservation | None
    if live is not None and not live.state.is_terminal:
        obs = live
    elif accounted is not None and accounted.state.is_terminal:
        obs = accounted
    elif live is not None and live.state.is_terminal:
        waited = (now - terminal_since).total_seconds() if terminal_since else 0.0
        if waited < accounting_grace_s:
            return None
        obs = live
    else:
        return None
    state = attempt_state_for(obs.state)
    nodes = obs.nodes or attempt.nodes
    start = obs.start or attempt.start
    end = obs.end if state.is_terminal else None
    exit_code = obs.exit_code if obs.exit_code is not None else attempt.exit_code
    signal = obs.signal if obs.signal is not None else attempt.signal
    # A change of the reason alone (why a job waits: Resources, ReqNodeNotAvail, a
    # hold) is recorded too, without an event: it flips often on a busy cluster, and
    # the tracker writes a whole cycle's changes in one transaction.
    if (state, nodes, start, end, exit_code, signal, obs.reason) == (
        attempt.state, attempt.nodes, attempt.start, attempt.end,
        attempt.exit_code, attempt.signal, attempt.reason,
    ):
        return None
    event = None
    if state != attempt.state or nodes != attempt.nodes:
        event = NewEvent(
            kind=Kind.ATTEMPT_STATE,
            run_id=attempt.run_id,
            attempt_id=attempt.id,
            data={
                "job_id": attempt.slurm_job_id,
                "from": attempt.state.value,
                "to": state.value,
                "slurm_state": obs.state.value,
                "source": obs.source,
                "nodes": list(nodes),
                "reason": obs.reason,
                "exit_code": exit_code,
                "signal": signal,
            },
        )
    return AttemptChange(
        attempt_id=attempt.id, state=state, nodes=nodes, reason=obs.reason,
        exit_code=exit_code, signal=signal, start=start, end=end, event=event,
    )


def run_state_for(latest: Attempt | None) -> RunState:
    """The run's state, read off its newest attempt."""
    if latest is None:
        return RunState.SUBMITTING
    s = latest.state
    if s is AttemptState.SUBMITTING:
        return RunState.SUBMITTING
    if s is AttemptState.PENDING:
        return RunState.PENDING
    if s in (AttemptState.RUNNING, AttemptState.COMPLETING, AttemptState.SUSPENDED):
        return RunState.RUNNING
    if s is AttemptState.COMPLETED:
        return RunState.COMPLETED
    if s is AttemptState.CANCELLED:
        return RunState.CANCELLED
    return RunState.FAILED
