"""Typed, immutable records of the core.

These are plain data: no I/O, no clock reads. The storage layer converts its
SQLModel rows to and from these at its boundary; the Slurm layer produces
``JobObservation`` records from command output.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: A node name as Slurm allows it and as we let it near anything (it never reaches a
#: shell, but it does reach argv, logs, events and drain reasons). The one rule.
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def is_node_name(text: object) -> bool:
    return isinstance(text, str) and NODE_NAME_RE.fullmatch(text) is not None


class SlurmState(enum.StrEnum):
    """A Slurm job state (base state, flags such as ``+`` or ``by UID`` stripped)."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    REQUEUED = "REQUEUED"
    EXPEDITING = "EXPEDITING"  # Slurm 25.11: requeued, to be started again first
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    SIGNALING = "SIGNALING"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    REVOKED = "REVOKED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        SlurmState.COMPLETED,
        SlurmState.CANCELLED,
        SlurmState.FAILED,
        SlurmState.TIMEOUT,
        SlurmState.NODE_FAIL,
        SlurmState.PREEMPTED,
        SlurmState.BOOT_FAIL,
        SlurmState.DEADLINE,
        SlurmState.OUT_OF_MEMORY,
        SlurmState.REVOKED,
    }
)


class AttemptState(enum.StrEnum):
    """Where one Slurm attempt of a run stands, from the daemon's point of view.

    ``SUBMITTING`` is the intent: recorded before ``sbatch`` runs, so a crash
    between the two can be resolved on restart by looking the attempt's tag up
    in Slurm. ``ABANDONED`` means the intent was never carried out.
    """

    SUBMITTING = "SUBMITTING"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    ABANDONED = "ABANDONED"

    @property
    def is_terminal(self) -> bool:
        return self not in _ACTIVE_ATTEMPT


_ACTIVE_ATTEMPT = frozenset(
    {
        AttemptState.SUBMITTING,
        AttemptState.PENDING,
        AttemptState.RUNNING,
        AttemptState.SUSPENDED,
        AttemptState.COMPLETING,
    }
)


class RunState(enum.StrEnum):
    """The state of a logical training run (all its attempts together).

    ``RECOVERING``: the last attempt ended without completing and recovery
    has not yet decided (it may wait for Slurm to show which node failed).
    """

    SUBMITTING = "SUBMITTING"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)


@dataclass(frozen=True, slots=True)
class JobObservation:
    """What Slurm said about one job at one moment.

    ``exit_code`` and ``signal`` are known only for ended jobs seen through
    sacct (squeue does not report them); ``None`` means "not known", not 0.
    """

    job_id: int
    state: SlurmState
    name: str = ""
    nodes: tuple[str, ...] = ()
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    start: datetime | None = None
    end: datetime | None = None
    restarts: int = 0
    comment: str = ""
    source: str = "squeue"


@dataclass(frozen=True, slots=True)
class NodeObservation:
    """One node as sinfo/scontrol report it."""

    name: str
    state: str
    reason: str = ""
    flags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Run:
    id: str
    name: str
    spec_toml: str
    state: RunState
    created_at: datetime
    updated_at: datetime
    attempts_count: int = 0


@dataclass(frozen=True, slots=True)
class Attempt:
    id: int
    run_id: str
    number: int
    tag: str
    state: AttemptState
    created_at: datetime
    updated_at: datetime
    slurm_job_id: int | None = None
    nodes: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    resume_from: str | None = None
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    start: datetime | None = None
    end: datetime | None = None
    outcome: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    ts: datetime
    kind: str
    run_id: str | None = None
    attempt_id: int | None = None
    node: str | None = None
    actor: str = "daemon"
    data: dict[str, Any] = field(default_factory=dict)
    daemon: str | None = None  # the daemon (identity and lease epoch) that appended it


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """Everything sbatch needs for one attempt, already rendered."""

    job_name: str
    comment: str
    script: str
    nodes: int
    gpus_per_node: int
    partition: str | None = None
    time_limit: str | None = None
    account: str | None = None
    qos: str | None = None
    excluded_nodes: tuple[str, ...] = ()
    output: str | None = None
    workdir: str | None = None
    ntasks_per_node: int | None = None
    requeue: bool = False
    no_kill: bool = False  # sbatch --no-kill: a failed node leaves the job, the job goes on
    reservation: str | None = None  # sbatch --reservation: the daemon's spare pool (b300.spares)


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """Where a node's slurmd listens, as Slurm states it (``scontrol show node``);
    ``port`` None: the cluster's SlurmdPort."""

    node: str
    addr: str
    port: int | None = None


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What the daemon last knew about a node."""

    name: str
    state: str
    reason: str
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """One checkpoint found on disk by a layout.

    ``complete`` is the layout's own verdict (done-marker, metadata file,
    ``latest`` pointer...); ``why_incomplete`` says why not, for the logs.
    Whether its bytes are intact is a separate question (the manifest).
    ``save_s`` is how long saving it took as its files show: from the first file
    written to the last (the completion marker or metadata), None when unknown.
    It is a lower bound: the first file took some time to write too.
    """

    path: str
    step: int
    mtime: datetime
    complete: bool
    size_bytes: int = 0
    files: int = 0
    why_incomplete: str = ""
    save_s: float | None = None
    #: The layout that judged it (for ``layout = "auto"``: the one it recognised).
    layout: str = ""


def run_to_dict(run: Run) -> dict[str, Any]:
    """A run as b300ctl's JSON and the daemon's control replies show it."""
    return {"id": run.id, "name": run.name, "state": run.state.value,
            "created_at": run.created_at.isoformat(), "updated_at": run.updated_at.isoformat(),
            "attempts": run.attempts_count}


def attempt_to_dict(a: Attempt) -> dict[str, Any]:
    """An attempt as b300ctl's JSON and the daemon's control replies show it."""
    return {"number": a.number, "tag": a.tag, "state": a.state.value, "job_id": a.slurm_job_id,
            "nodes": list(a.nodes), "excluded_nodes": list(a.excluded_nodes),
            "resume_from": a.resume_from, "reason": a.reason, "exit_code": a.exit_code,
            "signal": a.signal, "start": a.start.isoformat() if a.start else None,
            "end": a.end.isoformat() if a.end else None,
            "created_at": a.created_at.isoformat()}
