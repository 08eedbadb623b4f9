"""Typed payloads of the event kinds the daemon reads back (one frozen type per kind).

:mod:`b300.events` declares which keys each kind may carry; a type here says what each key
holds once read: ``NodeState.of(event)`` instead of ``str(event.data.get("state") or "")``.
Reading never fails on an old or odd row: a key an older version did not write, or a value
of another type, reads as the field's default (``None``, ``""``, ``()``, ``0`` or False, as
the field says), so every event ever stored still loads. Asking a type for an event of
another kind is a bug (ValueError). A type may read a group of kinds that readers take
together (``NodeDrained`` reads both ``DRAINS``); ``Payload.ALSO`` names the others.

Writers still build ``NewEvent(kind, data={...})``; the keys are checked there. The types
live by area (``runs``, ``nodes``, ``ops``); import them from here.
"""

from __future__ import annotations

from .base import Payload, Recorded
from .nodes import (
    DriftActionFailed,
    DriftCleared,
    DriftFinding,
    LivenessPartition,
    NodeDrained,
    NodeState,
    NodeStrike,
    SparesPool,
    TriageOverride,
    TriageReboot,
    TriageStarted,
    TriageVerdict,
)
from .ops import AccountingUnavailable, AlertMark, DrillFinished, DrillInjected, ReportDelivery
from .runs import (
    AttemptIntent,
    AttemptNodeLost,
    AttemptProgress,
    AttemptRequeued,
    AttemptStateChange,
    CheckpointOk,
    CheckpointOverdue,
    CheckpointSignal,
    RecoveryStop,
    StepRelaunch,
    StepStarted,
    TrainingExitIntent,
    TrainingFigures,
    TrainingFinding,
    TrainingProgressProblem,
)

__all__ = [
    "AccountingUnavailable", "AlertMark", "AttemptIntent", "AttemptNodeLost", "AttemptProgress",
    "AttemptRequeued", "AttemptStateChange", "CheckpointOk", "CheckpointOverdue", "CheckpointSignal",
    "DriftActionFailed", "DriftCleared", "DriftFinding", "DrillFinished", "DrillInjected",
    "LivenessPartition", "NodeDrained", "NodeState", "NodeStrike", "Payload", "Recorded", "RecoveryStop",
    "ReportDelivery", "SparesPool", "StepRelaunch", "StepStarted", "TrainingExitIntent", "TrainingFigures",
    "TrainingFinding", "TrainingProgressProblem", "TriageOverride", "TriageReboot", "TriageStarted",
    "TriageVerdict",
]
