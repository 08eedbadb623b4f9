"""The pure parts of ``b300ctl drill`` (issue 14): who may be drilled, the node picked,
the figures computed from the event log, the site commands' argv, the request and
the command line's own checks."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from b300.app.requests import parse_request
from b300.cli.drill import drill_timeout
from b300.drill.crash_config import command_problem, node_argv
from b300.drill.timeline import (
    DrillStart,
    drill_figures,
    drill_refusal,
    next_attempt,
    node_healthy,
    open_drills,
    pick_node,
    trained_again,
)
from b300.errors import UsageError
from b300.events import Kind
from b300.model import Attempt, AttemptState, Event, Run, RunState

T0 = datetime(2026, 12, 2, 10, tzinfo=UTC)
RUN = Run("r-1", "r", "", RunState.RUNNING, T0, T0, 1)
A1 = Attempt(11, "r-1", 1, "b300-r-1-a1", AttemptState.RUNNING, T0, T0, slurm_job_id=7,
             nodes=("gpu01", "gpu02"), start=T0 - timedelta(minutes=5))
A2 = Attempt(12, "r-1", 2, "b300-r-1-a2", AttemptState.RUNNING, T0, T0, slurm_job_id=8,
             nodes=("gpu03", "gpu04"), excluded_nodes=("gpu02",), resume_from="/c/step_000010")


def _refusal(run: Run = RUN, attempts: tuple[Attempt, ...] = (A1,), **kw: Any) -> str | None:
    args: dict[str, Any] = {"node": None, "method": "down", "has_checkpoint": True, "has_progress_file": True,
                            "recovery_on": True, "crash_command": False, "open_drill": None, **kw}
    return drill_refusal(run, attempts, **args)


def test_a_running_checkpointed_run_may_be_drilled() -> None:
    assert _refusal() is None
    assert _refusal(node="gpu01") is None
    assert _refusal(method="crash", crash_command=True) is None


@pytest.mark.parametrize(("kw", "words"), [
    ({"run": replace(RUN, state=RunState.RECOVERING)}, "is not running (RECOVERING"),
    ({"attempts": (replace(A1, state=AttemptState.PENDING),)}, "is not running (RUNNING, PENDING)"),
    ({"attempts": ()}, "is not running (RUNNING, no attempt)"),
    ({"has_checkpoint": False}, "has no verified checkpoint"),
    ({"has_progress_file": False}, "has no [health] progress_file"),
    ({"node": "gpu07"}, "node gpu07 is not in run r-1's attempt 1 (nodes gpu01,gpu02)"),
    ({"method": "crash"}, "--method crash needs [drill] crash_command"),
    ({"method": "reboot"}, "unknown drill method 'reboot'"),
    ({"recovery_on": False}, "recovery is off"),
    ({"open_drill": 42}, "is being drilled already (drill 42)"),
])
def test_refusals_name_the_problem_in_one_line(kw: dict[str, Any], words: str) -> None:
    why = _refusal(**kw)
    assert why is not None and words in why and "\n" not in why


def test_the_node_given_or_the_attempts_last() -> None:
    assert pick_node(A1, None) == "gpu02"
    assert pick_node(A1, "gpu01") == "gpu01"


def test_healthy_means_in_service() -> None:
    for state in ("idle", "allocated", "mixed", "ALLOCATED", "completing"):
        assert node_healthy(state), state
    for state in ("down", "drained", "draining", "allocated+drain", "down*", "idle*", "fail", "", "unknown"):
        assert not node_healthy(state), state
    assert not node_healthy("idle", "Not responding")


def _start(**kw: Any) -> DrillStart:
    args: dict[str, Any] = {"id": 100, "ts": T0, "run_id": "r-1", "attempt_id": 11, "attempt": 1,
                            "node": "gpu02", "method": "crash", "step_at_failure": 14, "resume_step": 10,
                            "node_was_healthy": True, "node_state": "allocated", "timeout_s": 600.0, **kw}
    return DrillStart(**args)


_next_id = iter(range(1000, 2000))


def _ev(kind: Kind, after_s: float, **kw: Any) -> Event:
    return Event(next(_next_id), T0 + timedelta(seconds=after_s), kind.value, **kw)


def test_figures_are_seconds_to_the_first_event_of_each_milestone() -> None:
    events = [
        _ev(Kind.NODE_STATE, -5, node="gpu02", data={"state": "down", "reason": "earlier"}),  # before: ignored
        _ev(Kind.LIVENESS_SUSPECT, 2.0, node="gpu02"),
        _ev(Kind.LIVENESS_DEAD, 3.5, node="gpu02"),
        _ev(Kind.NODE_STATE, 30.0, node="gpu02", data={"state": "down*", "reason": "Not responding"}),
        _ev(Kind.LIVENESS_DEAD, 3.0, node="gpu01"),                     # another node
        _ev(Kind.NODE_DRAINED, 3.7, node="gpu02", data={"reason": "b300: dead"}),
        _ev(Kind.ATTEMPT_STATE, 4.0, run_id="r-1", attempt_id=11, data={"to": "NODE_FAIL"}),
        _ev(Kind.ATTEMPT_INTENT, 4.5, run_id="r-1", attempt_id=12, data={"exclude": ["gpu02"]}),
        _ev(Kind.ATTEMPT_SUBMITTED, 4.6, run_id="r-1", attempt_id=12, data={"job_id": 8}),
        _ev(Kind.ATTEMPT_STATE, 5.0, run_id="r-1", attempt_id=12, data={"to": "PENDING"}),
        _ev(Kind.ATTEMPT_STATE, 6.25, run_id="r-1", attempt_id=12, data={"to": "RUNNING"}),
    ]
    f = drill_figures(_start(), list(reversed(events)), [A1, A2], trained=(T0 + timedelta(seconds=12), 11),
                      resume_steps={"/c/step_000010": 10})
    assert (f.detect_s, f.detected_by, f.drain_s, f.excluded_s) == (3.5, "liveness.dead", 3.7, 3.7)
    assert (f.resubmit_s, f.allocation_s, f.training_s, f.trained_step) == (4.6, 6.25, 12.0, 11)
    assert (f.new_attempt, f.resume_step, f.steps_lost) == (2, 10, 4)
    assert f.as_data()["detect_s"] == 3.5


def test_without_the_daemons_checks_slurm_or_the_attempts_end_is_the_detection() -> None:
    by_slurm = [_ev(Kind.NODE_STATE, 31.0, node="gpu02", data={"state": "down*", "reason": "Not responding"}),
                _ev(Kind.NODE_STATE, 1.0, node="gpu02", data={"state": "allocated", "reason": ""})]
    f = drill_figures(_start(), by_slurm, [A1])
    assert (f.detect_s, f.detected_by) == (31.0, "node.state")
    ended = [_ev(Kind.ATTEMPT_STATE, 0.5, run_id="r-1", attempt_id=11, data={"to": "NODE_FAIL"}),
             _ev(Kind.ATTEMPT_STATE, 0.1, run_id="r-1", attempt_id=11, data={"to": "COMPLETING"})]
    assert drill_figures(_start(), ended, [A1]).detect_s == 0.5


def test_an_exclude_list_before_any_drain_counts_as_excluded() -> None:
    events = [_ev(Kind.ATTEMPT_INTENT, 40.0, run_id="r-1", data={"exclude": ["gpu02", "gpu09"]}),
              _ev(Kind.ATTEMPT_INTENT, 20.0, run_id="r-2", data={"exclude": ["gpu02"]})]  # another run
    f = drill_figures(_start(), events, [A1, A2])
    assert (f.drain_s, f.excluded_s) == (None, 40.0)


def test_milestones_not_reached_are_none_and_steps_lost_needs_both_steps() -> None:
    f = drill_figures(_start(step_at_failure=None), [], [A1])
    assert (f.detect_s, f.resubmit_s, f.allocation_s, f.training_s, f.new_attempt, f.steps_lost) == \
        (None, None, None, None, None, None)
    # The resume step of the attempt that ran, not the one foreseen at the start of the drill.
    f = drill_figures(_start(), [], [A1, replace(A2, resume_from="/c/step_000015")],
                      resume_steps={"/c/step_000015": 15})
    assert (f.resume_step, f.steps_lost) == (15, 0)
    # The job ran on after the node was pulled and saved a newer checkpoint: the steps lost
    # are from the last step seen to the one it resumed at.
    f = drill_figures(_start(), [], [A1, replace(A2, resume_from="/c/step_000015")],
                      resume_steps={"/c/step_000015": 15}, last_step=17)
    assert (f.resume_step, f.last_step, f.steps_lost) == (15, 17, 2)
    f = drill_figures(_start(step_at_failure=11), [], [A1, A2], resume_steps={}, last_step=12)
    assert (f.resume_step, f.steps_lost) == (10, 2)
    # Training seen without a next attempt is no training again.
    assert drill_figures(_start(), [], [A1], trained=(T0, 3)).training_s is None


def test_training_again_is_a_step_past_the_resume_step() -> None:
    assert trained_again("11", 10) == 11
    assert trained_again("10", 10) is None
    assert trained_again("1", None) == 1
    assert trained_again("", 10) is None and trained_again("nan", 3) is None


def test_open_drills_are_the_started_ones_without_a_finish() -> None:
    s1 = Event(5, T0, Kind.DRILL_STARTED.value, run_id="r-1", attempt_id=11, node="gpu02",
               data={"node": "gpu02", "method": "down", "attempt": 1, "step_at_failure": 3, "resume_step": None,
                     "node_was_healthy": True, "timeout_s": 90})
    s2 = replace(s1, id=9)
    done = Event(7, T0, Kind.DRILL_FINISHED.value, data={"drill": 5})
    [left] = open_drills([s1, done, s2])
    assert (left.id, left.node, left.method, left.attempt, left.timeout_s, left.resume_step) == \
        (9, "gpu02", "down", 1, 90.0, None)
    assert next_attempt(left, [A1, A2]) == A2 and next_attempt(left, [A1]) is None


def test_site_commands_take_the_node_as_an_argv_element_of_its_own() -> None:
    assert command_problem([]) is None
    assert command_problem(["/usr/sbin/ipmi", "-H", "{node}", "off"]) is None
    assert "absolute path" in str(command_problem(["ipmi", "{node}"]))
    assert "argv element of its own" in str(command_problem(["/bin/echo", "x"]))
    assert "not inside '--host={node}'" in str(command_problem(["/bin/x", "--host={node}", "{node}"]))
    # A name with shell syntax stays one argument (no shell ever sees it).
    assert node_argv(["/bin/x", "{node}", "off"], "gpu01;rm") == ["/bin/x", "gpu01;rm", "off"]


def test_the_request_is_checked_before_the_daemon_sees_it() -> None:
    r = parse_request({"op": "drill", "run_id": "r-1", "node": "gpu01", "method": "crash", "timeout_s": 60})
    assert (r.op, r.node, r.method) == ("drill", "gpu01", "crash")
    for bad, words in [({"method": "reboot"}, "drill: method"), ({"node": "gpu01;rm -rf /"}, "bad node name"),
                       ({"timeout_s": 0}, "drill: timeout_s"), ({"timeout_s": 7200}, "drill: timeout_s")]:
        with pytest.raises(UsageError, match=words):
            parse_request({"op": "drill", "run_id": "r-1", **bad})
    with pytest.raises(UsageError, match="drill_status: drill"):
        parse_request({"op": "drill_status", "drill": "1"})


def test_the_timeout_option() -> None:
    assert drill_timeout("90") == 90.0 and drill_timeout("10m") == 600.0
    for bad, words in [("2h", "between 1 s and 1 h"), ("soon", "--timeout must be"), ("0", "--timeout")]:
        with pytest.raises(UsageError, match=words):
            drill_timeout(bad)


def test_the_weekly_report_lists_the_windows_drills_with_their_figures() -> None:
    from b300.report.compute import Window, weekly_report
    from b300.report.render import render_html, render_text

    window = Window(T0 - timedelta(days=7), T0)
    finished = {"drill": 5, "node": "gpu02", "method": "crash", "outcome": "trained again", "detect_s": 3.5,
                "excluded_s": 3.7, "resubmit_s": 4.6, "allocation_s": 6.25, "training_s": 12.0,
                "resume_step": 10, "steps_lost": 4, "returned": "resumed"}
    events = [Event(1, T0 - timedelta(days=1), Kind.DRILL_FINISHED.value, run_id="r-1", node="gpu02",
                    data=finished),
              # before the window
              Event(2, T0 - timedelta(days=9), Kind.DRILL_FINISHED.value, run_id="r-0", data=finished),
              Event(3, T0 - timedelta(days=2), Kind.DRILL_STARTED.value, run_id="r-1", data={"node": "gpu03"})]
    report = weekly_report([], events, window, T0)
    [row] = report.drills
    assert (row.run_id, row.node, row.method, row.detect_s, row.excluded_s, row.training_s, row.resume_step,
            row.steps_lost) == ("r-1", "gpu02", "crash", 3.5, 3.7, 12.0, 10, 4)
    text = render_text(report)
    assert "Failure drills: 1" in text
    line = next(x for x in text.splitlines() if "gpu02" in x)
    assert line.split()[2:] == ["r-1", "gpu02", "crash", "3.5", "3.7", "4.6", "6.2", "12.0", "10", "4",
                                "trained", "again"]
    assert "<td" in render_html(report, {}, lambda name, data: name) and "12.0" in render_html(
        report, {}, lambda name, data: name)
    assert "Failure drills: 0" in render_text(weekly_report([], [], window, T0))


def test_the_screen_shows_every_figure_or_how_far_it_got(capsys: pytest.CaptureFixture[str]) -> None:
    from b300.cli.drill import print_drill

    started = {"node": "gpu02", "method": "crash", "node_state": "allocated", "step_at_failure": 14}
    finished = {"detect_s": 3.5, "detected_by": "liveness.dead", "drain_s": 3.7, "excluded_s": 3.7,
                "resubmit_s": 4.6, "new_attempt": 2, "allocation_s": 6.3, "training_s": 12.0,
                "trained_step": 11, "resume_step": 10, "steps_lost": 4, "outcome": "trained again",
                "node": "gpu02", "returned": "resumed"}
    print_drill({"run": "r-1", "started": started, "injected": {"inject_s": 0.4}, "finished": finished})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "run r-1, node gpu02 (crash), was allocated"
    rows = {line[:18].strip(): line[18:].split() for line in out[1:] if line.startswith("  ")}
    assert rows["detected"][:3] == ["3.5", "s", "(liveness.dead)"]
    assert rows["excluded"] == ["3.7", "s"] and rows["training again"] == ["12.0", "s", "(step", "11)"]
    assert rows["resumed at step"] == ["10"] and rows["steps lost"][0] == "4"
    assert out[-1] == "  outcome: trained again; node gpu02: resumed"
    print_drill({"run": "r-1", "started": started})
    out = capsys.readouterr().out
    assert "training again         - s" in out and "still measuring" in out
