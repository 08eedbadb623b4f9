"""Typed event payloads (b300.payloads): what each kind's keys hold once read back."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

import pytest

from b300 import payloads
from b300.events import PAYLOAD, Kind
from b300.interfaces import NewEvent
from b300.model import Event

TYPES: list[type[payloads.Payload]] = [
    payloads.NodeState, payloads.AttemptStateChange, payloads.AttemptRequeued, payloads.AttemptProgress,
    payloads.StepRelaunch, payloads.StepStarted, payloads.TriageVerdict, payloads.SparesPool,
    payloads.TrainingExitIntent,
    payloads.CheckpointSignal, payloads.DrillFinished, payloads.TriageStarted, payloads.TriageOverride,
]
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _event(kind: str, data: dict[str, Any]) -> Event:
    return Event(1, T0, kind, run_id="r-1", attempt_id=1, node="gpu01", data=data)


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_every_field_reads_a_key_its_kind_declares(cls: type[payloads.Payload]) -> None:
    keys = {f.metadata.get("key") or f.name for f in fields(cls)}  # type: ignore[arg-type]
    assert keys <= PAYLOAD[cls.KIND], f"{cls.__name__} reads keys {cls.KIND} does not declare"


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_an_old_row_without_keys_loads_with_the_defaults(cls: type[payloads.Payload]) -> None:
    got = cls.of(_event(cls.KIND, {}))
    assert got == cls()


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
