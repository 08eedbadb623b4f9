"""Typed payloads of the event kinds the daemon reads back most (one frozen type per kind).

:mod:`b300.events` declares which keys each kind may carry; a type here says what each key
holds once read: ``NodeState.of(event)`` instead of ``str(event.data.get("state") or "")``.
Reading never fails on an old or odd row: a key an older version did not write, or a value
of another type, reads as the field's default (``None``, ``""``, ``()``, ``0`` or False, as
the field says), so every event ever stored still loads. Asking a type for an event of
another kind is a bug (ValueError).

Writers still build ``NewEvent(kind, data={...})``; the keys are checked there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self, cast

from .events import Kind
from .model import Event


def _text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _opt_text(value: object) -> str | None:
    return None if value is None else value if isinstance(value, str) else str(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _id(value: object) -> int | None:
    """An id, also as the digits an older writer stored it as."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return _int(value)


def _true(value: object) -> bool:
    return value is True


def _truthy(value: object) -> bool:
    return bool(value)


def _names(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()


def _key(read: Callable[[object], Any], default: Any, key: str | None = None) -> Any:
    """A payload field: ``read`` turns the stored value into the field's type; ``key`` is
    the stored key when it is not the field's name (``from``, ``to``)."""
    return field(default=default, metadata={"read": read, "key": key})


class Payload:
    """What every payload type shares: its kind and the typed accessor."""

    KIND: ClassVar[Kind]

    @classmethod
    def of(cls, event: Event) -> Self:
        """``event``'s payload as this type (ValueError: the event is of another kind)."""
        if event.kind != cls.KIND:
            raise ValueError(f"{cls.__name__} reads {cls.KIND} events, not {event.kind}")
        return cls.from_data(event.data)

    @classmethod
    def from_data(cls, data: Mapping[str, object]) -> Self:
        values: dict[str, Any] = {}
        for f in fields(cast(Any, cls)):
            key = f.metadata.get("key") or f.name
            if key in data:
                values[f.name] = f.metadata["read"](data[key])
        return cast(Self, cast(Any, cls)(**values))


@dataclass(frozen=True, slots=True)
class NodeState(Payload):
    """``node.state``: a node's state or reason changed in sinfo (``old_state`` None: new node)."""

    KIND: ClassVar[Kind] = Kind.NODE_STATE
    state: str = _key(_text, "")
    reason: str = _key(_text, "")
    old_state: str | None = _key(_opt_text, None)
    old_reason: str | None = _key(_opt_text, None)


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
class TriageVerdict(Payload):
    """``triage.verdict``: what a triage job found on a node (``pass``, ``fail``, ``lemon``...)."""

    KIND: ClassVar[Kind] = Kind.TRIAGE_VERDICT
    verdict: str | None = _key(_opt_text, None)
    evidence: str | None = _key(_opt_text, None)
    failed_check: str | None = _key(_opt_text, None)
    job_id: int | None = _key(_int, None)
    why: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class TriageStarted(Payload):
    """``triage.started``: a node's triage began (or moved on: ``step``), with the checks it runs."""

    KIND: ClassVar[Kind] = Kind.TRIAGE_STARTED
    cause: str | None = _key(_opt_text, None)
    reason: str = _key(_text, "")
    checks: tuple[str, ...] = _key(_names, ())
    job_id: int | None = _key(_int, None)
    step: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class TriageOverride(Payload):
    """``triage.override``: an admin said the node may return, or asked for its triage."""

    KIND: ClassVar[Kind] = Kind.TRIAGE_OVERRIDE
    returnable: bool = _key(_truthy, False)
    triage: bool = _key(_truthy, False)
    by: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class SparesPool(Payload):
    """``spares.pool``: what one spare pool (a reservation) holds after a change."""

    KIND: ClassVar[Kind] = Kind.SPARES_POOL
    partition: str | None = _key(_opt_text, None)
    reservation: str | None = _key(_opt_text, None)
    nodes: tuple[str, ...] = _key(_names, ())
    idle: tuple[str, ...] = _key(_names, ())
    retired: bool = _key(_truthy, False)


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
    signal: str = _key(_text, "?")
    grace_s: float = _key(_seconds, 0.0)
    job_id: int | None = _key(_int, None)


@dataclass(frozen=True, slots=True)
class DrillFinished(Payload):
    """``drill.finished``: a failure drill's figures (seconds from the injection to each stage)."""

    KIND: ClassVar[Kind] = Kind.DRILL_FINISHED
    drill: int | None = _key(_id, None)
    node: str = _key(_text, "")
    method: str = _key(_text, "")
    outcome: str = _key(_text, "")
    detect_s: float | None = _key(_number, None)
    excluded_s: float | None = _key(_number, None)
    resubmit_s: float | None = _key(_number, None)
    allocation_s: float | None = _key(_number, None)
    training_s: float | None = _key(_number, None)
    resume_step: int | None = _key(_int, None)
    steps_lost: int | None = _key(_int, None)
