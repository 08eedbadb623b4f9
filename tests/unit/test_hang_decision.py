"""Hang detection decided each cycle (``hang_decision``, pure) from the attempt, its limits, the
step read, the step seen before and whether an ``attempt.hang`` is already recorded; and the watch
carrying it out on a real SQLite store: a hang recorded by a daemon that died before its cancel is
cancelled by the next daemon at once, and never recorded twice."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import cast

import pytest
from hang_fixtures import T0, running_attempt, write_step

from b300.events import Kind
from b300.interfaces import NewEvent, SlurmClient, Store
from b300.model import Attempt, AttemptState
from b300.recovery.hangs import HangAction, HangDecision, HangWatch, StepSeen, hang_decision
from b300.safety.mode import Withheld
from b300.spec import HealthPolicy
from b300.store import open_store

HEALTH = HealthPolicy(progress_file="/p/progress.json", hang_timeout_s=600.0, startup_timeout_s=1800.0)


def _attempt(**kw: object) -> Attempt:
    base = Attempt(id=1, run_id="r", number=1, tag="b300-r-a1", state=AttemptState.RUNNING,
                   slurm_job_id=7, created_at=T0, updated_at=T0, start=T0)
    return replace(base, **kw)


def _decide(step: str = "", seen: StepSeen | None = None, *, at: float, attempt: Attempt | None = None,
            health: HealthPolicy = HEALTH, hang_recorded: bool = False, withholding: bool = False,
            mtime: datetime | None = None) -> HangDecision:
    return hang_decision(attempt or _attempt(), health, step, seen, hang_recorded=hang_recorded,
                         withholding=withholding, now=T0 + timedelta(seconds=at), mtime=mtime)


@pytest.mark.parametrize("attempt", [
    _attempt(state=AttemptState.PENDING, start=None),
    _attempt(state=AttemptState.CANCELLED, end=T0 + timedelta(hours=1)),
    _attempt(slurm_job_id=None),
])
def test_an_attempt_that_is_not_running_under_a_job_is_left_alone(attempt: Attempt) -> None:
    # Even a recorded hang past every limit: only a RUNNING job is cancelled.
    d = _decide("12", StepSeen("12", T0), at=7200, attempt=attempt, hang_recorded=True)
    assert d.action is HangAction.NOTHING and not (d.cancels or d.records_hang or d.withholds)


def test_a_spec_without_a_progress_file_is_not_watched() -> None:
    d = _decide("", at=7200, health=HealthPolicy(progress_file=None, startup_timeout_s=1.0))
    assert d.action is HangAction.NOTHING


def test_no_step_yet_is_measured_from_the_start_against_the_startup_timeout() -> None:
    assert _decide("", at=1799).action is HangAction.NOTHING
    d = _decide("", at=1800)
    assert (d.action, d.stalled_s, d.step, d.moved) == (HangAction.HANG, 1800.0, "", False)
    assert d.records_hang and d.cancels and not d.withholds


def test_an_attempt_without_a_start_time_is_measured_from_now() -> None:
    assert _decide("", at=7200, attempt=_attempt(start=None)).action is HangAction.NOTHING


def test_a_first_step_starts_the_timer_stamped_with_the_file_written_inside_the_attempt() -> None:
    written = T0 + timedelta(seconds=95)
    d = _decide("3", at=100, mtime=written)
    assert (d.action, d.moved) == (HangAction.PROGRESS, True)
    assert d.seen == StepSeen("3", T0 + timedelta(seconds=100), written)
    assert not (d.cancels or d.records_hang or d.withholds)


@pytest.mark.parametrize("mtime", [T0 - timedelta(seconds=1), T0 + timedelta(seconds=101), None])
def test_a_write_time_outside_the_attempt_is_not_kept(mtime: datetime | None) -> None:
    d = _decide("3", at=100, mtime=mtime)
    assert d.seen == StepSeen("3", T0 + timedelta(seconds=100), None)


def test_a_new_step_starts_the_timer_again() -> None:
    d = _decide("4", StepSeen("3", T0), at=5000)
    assert (d.action, d.seen, d.moved) == (HangAction.PROGRESS, StepSeen("4", T0 + timedelta(seconds=5000)),
                                           True)


def test_the_same_step_is_measured_from_when_it_was_first_seen_against_the_hang_timeout() -> None:
    seen = StepSeen("12", T0 + timedelta(seconds=100))
    d = _decide("12", seen, at=699)
    assert (d.action, d.seen, d.moved, d.stalled_s) == (HangAction.NOTHING, seen, False, 599.0)
    d = _decide("12", seen, at=700)
    assert (d.action, d.step, d.stalled_s) == (HangAction.HANG, "12", 600.0)


def test_a_step_gone_after_one_was_seen_is_measured_against_the_startup_timeout() -> None:
    seen = StepSeen("12", T0 + timedelta(seconds=100))
    assert _decide("", seen, at=1000).action is HangAction.NOTHING   # past hang_timeout since 12
    d = _decide("", seen, at=1800)
    assert (d.action, d.seen, d.stalled_s) == (HangAction.HANG, seen, 1800.0)


@pytest.mark.parametrize(("step", "seen", "at"), [
    ("12", StepSeen("12", T0), 5),        # below the limit
    ("12", None, 5),                      # a daemon that just started: nothing seen yet
    ("", None, 5),                        # no step at all
    ("12", StepSeen("12", T0), 9000),     # far past it
])
def test_a_recorded_hang_of_a_running_job_is_cancelled_again_never_recorded_again(
        step: str, seen: StepSeen | None, at: float) -> None:
    d = _decide(step, seen, at=at, hang_recorded=True)
    assert d.action is HangAction.CANCEL and d.cancels and not d.records_hang and not d.withholds


def test_a_recorded_hang_cancelled_again_still_keeps_a_new_step() -> None:
    d = _decide("13", StepSeen("12", T0), at=60, hang_recorded=True)
    assert (d.action, d.moved, d.seen) == (HangAction.CANCEL, True, StepSeen("13", T0 + timedelta(seconds=60)))


def test_observe_mode_records_the_hang_and_withholds_the_cancel() -> None:
    d = _decide("12", StepSeen("12", T0), at=600, withholding=True)
    assert (d.action, d.stalled_s) == (HangAction.HANG_WITHHELD, 600.0)
    assert d.records_hang and d.withholds and not d.cancels


def test_observe_mode_with_the_hang_recorded_never_records_it_again() -> None:
    stalled = _decide("12", StepSeen("12", T0), at=600, withholding=True, hang_recorded=True)
    assert stalled.action is HangAction.WITHHELD
    assert stalled.withholds and not stalled.records_hang and not stalled.cancels
    # The job went on: its steps are followed as before, and nothing is withheld meanwhile.
    assert _decide("13", StepSeen("12", T0), at=600, withholding=True,
                   hang_recorded=True).action is HangAction.PROGRESS
    assert _decide("12", StepSeen("12", T0), at=599, withholding=True,
                   hang_recorded=True).action is HangAction.NOTHING


# -- carried out on a store -------------------------------------------------------


class Slurm:
    """Records the cancels the watch asks of Slurm."""

    def __init__(self) -> None:
        self.cancelled: list[int] = []

    def cancel(self, job_id: int) -> None:
        self.cancelled.append(job_id)


def _hangs(store: Store) -> list[dict[str, object]]:
    return [dict(e.data) for e in store.events(run_id="r", kinds=[Kind.ATTEMPT_HANG])]


def test_a_hang_is_recorded_once_and_cancelled_until_the_job_ends(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    now = [T0 + timedelta(seconds=30)]
    slurm = Slurm()
    with open_store(f"sqlite:///{tmp_path / 'b300.db'}") as store:
        a = running_attempt(store, progress, "10m")
        watch = HangWatch(store, cast(SlurmClient, slurm), lambda: now[0])
        write_step(progress, 12, T0 + timedelta(seconds=25))
        assert watch.check([a]) == 0
        now[0] = T0 + timedelta(seconds=630)
        assert watch.check([a]) == 1
        assert _hangs(store) == [{"job_id": 7, "last_step": "12", "stalled_s": 600.0,
                                  "progress_file": str(progress)}]
        now[0] += timedelta(seconds=5)   # Slurm has not ended it yet: asked again, not recorded again
        assert watch.check([a]) == 1
        assert slurm.cancelled == [7, 7] and len(_hangs(store)) == 1


def test_a_restarted_daemon_cancels_a_recorded_hang_at_once(tmp_path: Path) -> None:
    """The daemon died between the attempt.hang commit and the cancel: the next one, with
    nothing in memory, cancels on its first cycle instead of timing the step from zero."""
    progress = tmp_path / "progress.json"
    now = T0 + timedelta(seconds=631)
    slurm = Slurm()
    with open_store(f"sqlite:///{tmp_path / 'b300.db'}") as store:
        a = running_attempt(store, progress, "10m")
        write_step(progress, 12, T0 + timedelta(seconds=25))
        data = {"job_id": 7, "last_step": "12", "stalled_s": 600.0, "progress_file": str(progress)}
        store.append_events([NewEvent(Kind.ATTEMPT_HANG, run_id="r", attempt_id=a.id, data=data)],
                            T0 + timedelta(seconds=630))
        watch = HangWatch(store, cast(SlurmClient, slurm), lambda: now)
        assert watch.check([a]) == 1
        assert slurm.cancelled == [7] and _hangs(store) == [data]


def test_observe_mode_records_a_hang_once_across_a_restart(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    now = [T0 + timedelta(seconds=30)]
    slurm = Slurm()
    with open_store(f"sqlite:///{tmp_path / 'b300.db'}") as store:
        a = running_attempt(store, progress, "10m")
        write_step(progress, 12, T0 + timedelta(seconds=25))
        for _daemon in range(2):   # the second: a restart, nothing in memory
            watch = HangWatch(store, cast(SlurmClient, slurm), lambda: now[0],
                              withheld=Withheld(store.append_events, "observe mode"))
            assert watch.check([a]) == 0
            now[0] += timedelta(seconds=600)
            assert watch.check([a]) == 0
            now[0] += timedelta(seconds=30)
            assert watch.check([a]) == 0
        withheld = store.events(run_id="r", kinds=[Kind.ACTION_WITHHELD])
        assert slurm.cancelled == [] and len(_hangs(store)) == 1
        # One action.withheld per daemon life (b300.safety.mode.Withheld), the job left running.
        assert [(e.data["action"], e.data["subject"]) for e in withheld] == [("cancel", "job 7")] * 2
