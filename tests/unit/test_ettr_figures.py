"""The report's ETTR split from the daemon's own records (daemon.report.compute.run_figures):
where an attempt's training ends, how recompute is timed between sparse progress points, and
the job's own write time (``at``) preferred to the poll's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from b300.model import Attempt, AttemptState, Event, Run, RunState
from b300.report.compute import RunInput, Window, run_figures

T0 = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
WINDOW = Window(T0, T0 + timedelta(hours=1))


def s(sec: float) -> datetime:
    return T0 + timedelta(seconds=sec)


def attempt(n: int, created: float, start: float, end: float | None, outcome: str = "",
            state: AttemptState = AttemptState.FAILED) -> Attempt:
    return Attempt(n, "r", n, f"t{n}", state if end is not None else AttemptState.RUNNING, s(created),
                   s(end if end is not None else start), start=s(start),
                   end=s(end) if end is not None else None, outcome=outcome)


_ids = iter(range(1, 10_000))


def progress(n: int, ts: float, step: int, **data: Any) -> Event:
    return Event(next(_ids), s(ts), "attempt.progress", "r", n, data={"step": step, **data})


def classified(n: int, ts: float) -> Event:
    return Event(next(_ids), s(ts), "attempt.classified", "r", n)


def figures(attempts: list[Attempt], events: list[Event], end: float | None = None) -> Any:
    run = Run("r", "r", "", RunState.RUNNING if end is None else RunState.COMPLETED, T0,
              s(end) if end is not None else s(0))
    f = run_figures(RunInput(run, attempts), events, WINDOW)
    assert f is not None
    return f


def test_an_interrupted_attempt_trains_until_its_last_step_then_detection_runs() -> None:
    # attempt 1: starts 10, first step at 20, last step at 300 (the node died), Slurm ended
    # it at 340, classified at 345; attempt 2 created 350, starts 360, first step 370.
    f = figures([attempt(1, 0, 10, 340, "INFRA"), attempt(2, 350, 360, None)],
                [progress(1, 20, 1), progress(1, 305, 100, last=True, at=s(300).timestamp()),
                 classified(1, 345), progress(2, 370, 91), progress(2, 400, 110)])
    assert f.detect_s == pytest.approx(45)         # 300 -> 345: the job was dead from its last step
    assert f.queue_s == pytest.approx(10 + 10)
    assert f.restart_s == pytest.approx(10 + 10)
    # recompute: steps 91 -> 100 between the points (370, 91) and (400, 110): 9/19 of 30 s
    assert f.recompute_s == pytest.approx(30 * 9 / 19)
    assert f.training_s == pytest.approx((300 - 20) + (3600 - 370) - 30 * 9 / 19)
    assert f.wall_s == pytest.approx(3600)
    lost = f.detect_s + f.queue_s + f.restart_s + f.recompute_s + f.other_s
    assert f.training_s + lost == pytest.approx(f.wall_s)


def test_without_a_last_step_an_attempt_trains_until_its_end() -> None:
    f = figures([attempt(1, 0, 10, 340, "INFRA"), attempt(2, 350, 360, None)],
                [progress(1, 20, 1), classified(1, 345), progress(2, 370, 1)])
    assert f.detect_s == pytest.approx(5)
    assert f.training_s == pytest.approx((340 - 20) + (3600 - 370))


def test_the_jobs_own_write_time_is_preferred_to_the_polls() -> None:
    f = figures([attempt(1, 0, 10, None)], [progress(1, 40, 1, at=s(22.5).timestamp())])
    assert f.restart_s == pytest.approx(12.5)


def test_an_attempt_that_fails_before_catching_up_is_recompute_until_its_last_step_only() -> None:
    # attempt 2 resumes at step 50 (attempt 1 reached 100) and dies at step 80: all of its
    # training was recompute, and none past its own last step (not the window's end);
    # attempt 3 redoes up to step 100 (attempt 1's): 1 step/s from (540, 20), so until 620.
    f = figures([attempt(1, 0, 10, 300, "INFRA"), attempt(2, 310, 320, 500, "INFRA"),
                 attempt(3, 520, 530, None)],
                [progress(1, 20, 1), progress(1, 290, 100, last=True), classified(1, 305),
                 progress(2, 330, 50), progress(2, 480, 80, last=True), classified(2, 505),
                 progress(3, 540, 20), progress(3, 600, 80)])
    assert f.recompute_s == pytest.approx((480 - 330) + (620 - 540))
    assert f.detect_s == pytest.approx((305 - 290) + (505 - 480))


def test_a_running_attempt_short_of_its_target_is_extrapolated_at_the_runs_pace() -> None:
    f = figures([attempt(1, 0, 10, 300, "INFRA"), attempt(2, 310, 320, None)],
                [progress(1, 20, 1), progress(1, 290, 100, last=True), classified(1, 305),
                 progress(2, 330, 50), progress(2, 340, 60)])
    # (330, 50) -> (340, 60) is too short to tell a pace: the run's, pooled: 109 steps in
    # 280 s, so step 100 at 340 + 40 / (109 / 280)
    assert f.recompute_s == pytest.approx(10 + 40 / (109 / 280))


def test_recompute_runs_to_the_highest_step_any_earlier_attempt_reached() -> None:
    # 1 reaches 100; 2 resumes at 50 and dies at 80; 3 resumes at 60: it redoes up to 100.
    f = figures([attempt(1, 0, 10, 300, "INFRA"), attempt(2, 310, 320, 500, "INFRA"),
                 attempt(3, 520, 530, None)],
                [progress(1, 20, 1), progress(1, 290, 100, last=True), classified(1, 305),
                 progress(2, 330, 50), progress(2, 480, 80, last=True), classified(2, 505),
                 progress(3, 540, 60), progress(3, 640, 160)])
    assert f.recompute_s == pytest.approx((480 - 330) + 40 * (100 / 100))


def test_the_first_step_is_taken_back_from_the_first_seen_at_the_attempts_pace() -> None:
    # Resumed from step 100 (start_steps): first seen step 130 at 60, step 190 at 90 (2/s);
    # so step 101 was at 45.5: restart 10 -> 45.5, and recompute from there.
    run = Run("r", "r", "", RunState.RUNNING, T0, s(0))
    a = attempt(1, 0, 10, None)
    events = [progress(1, 60, 130), progress(1, 90, 190)]
    f = run_figures(RunInput(run, [a], start_steps={1: 100}), events, WINDOW)
    assert f is not None
    assert f.restart_s == pytest.approx(45.5 - 10)
    g = run_figures(RunInput(run, [a]), events, WINDOW)
    assert g is not None and g.restart_s == pytest.approx(50)


def test_a_first_step_that_would_fall_before_the_start_is_not_invented() -> None:
    # Said to start at step 0, but first seen at step 500 ten seconds in at 1 step/s: the job
    # found a checkpoint of its own; the report keeps the step it saw.
    run = Run("r", "r", "", RunState.RUNNING, T0, s(0))
    f = run_figures(RunInput(run, [attempt(1, 0, 10, None)], start_steps={1: 0}),
                    [progress(1, 20, 500), progress(1, 30, 510)], WINDOW)
    assert f is not None and f.restart_s == pytest.approx(10)


def test_an_attempt_without_progress_keeps_the_high_water_mark() -> None:
    # 1 reaches 100; 2 never trains (stuck in start-up); 3 resumes at 50 and redoes 50 -> 100.
    f = figures([attempt(1, 0, 10, 300, "INFRA"), attempt(2, 310, 320, 400, "HANG"),
                 attempt(3, 420, 430, None)],
                [progress(1, 20, 1), progress(1, 290, 100, last=True), classified(1, 305), classified(2, 405),
                 progress(3, 440, 50), progress(3, 490, 150)])
    assert f.recompute_s == pytest.approx(25)
