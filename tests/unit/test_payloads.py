"""Typed event payloads (b300.payloads): what each kind's keys hold once read back."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

import pytest

from b300 import payloads
from b300.events import (
    ALERT_MARKS,
    DRAINS,
    PAYLOAD,
    REPORT_DELIVERY,
    STRIKES,
    TRAINING_FINDINGS,
    TRAINING_STOPS,
    Kind,
)
from b300.interfaces import NewEvent
from b300.model import Event

TYPES: list[type[payloads.Payload]] = [
    payloads.NodeState, payloads.AttemptStateChange, payloads.AttemptRequeued, payloads.AttemptProgress,
    payloads.StepRelaunch, payloads.StepStarted, payloads.TriageVerdict, payloads.SparesPool,
    payloads.TrainingExitIntent,
    payloads.CheckpointSignal, payloads.DrillFinished, payloads.TriageStarted, payloads.TriageOverride,
    payloads.AttemptIntent, payloads.AttemptNodeLost, payloads.RecoveryStop, payloads.TrainingFinding,
    payloads.TrainingProgressProblem, payloads.TrainingFigures, payloads.CheckpointOverdue,
    payloads.CheckpointOk,
    payloads.NodeStrike, payloads.NodeDrained, payloads.TriageReboot, payloads.LivenessPartition,
    payloads.DriftFinding, payloads.DriftCleared, payloads.DriftActionFailed, payloads.DrillInjected,
    payloads.AccountingUnavailable, payloads.AlertMark, payloads.ReportDelivery,
]
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _event(kind: str, data: dict[str, Any]) -> Event:
    return Event(1, T0, kind, run_id="r-1", attempt_id=1, node="gpu01", data=data)


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_every_field_reads_a_key_its_kind_declares(cls: type[payloads.Payload]) -> None:
    keys = {f.metadata.get("key") or f.name for f in fields(cls)}  # type: ignore[arg-type]
    declared = set().union(*(PAYLOAD[k] for k in cls.kinds()))
    assert keys <= declared, f"{cls.__name__} reads keys none of {cls.kinds()} declares"


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_an_old_row_without_keys_loads_with_the_defaults(cls: type[payloads.Payload]) -> None:
    for kind in cls.kinds():
        assert cls.of(_event(kind, {})) == cls()


def test_every_type_is_exported_and_no_kind_has_two_types() -> None:
    exported = {getattr(payloads, n) for n in payloads.__all__}
    assert set(TYPES) == {t for t in exported if isinstance(t, type) and issubclass(t, payloads.Payload)
                          and t is not payloads.Payload}
    kinds = [k for t in TYPES for k in t.kinds()]
    assert len(kinds) == len(set(kinds)), "a kind is read by two payload types"


def test_a_type_of_several_kinds_reads_one_group_of_b300_events() -> None:
    assert payloads.NodeDrained.kinds() == DRAINS
    assert payloads.NodeStrike.kinds() == STRIKES
    assert payloads.TrainingFinding.kinds() == TRAINING_FINDINGS
    assert payloads.AlertMark.kinds() == ALERT_MARKS
    assert payloads.ReportDelivery.kinds() == REPORT_DELIVERY
    assert set(payloads.RecoveryStop.kinds()) == {Kind.RECOVERY_STOPPED, Kind.RECOVERY_BUDGET_SPENT,
                                                  *TRAINING_STOPS}


def test_values_of_another_type_read_as_the_default() -> None:
    p = payloads.AttemptProgress.of(_event(Kind.ATTEMPT_PROGRESS, {"step": True, "at": "noon", "last": 1}))
    assert (p.step, p.at, p.last) == (None, None, False)
    r = payloads.StepRelaunch.of(_event(Kind.ATTEMPT_STEP_RELAUNCH, {"generation": "2", "exclude": "gpu01"}))
    assert (r.generation, r.exclude) == (0, ())


def test_what_a_writer_wrote_is_what_a_reader_reads() -> None:
    data = {"old_state": None, "old_reason": None, "state": "DOWN*+DRAIN", "reason": "b300: dead"}
    written = NewEvent(Kind.NODE_STATE, node="gpu01", data=data)  # the writer's check passes
    s = payloads.NodeState.of(_event(written.kind, written.data))
    assert (s.state, s.reason, s.old_state, s.old_reason) == ("DOWN*+DRAIN", "b300: dead", None, None)
    change = payloads.AttemptStateChange.of(_event(Kind.ATTEMPT_STATE, {
        "from": "RUNNING", "to": "NODE_FAIL", "job_id": 41, "nodes": ["gpu03", "gpu04"], "exit_code": 0}))
    assert (change.from_state, change.to_state, change.job_id, change.nodes, change.exit_code) == (
        "RUNNING", "NODE_FAIL", 41, ("gpu03", "gpu04"), 0)
    p = payloads.AttemptProgress.of(_event(Kind.ATTEMPT_PROGRESS,
                                           {"step": 1200, "at": 1764547200, "last": True}))
    assert (p.step, p.at, p.last) == (1200, 1764547200.0, True)


def test_a_drill_id_stored_as_digits_still_names_the_drill() -> None:
    assert payloads.DrillFinished.of(_event(Kind.DRILL_FINISHED, {"drill": "17"})).drill == 17
    assert payloads.DrillFinished.of(_event(Kind.DRILL_FINISHED, {"drill": True})).drill is None
    sig = payloads.CheckpointSignal.of(_event(Kind.CHECKPOINT_SIGNAL, {"signal": "USR1", "grace_s": 120}))
    assert (sig.signal, sig.grace_s) == ("USR1", 120.0)


def test_asking_for_another_kind_is_refused() -> None:
    with pytest.raises(ValueError, match=r"NodeState reads node\.state events, not node\.drained"):
        payloads.NodeState.of(_event(Kind.NODE_DRAINED, {"reason": "x"}))


# -- one full row as its writer writes it, per type (NewEvent checks the keys) ----------

FULL_ROWS: list[tuple[type[payloads.Payload], str, dict[str, Any], dict[str, object]]] = [
    (payloads.AttemptIntent, Kind.ATTEMPT_INTENT,
     {"number": 2, "exclude": ["gpu01", "gpu02"], "resume_from": "/ckpt/step_400", "reservation": "spares"},
     {"number": 2, "exclude": ("gpu01", "gpu02"), "resume_from": "/ckpt/step_400", "reservation": "spares"}),
    (payloads.AttemptNodeLost, Kind.ATTEMPT_NODE_LOST,
     {"job_id": 41, "nodes": ["gpu03"], "evidence": "gpu03 DOWN*"},
     {"job_id": 41, "nodes": ("gpu03",), "evidence": "gpu03 DOWN*"}),
    (payloads.RecoveryStop, Kind.RECOVERY_RESTART_LOOP,
     {"why": "3 restarts without progress", "attempts": 3, "newest_step": 800},
     {"why": "3 restarts without progress", "attempts": 3, "newest_step": 800, "exit_code": None}),
    (payloads.RecoveryStop, Kind.RECOVERY_NO_RESTART, {"why": "the job said so", "exit_code": 3},
     {"why": "the job said so", "exit_code": 3, "attempts": None}),
    (payloads.RecoveryStop, Kind.RECOVERY_BUDGET_SPENT, {"why": "budget of 5 spent"},
     {"why": "budget of 5 spent"}),
    (payloads.TrainingFinding, Kind.TRAINING_STRAGGLER,
     {"evidence": "gpu07 1.8x slower", "host": "gpu07", "value": 1.8, "threshold": 1.5, "step": 1200},
     {"evidence": "gpu07 1.8x slower", "host": "gpu07", "value": 1.8, "threshold": 1.5, "step": 1200}),
    (payloads.TrainingProgressProblem, Kind.TRAINING_PROGRESS_PROBLEM,
     {"path": "/runs/p.jsonl", "offset": 4096, "problem": "not JSON"},
     {"path": "/runs/p.jsonl", "offset": 4096, "problem": "not JSON"}),
    (payloads.TrainingFigures, Kind.TRAINING_FIGURES,
     {"step": 500, "loss": 2.5, "tokens_per_s": 91000, "samples_per_s": 44.5, "mfu": 0.41,
      "seconds_per_step": 1.2, "stragglers": ["gpu07"]},
     {"step": 500, "loss": 2.5, "tokens_per_s": 91000.0, "samples_per_s": 44.5, "mfu": 0.41,
      "seconds_per_step": 1.2, "stragglers": ("gpu07",)}),
    (payloads.CheckpointOverdue, Kind.CHECKPOINT_OVERDUE,
     {"message": "run r-1: no checkpoint for 2h", "job_id": 41, "age_s": 7200.5, "interval_s": 3600,
      "newest_step": 400, "signals": 1, "counted_from": "start"},
     {"message": "run r-1: no checkpoint for 2h", "job_id": 41, "age_s": 7200.5, "interval_s": 3600.0,
      "newest_step": 400, "signals": 1}),
    (payloads.CheckpointOk, Kind.CHECKPOINT_OK,
     {"message": "run r-1: schedule met again", "newest_step": 800, "signals": 1, "alerted": True,
      "overdue_for_s": 900.0, "age_s": 10.0},
     {"message": "run r-1: schedule met again", "newest_step": 800, "signals": 1, "alerted": True,
      "overdue_for_s": 900.0}),
    (payloads.CheckpointSignal, Kind.CHECKPOINT_SIGNAL,
     {"message": "run r-1: sent USR1", "signal": "USR1", "grace_s": 120, "job_id": 41},
     {"message": "run r-1: sent USR1", "signal": "USR1", "grace_s": 120.0, "job_id": 41}),
    (payloads.NodeStrike, Kind.NODE_SUSPECT, {"job_id": 41, "outcome": "NODE_FAIL"},
     {"job_id": 41, "outcome": "NODE_FAIL"}),
    (payloads.NodeDrained, Kind.NODE_DRAINED,
     {"reason": "b300: straggler", "black_hole": ["r-1", "r-2"], "straggler": "1.8x slower", "step": 1200},
     {"reason": "b300: straggler", "black_hole": ("r-1", "r-2"), "straggler": "1.8x slower", "step": 1200}),
    (payloads.NodeDrained, Kind.DRIFT_DRAINED, {"reason": "b300: drift driver"},
     {"reason": "b300: drift driver", "black_hole": (), "step": None}),
    (payloads.TriageReboot, Kind.TRIAGE_REBOOT,
     {"failed_check": "gpu_burn", "evidence": "Xid 79", "job_id": 77, "reason": "b300: reboot"},
     {"failed_check": "gpu_burn", "evidence": "Xid 79", "job_id": 77, "reason": "b300: reboot"}),
    (payloads.LivenessPartition, Kind.LIVENESS_PARTITION,
     {"nodes": ["gpu01", "gpu02"], "checked": 16, "note": "the login node's link?"},
     {"nodes": ("gpu01", "gpu02"), "checked": 16, "note": "the login node's link?"}),
    (payloads.DriftFinding, Kind.DRIFT_FINDING,
     {"probe": "driver", "kind": "mismatch", "expected": "550.54", "found": "550.40", "policy": "drain"},
     {"probe": "driver", "kind": "mismatch", "expected": "550.54", "found": "550.40", "policy": "drain"}),
    (payloads.DriftCleared, Kind.DRIFT_CLEARED,
     {"probe": "driver", "finding_id": 12, "resumed": True, "reason": "b300: drift driver"},
     {"probe": "driver", "finding_id": 12, "resumed": True, "reason": "b300: drift driver"}),
    (payloads.DriftActionFailed, Kind.DRIFT_ACTION_FAILED, {"error": "scontrol: timeout"},
     {"error": "scontrol: timeout"}),
    (payloads.DrillInjected, Kind.DRILL_INJECTED,
     {"drill": 17, "node": "gpu03", "method": "kill", "inject_s": 0.25, "output": "killed"},
     {"drill": 17, "node": "gpu03", "method": "kill", "inject_s": 0.25, "output": "killed"}),
    (payloads.AccountingUnavailable, Kind.ACCOUNTING_UNAVAILABLE, {"error": "slurmdbd down"},
     {"error": "slurmdbd down"}),
    (payloads.AlertMark, Kind.ALERT_SENT, {"kind": "node.drained", "last_id": 900, "summary": "3 drains"},
     {"kind": "node.drained", "last_id": 900, "summary": "3 drains"}),
    (payloads.AlertMark, Kind.ALERTS_CURSOR, {"last_id": 901}, {"last_id": 901, "kind": ""}),
    (payloads.ReportDelivery, Kind.REPORT_SENT, {"week": "2026-W48", "to": ["ops@example.org"],
                                                 "message_id": "<1@b300>"},
     {"week": "2026-W48", "to": ("ops@example.org",), "message_id": "<1@b300>", "retry": False}),
    (payloads.ReportDelivery, Kind.REPORT_FAILED, {"week": "2026-W48", "error": "refused", "retry": True},
     {"week": "2026-W48", "error": "refused", "retry": True}),
]


@pytest.mark.parametrize(("cls", "kind", "data", "want"), FULL_ROWS,
                         ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_a_full_row_reads_as_written(cls: type[payloads.Payload], kind: str, data: dict[str, Any],
                                     want: dict[str, object]) -> None:
    written = NewEvent(kind, data=data)  # the writer's key check passes
    got = cls.of(_event(written.kind, written.data))
    assert {name: getattr(got, name) for name in want} == want


WRONG_TYPES: list[tuple[type[payloads.Payload], str, dict[str, Any], dict[str, object]]] = [
    (payloads.AttemptIntent, Kind.ATTEMPT_INTENT, {"number": "2", "exclude": "gpu01", "reservation": None},
     {"number": None, "exclude": (), "reservation": None}),
    (payloads.AttemptNodeLost, Kind.ATTEMPT_NODE_LOST, {"job_id": 4.5, "nodes": None, "evidence": None},
     {"job_id": None, "nodes": (), "evidence": ""}),
    (payloads.RecoveryStop, Kind.RECOVERY_STOPPED, {"why": None}, {"why": ""}),
    (payloads.RecoveryStop, Kind.RECOVERY_RESTART_LOOP, {"why": 3, "attempts": True, "newest_step": "800"},
     {"why": "3", "attempts": None, "newest_step": None}),
    (payloads.TrainingFinding, Kind.TRAINING_LOSS_NAN, {"step": "12", "value": "nan", "evidence": None},
     {"step": None, "value": None, "evidence": ""}),
    (payloads.TrainingProgressProblem, Kind.TRAINING_PROGRESS_PROBLEM, {"path": None, "offset": False},
     {"path": "", "offset": None}),
    (payloads.TrainingFigures, Kind.TRAINING_FIGURES, {"mfu": True, "tokens_per_s": "fast", "stragglers": 3},
     {"mfu": None, "tokens_per_s": None, "stragglers": ()}),
    (payloads.CheckpointOverdue, Kind.CHECKPOINT_OVERDUE, {"message": None, "signals": "2", "age_s": "1h"},
     {"message": "", "signals": 0, "age_s": None}),
    (payloads.CheckpointOk, Kind.CHECKPOINT_OK, {"alerted": "yes", "overdue_for_s": None},
     {"alerted": False, "overdue_for_s": None}),
    (payloads.NodeStrike, Kind.NODE_FAILED, {"job_id": "41x", "outcome": None},
     {"job_id": None, "outcome": ""}),
    (payloads.NodeDrained, Kind.NODE_DRAINED, {"reason": None, "black_hole": "r-1", "step": 1.5},
     {"reason": "", "black_hole": (), "step": None}),
    (payloads.TriageReboot, Kind.TRIAGE_REBOOT, {"job_id": "77", "evidence": None, "failed_check": 3},
     {"job_id": None, "evidence": "", "failed_check": "3"}),
    (payloads.LivenessPartition, Kind.LIVENESS_PARTITION, {"nodes": "gpu01", "checked": "16"},
     {"nodes": (), "checked": None}),
    (payloads.DriftFinding, Kind.DRIFT_FINDING, {"probe": None, "expected": 550},
     {"probe": "", "expected": "550"}),
    (payloads.DriftCleared, Kind.DRIFT_CLEARED, {"resumed": "true", "finding_id": "12"},
     {"resumed": False, "finding_id": 12}),
    (payloads.DriftActionFailed, Kind.DRIFT_ACTION_FAILED, {"error": None}, {"error": ""}),
    (payloads.DrillInjected, Kind.DRILL_INJECTED, {"drill": "17", "inject_s": "fast"},
     {"drill": 17, "inject_s": None}),
    (payloads.AccountingUnavailable, Kind.ACCOUNTING_UNAVAILABLE, {"error": None}, {"error": ""}),
    (payloads.AlertMark, Kind.ALERTS_CURSOR, {"last_id": "900"}, {"last_id": 0}),
    (payloads.ReportDelivery, Kind.REPORT_FAILED, {"week": None, "retry": 1, "to": "ops@example.org"},
     {"week": "", "retry": True, "to": ()}),
]


@pytest.mark.parametrize(("cls", "kind", "data", "want"), WRONG_TYPES,
                         ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_a_value_of_another_type_reads_as_the_default(cls: type[payloads.Payload], kind: str,
                                                      data: dict[str, Any], want: dict[str, object]) -> None:
    got = cls.of(_event(kind, data))
    assert {name: getattr(got, name) for name in want} == want


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_every_type_refuses_a_kind_it_does_not_read(cls: type[payloads.Payload]) -> None:
    other = next(k for k in (Kind.RUN_CREATED, Kind.HA_ACQUIRED) if k not in cls.kinds())
    with pytest.raises(ValueError, match=f"{cls.__name__} reads .* events, not {other}"):
        cls.of(_event(other, {"name": "x"}))


def test_a_group_type_names_every_kind_it_reads_when_it_refuses() -> None:
    refused = r"NodeDrained reads node\.drained or drift\.drained events, not node\.resumed"
    with pytest.raises(ValueError, match=refused):
        payloads.NodeDrained.of(_event(Kind.NODE_RESUMED, {"by": "ops"}))
