"""What observations mean for an attempt (pure; no Slurm, no store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from b300.cycle.observe import attempt_state_for, observe_attempt, run_state_for
from b300.model import Attempt, AttemptState, JobObservation, RunState, SlurmState

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _attempt(state: AttemptState = AttemptState.PENDING, **kw: object) -> Attempt:
    base: dict[str, object] = dict(
        id=1,
        run_id="r-1",
        number=1,
        tag="b300-r-1-a1",
        state=state,
        created_at=T0,
        updated_at=T0,
        slurm_job_id=42,
    )
    base.update(kw)
    return Attempt(**base)  # type: ignore[arg-type]


def _obs(state: SlurmState, source: str = "squeue", **kw: object) -> JobObservation:
    return JobObservation(job_id=42, state=state, source=source, **kw)  # type: ignore[arg-type]


def test_running_job_changes_state_with_event() -> None:
    ch = observe_attempt(
        _attempt(),
        _obs(SlurmState.RUNNING, nodes=("gpu01",), start=T0),
        None,
        terminal_since=None,
        now=T0,
        accounting_grace_s=60,
    )
    assert ch is not None and ch.state is AttemptState.RUNNING and ch.nodes == ("gpu01",)
    assert ch.event is not None and ch.event.data["from"] == "PENDING"


def test_no_change_no_event() -> None:
    a = _attempt(AttemptState.RUNNING, nodes=("gpu01",), start=T0)
    assert (
        observe_attempt(
            a,
            _obs(SlurmState.RUNNING, nodes=("gpu01",), start=T0),
            None,
            terminal_since=None,
            now=T0,
            accounting_grace_s=60,
        )
        is None
    )


def test_unknown_is_not_a_failure() -> None:
    a = _attempt(AttemptState.RUNNING)
    assert (
        observe_attempt(a, None, None, terminal_since=None, now=T0, accounting_grace_s=60) is None
    )


def test_sacct_gives_the_final_state_and_exit_code() -> None:
    ch = observe_attempt(
        _attempt(AttemptState.RUNNING),
        None,
        _obs(SlurmState.FAILED, "sacct", exit_code=3, signal=0, end=T0),
        terminal_since=None,
        now=T0,
        accounting_grace_s=60,
    )
    assert ch is not None and ch.state is AttemptState.FAILED and ch.exit_code == 3


def test_controller_end_waits_for_accounting_then_gives_up_waiting() -> None:
    a = _attempt(AttemptState.RUNNING)
    live = _obs(SlurmState.COMPLETED, end=T0)
    assert (
        observe_attempt(
            a, live, None, terminal_since=T0, now=T0 + timedelta(seconds=10), accounting_grace_s=60
        )
        is None
    )
    ch = observe_attempt(
        a, live, None, terminal_since=T0, now=T0 + timedelta(seconds=61), accounting_grace_s=60
    )
    assert ch is not None and ch.state is AttemptState.COMPLETED and ch.exit_code is None


def test_live_requeued_job_beats_old_accounting_record() -> None:
    ch = observe_attempt(
        _attempt(AttemptState.RUNNING),
        _obs(SlurmState.PENDING),
        _obs(SlurmState.NODE_FAIL, "sacct"),
        terminal_since=None,
        now=T0,
        accounting_grace_s=60,
    )
    assert ch is not None and ch.state is AttemptState.PENDING


def test_state_maps_cover_every_slurm_state() -> None:
    for s in SlurmState:
        assert isinstance(attempt_state_for(s), AttemptState)
    assert attempt_state_for(SlurmState.CONFIGURING) is AttemptState.PENDING
    assert attempt_state_for(SlurmState.NODE_FAIL) is AttemptState.NODE_FAIL


def test_run_state_from_latest_attempt() -> None:
    assert run_state_for(None) is RunState.SUBMITTING
    assert run_state_for(_attempt(AttemptState.COMPLETING)) is RunState.RUNNING
    assert run_state_for(_attempt(AttemptState.NODE_FAIL)) is RunState.FAILED
    assert run_state_for(_attempt(AttemptState.CANCELLED)) is RunState.CANCELLED
    assert run_state_for(_attempt(AttemptState.ABANDONED)) is RunState.FAILED
