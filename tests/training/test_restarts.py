"""The restart-loop breaker and "do not restart" exits: pure decisions with their reasons."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b300.training.findings import FindingKind
from b300.training.protocol import ExitIntent
from b300.training.restarts import (
    AttemptCheckpoints,
    ExitVerdict,
    classify_exit,
    restart_loop_decision,
)
from b300.training.thresholds import RestartLoopThresholds

TH = RestartLoopThresholds()   # 3 attempts in a row
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _attempts(*rows: tuple[str, int | None]) -> list[AttemptCheckpoints]:
    return [AttemptCheckpoints(i + 1, outcome, step) for i, (outcome, step) in enumerate(rows)]


def test_three_attempts_that_died_before_a_new_checkpoint_stop_the_run() -> None:
    history = _attempts(("INFRA", 1000), ("JOB_ERROR", 1000), ("INFRA", 1000), ("JOB_ERROR", 1000))
    decision = restart_loop_decision(history, TH)
    assert decision.stop and decision.attempts == (2, 3, 4) and decision.newest_step == 1000
    assert "(2, 3, 4)" in decision.reason and "newer than step 1000" in decision.reason
    finding = decision.finding("run-1", NOW)
    assert finding is not None and finding.kind is FindingKind.RESTART_LOOP and finding.step == 1000


def test_no_checkpoint_at_all() -> None:
    decision = restart_loop_decision(_attempts(("JOB_ERROR", None),) * 3, TH)
    assert decision.stop and "without a checkpoint at all" in decision.reason


def test_two_are_not_enough_and_progress_resets_the_row() -> None:
    assert not restart_loop_decision(_attempts(("INFRA", 10), ("INFRA", 10), ("INFRA", 10)), TH).stop
    history = _attempts(("INFRA", 10), ("INFRA", 10), ("INFRA", 20), ("INFRA", 20), ("INFRA", 20))
    decision = restart_loop_decision(history, TH)
    assert not decision.stop and decision.attempts == (4, 5)
    assert decision.finding("r", NOW) is None


def test_the_start_checkpoint_counts_as_the_newest_before_the_first_attempt() -> None:
    history = _attempts(("INFRA", 500), ("INFRA", 500), ("INFRA", 500))
    assert restart_loop_decision(history, TH, start_step=500).stop
    assert not restart_loop_decision(history, TH, start_step=None).stop


def test_preemptions_neither_count_nor_break_the_row() -> None:
    history = _attempts(("INFRA", 7), ("PREEMPTED", 7), ("INFRA", 7), ("PREEMPTED", 7), ("INFRA", 7))
    decision = restart_loop_decision(history, TH, start_step=7)
    assert decision.stop and decision.attempts == (1, 3, 5)
    assert not restart_loop_decision(_attempts(("PREEMPTED", 7),) * 10, TH, start_step=7).stop


def test_a_checkpoint_that_went_back_is_no_progress() -> None:
    history = _attempts(("INFRA", 100), ("INFRA", 80), ("INFRA", 90), ("INFRA", 100))
    assert restart_loop_decision(history, TH).attempts == (2, 3, 4)


@given(st.lists(st.tuples(st.sampled_from(["INFRA", "JOB_ERROR", "PREEMPTED", "TIMEOUT"]),
                          st.integers(1, 50)), max_size=30))
def test_a_run_whose_every_attempt_advances_is_never_stopped(rows: list[tuple[str, int]]) -> None:
    step = 0
    history = []
    for i, (outcome, gain) in enumerate(rows):
        step += gain
        history.append(AttemptCheckpoints(i + 1, outcome, step))
    assert not restart_loop_decision(history, TH).stop


@given(st.lists(st.tuples(st.sampled_from(["INFRA", "JOB_ERROR", "PREEMPTED"]), st.none() | st.integers(0, 5)),
                max_size=30), st.integers(1, 6))
def test_stop_means_k_non_preempted_attempts_without_progress(rows: list[tuple[str, int | None]],
                                                              k: int) -> None:
    th = RestartLoopThresholds(attempts=k)
    decision = restart_loop_decision(_attempts(*rows), th)
    assert decision.stop == (len(decision.attempts) >= k)
    assert all(rows[n - 1][0] != "PREEMPTED" for n in decision.attempts)


@pytest.mark.parametrize(("code", "intent", "verdict", "words"), [
    (3, None, ExitVerdict.NO_RESTART, "exit code 3 is declared"),
    (3, ExitIntent(True, "bad node"), ExitVerdict.NO_RESTART, "exit code 3"),
    (1, ExitIntent(False, "dataset exhausted"), ExitVerdict.NO_RESTART, "asked not to be restarted: dataset"),
    (None, ExitIntent(False), ExitVerdict.NO_RESTART, "asked not to be restarted"),
    (1, ExitIntent(True, "NCCL timeout"), ExitVerdict.RESTART_REQUESTED, "asked to be restarted: NCCL"),
    (1, None, ExitVerdict.UNDECLARED, "nothing declared"),
    (0, None, ExitVerdict.UNDECLARED, "nothing declared"),
])
def test_classify_exit(code: int | None, intent: ExitIntent | None, verdict: ExitVerdict, words: str) -> None:
    result = classify_exit(code, no_restart_exit_codes=(3, 0), intent=intent)
    assert result.verdict is verdict and words in result.reason
    finding = result.finding("r", NOW)
    assert (finding is not None) == (verdict is ExitVerdict.NO_RESTART)
    if finding is not None:
        assert finding.kind is FindingKind.NO_RESTART and finding.evidence == result.reason
