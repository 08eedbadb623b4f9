"""Payloads of nodes: Slurm states, strikes and drains, triage, the spare pool, liveness, drift."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..events import DRAINS, STRIKES, Kind
from .base import Payload, _id, _int, _key, _names, _opt_text, _text, _true, _truthy


@dataclass(frozen=True, slots=True)
class NodeState(Payload):
    """``node.state``: a node's state or reason changed in sinfo (``old_state`` None: new node)."""

    KIND: ClassVar[Kind] = Kind.NODE_STATE
    state: str = _key(_text, "")
    reason: str = _key(_text, "")
    old_state: str | None = _key(_opt_text, None)
    old_reason: str | None = _key(_opt_text, None)


@dataclass(frozen=True, slots=True)
class NodeStrike(Payload):
    """A strike against a node for the black-hole rule (``node.failed``, ``node.suspect``):
    the job it struck and how that job ended (``outcome``)."""

    KIND: ClassVar[Kind] = STRIKES[0]
    ALSO: ClassVar[tuple[Kind, ...]] = STRIKES[1:]
    job_id: int | None = _key(_int, None)
    outcome: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class NodeDrained(Payload):
    """The daemon drained a node (``node.drained``, or ``drift.drained`` for version drift):
    the drain reason it gave Slurm, and for a black hole or a straggler what showed it."""

    KIND: ClassVar[Kind] = DRAINS[0]
    ALSO: ClassVar[tuple[Kind, ...]] = DRAINS[1:]
    reason: str = _key(_text, "")
    black_hole: tuple[str, ...] = _key(_names, ())
    straggler: str = _key(_text, "")
    step: int | None = _key(_int, None)


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
class TriageVerdict(Payload):
    """``triage.verdict``: what a triage job found on a node (``pass``, ``fail``, ``lemon``...)."""

    KIND: ClassVar[Kind] = Kind.TRIAGE_VERDICT
    verdict: str | None = _key(_opt_text, None)
    evidence: str | None = _key(_opt_text, None)
    failed_check: str | None = _key(_opt_text, None)
    job_id: int | None = _key(_int, None)
    why: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class TriageOverride(Payload):
    """``triage.override``: an admin said the node may return, or asked for its triage."""

    KIND: ClassVar[Kind] = Kind.TRIAGE_OVERRIDE
    returnable: bool = _key(_truthy, False)
    triage: bool = _key(_truthy, False)
    by: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class TriageReboot(Payload):
    """``triage.reboot``: the triage checks failed and the node is rebooted before a verdict."""

    KIND: ClassVar[Kind] = Kind.TRIAGE_REBOOT
    failed_check: str | None = _key(_opt_text, None)
    evidence: str = _key(_text, "")
    job_id: int | None = _key(_int, None)
    reason: str = _key(_text, "")


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
class LivenessPartition(Payload):
    """``liveness.partition``: many nodes went silent in one round (``checked``: how many were
    probed); the network, not the nodes, so nothing was drained."""

    KIND: ClassVar[Kind] = Kind.LIVENESS_PARTITION
    nodes: tuple[str, ...] = _key(_names, ())
    checked: int | None = _key(_int, None)
    note: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class DriftFinding(Payload):
    """``drift.finding``: a probe found a node's version other than the baseline's."""

    KIND: ClassVar[Kind] = Kind.DRIFT_FINDING
    probe: str = _key(_text, "")
    kind: str = _key(_text, "")
    expected: str | None = _key(_opt_text, None)
    found: str | None = _key(_opt_text, None)
    policy: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class DriftCleared(Payload):
    """``drift.cleared``: a drift finding closed (``resumed``: the scan put the node it had
    drained back)."""

    KIND: ClassVar[Kind] = Kind.DRIFT_CLEARED
    probe: str = _key(_text, "")
    finding_id: int | None = _key(_id, None)
    resumed: bool = _key(_true, False)
    reason: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class DriftActionFailed(Payload):
    """``drift.action_failed``: draining or resuming a node for drift failed in Slurm."""

    KIND: ClassVar[Kind] = Kind.DRIFT_ACTION_FAILED
    error: str = _key(_text, "")
