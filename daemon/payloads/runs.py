"""Payloads of runs and their attempts: Slurm states, recovery, training health, checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..events import TRAINING_FINDINGS, TRAINING_STOPS, Kind
from .base import Payload, _count, _int, _key, _names, _number, _opt_text, _seconds, _text, _true, _truthy


@dataclass(frozen=True, slots=True)
class AttemptStateChange(Payload):
    """``attempt.state``: an attempt went from one state to another."""

    KIND: ClassVar[Kind] = Kind.ATTEMPT_STATE
    from_state: str = _key(_text, "", "from")
    to_state: str = _key(_text, "", "to")
    job_id: int | None = _key(_int, None)
    slurm_state: str = _key(_text, "")
    reason: str = _key(_text, "")
    nodes: tuple[str, ...] = _key(_names, ())
    exit_code: int | None = _key(_int, None)
    signal: int | None = _key(_int, None)


@dataclass(frozen=True, slots=True)
class AttemptRequeued(Payload):
    """``attempt.requeued``: Slurm requeued the attempt's job itself (same job id)."""

    KIND: ClassVar[Kind] = Kind.ATTEMPT_REQUEUED
    job_id: int | None = _key(_int, None)
    nodes: tuple[str, ...] = _key(_names, ())
    suspects: tuple[str, ...] = _key(_names, ())


@dataclass(frozen=True, slots=True)
class AttemptProgress(Payload):
    """``attempt.progress``: a step the job reached (``at``: when it wrote it, epoch seconds;
    ``last``: the last step of an ended attempt)."""

    KIND: ClassVar[Kind] = Kind.ATTEMPT_PROGRESS
    step: int | None = _key(_int, None)
    at: float | None = _key(_number, None)
    last: bool = _key(_true, False)


@dataclass(frozen=True, slots=True)
class AttemptIntent(Payload):
    """``attempt.intent``: an attempt about to be submitted, with the nodes it is kept off."""

    KIND: ClassVar[Kind] = Kind.ATTEMPT_INTENT
    number: int | None = _key(_int, None)
    exclude: tuple[str, ...] = _key(_names, ())
    resume_from: str | None = _key(_opt_text, None)
    reservation: str | None = _key(_opt_text, None)


@dataclass(frozen=True, slots=True)
class AttemptNodeLost(Payload):
    """``attempt.node_lost``: nodes of a running attempt found dead (the job itself may live on)."""

    KIND: ClassVar[Kind] = Kind.ATTEMPT_NODE_LOST
    job_id: int | None = _key(_int, None)
    nodes: tuple[str, ...] = _key(_names, ())
    evidence: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class StepRelaunch(Payload):
    """``attempt.step_relaunch``: the intent to replace a dead node's step in the same job."""

    KIND: ClassVar[Kind] = Kind.ATTEMPT_STEP_RELAUNCH
    job_id: int | None = _key(_int, None)
    generation: int = _key(_count, 0)
    exclude: tuple[str, ...] = _key(_names, ())
    outcome: str = _key(_text, "")
    cause: str = _key(_text, "")
    spares_left: int | None = _key(_int, None)


@dataclass(frozen=True, slots=True)
class StepStarted(Payload):
    """``attempt.step_started``: the launcher started the relaunched step (``generation``)."""

    KIND: ClassVar[Kind] = Kind.ATTEMPT_STEP_STARTED
    job_id: int | None = _key(_int, None)
    generation: int | None = _key(_int, None)
    step_id: str = _key(_text, "")
    nodes: tuple[str, ...] = _key(_names, ())
    exclude: tuple[str, ...] = _key(_names, ())


@dataclass(frozen=True, slots=True)
class RecoveryStop(Payload):
    """Recovery stopped resubmitting a run (``recovery.stopped``), or a spent budget, a restart
    loop or the job's own "do not restart" stopped it; ``why`` says which in words."""

    KIND: ClassVar[Kind] = Kind.RECOVERY_STOPPED
    ALSO: ClassVar[tuple[Kind, ...]] = (Kind.RECOVERY_BUDGET_SPENT, *TRAINING_STOPS)
    why: str = _key(_text, "")
    attempts: int | None = _key(_int, None)
    newest_step: int | None = _key(_int, None)
    exit_code: int | None = _key(_int, None)


@dataclass(frozen=True, slots=True)
class TrainingFinding(Payload):
    """What a training-health detector found in a running attempt (a loss spike, a NaN loss,
    a throughput drop, a straggler, a stalled checkpoint): ``step``, where it was seen."""

    KIND: ClassVar[Kind] = TRAINING_FINDINGS[0]
    ALSO: ClassVar[tuple[Kind, ...]] = TRAINING_FINDINGS[1:]
    evidence: str = _key(_text, "")
    host: str | None = _key(_opt_text, None)
    value: float | None = _key(_number, None)
    threshold: float | None = _key(_number, None)
    step: int | None = _key(_int, None)


@dataclass(frozen=True, slots=True)
class TrainingProgressProblem(Payload):
    """``training.progress_problem``: a progress file the daemon could not read, and why."""

    KIND: ClassVar[Kind] = Kind.TRAINING_PROGRESS_PROBLEM
    path: str = _key(_text, "")
    offset: int | None = _key(_int, None)
    problem: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class TrainingFigures(Payload):
    """``training.figures``: the job's own figures at a step (a figure it did not write: None)."""

    KIND: ClassVar[Kind] = Kind.TRAINING_FIGURES
    step: int | None = _key(_int, None)
    loss: float | None = _key(_number, None)
    tokens_per_s: float | None = _key(_number, None)
    samples_per_s: float | None = _key(_number, None)
    mfu: float | None = _key(_number, None)
    seconds_per_step: float | None = _key(_number, None)
    stragglers: tuple[str, ...] = _key(_names, ())


@dataclass(frozen=True, slots=True)
class TrainingExitIntent(Payload):
    """``training.exit_intent``: what the job said before it ended (restart it or not, and why)."""

    KIND: ClassVar[Kind] = Kind.TRAINING_EXIT_INTENT
    restart: bool = _key(_truthy, False)
    why: str = _key(_text, "")
    step: int | None = _key(_int, None)


@dataclass(frozen=True, slots=True)
class CheckpointSignal(Payload):
    """``checkpoint.signal``: b300d sent the job its checkpoint signal, with this grace."""

    KIND: ClassVar[Kind] = Kind.CHECKPOINT_SIGNAL
    message: str = _key(_text, "")
    signal: str = _key(_text, "?")
    grace_s: float = _key(_seconds, 0.0)
    job_id: int | None = _key(_int, None)


@dataclass(frozen=True, slots=True)
class CheckpointOverdue(Payload):
    """``checkpoint.overdue``: a run's newest checkpoint is older than its schedule allows."""

    KIND: ClassVar[Kind] = Kind.CHECKPOINT_OVERDUE
    message: str = _key(_text, "")
    job_id: int | None = _key(_int, None)
    age_s: float | None = _key(_number, None)
    interval_s: float | None = _key(_number, None)
    newest_step: int | None = _key(_int, None)
    signals: int = _key(_count, 0)


@dataclass(frozen=True, slots=True)
class CheckpointOk(Payload):
    """``checkpoint.ok``: an overdue run met its checkpoint schedule again."""

    KIND: ClassVar[Kind] = Kind.CHECKPOINT_OK
    message: str = _key(_text, "")
    newest_step: int | None = _key(_int, None)
    signals: int = _key(_count, 0)
    alerted: bool = _key(_true, False)
    overdue_for_s: float | None = _key(_number, None)
