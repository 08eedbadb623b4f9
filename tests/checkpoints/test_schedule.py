"""The checkpoint schedule: pure status and Young/Daly, the overdue episodes, and signals
reaching (or, without the spec's opt-in, never reaching) a real Slurm job."""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from ckpt_fixtures import generic

from b300.checkpoints.cadence import (
    FailureIndex,
    ScheduleEnforcer,
    failure_history,
    format_span,
    observed_mtbf,
    save_time,
    schedule_status,
    young_daly,
    young_daly_interval,
)
from b300.checkpoints.layouts import load_layout
from b300.interfaces import NewEvent
from b300.model import Attempt, AttemptState, CheckpointInfo, Event, Run, RunState
from b300.slurm.cli import CliSlurmClient
from helpers import slurm_cmd, wait_for

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def _ck(minutes_ago: float, complete: bool = True, *, step: int = 1,
        save_s: float | None = None) -> CheckpointInfo:
    return CheckpointInfo(f"/c/{step}", step, NOW - timedelta(minutes=minutes_ago), complete, save_s=save_s)


def test_young_daly_interval() -> None:
    # A 5-minute save: ~2 h at a 24 h MTBF, ~1 h at 6 h. (FIELD-NOTES' "~28 min at 1.8 h"
    # does not follow from the formula: sqrt(2 * 300 s * 1.8 h) is 32.9 min.)
    assert young_daly_interval(300, 24 * 3600) / 3600 == pytest.approx(2.0, abs=0.05)
    assert young_daly_interval(300, 6 * 3600) / 3600 == pytest.approx(1.0, abs=0.01)
    assert young_daly_interval(300, 1.8 * 3600) / 60 == pytest.approx(32.9, abs=0.1)
    with pytest.raises(ValueError):
        young_daly_interval(0, 10)


def test_spans_read_as_the_figure() -> None:
    assert format_span(69.94) == "69.9 s"
    assert format_span(600) == "10.0 min"
    assert format_span(3 * 3600 + 720) == "3.2 h"


def test_status_counts_from_the_newest_complete_or_the_start() -> None:
    start = NOW - timedelta(hours=5)
    s = schedule_status("r", [_ck(90), _ck(10, complete=False)], 3600, start, NOW)
    assert s.overdue and s.age_s == 90 * 60 and s.counted_from == "checkpoint"
    assert not schedule_status("r", [_ck(30)], 3600, start, NOW).overdue
    # A job that started 20 min ago with an old checkpoint from a previous attempt is not overdue yet.
    s = schedule_status("r", [_ck(300)], 3600, NOW - timedelta(minutes=20), NOW)
    assert not s.overdue and s.counted_from == "start" and s.age_s == 20 * 60
    s = schedule_status("r", [], 3600, start, NOW)
    assert s.overdue and s.newest is None and s.counted_from == "start" and s.age_s == 5 * 3600


def _run(spec: str, run_id: str = "ck-run") -> Run:
    return Run(run_id, run_id, spec, RunState.RUNNING, NOW, NOW)


def _attempt(state: AttemptState, start: datetime | None, end: datetime | None = None, *, job: int | None = 1,
             number: int = 1, outcome: str = "", run_id: str = "ck-run",
             nodes: tuple[str, ...] = ()) -> Attempt:
    return Attempt(number, run_id, number, f"b300-{run_id}-a{number}", state, NOW, NOW, slurm_job_id=job,
                   nodes=nodes, start=start, end=end, outcome=outcome)


def test_mtbf_is_run_time_per_infra_failure() -> None:
    attempts = [
        _attempt(AttemptState.NODE_FAIL, NOW - timedelta(hours=10), NOW - timedelta(hours=6)),
        _attempt(AttemptState.FAILED, NOW - timedelta(hours=6), NOW - timedelta(hours=4), outcome="INFRA"),
        _attempt(AttemptState.RUNNING, NOW - timedelta(hours=4)),
    ]
    assert observed_mtbf(attempts, NOW) == pytest.approx(5 * 3600)
    assert observed_mtbf(attempts[2:], NOW) is None


def test_young_daly_from_save_times_and_the_run_and_cluster_history() -> None:
    two = ("n1", "n2")
    history = [
        # This run: 4 h on 2 nodes, one node failure.
        _attempt(AttemptState.NODE_FAIL, NOW - timedelta(hours=6), NOW - timedelta(hours=2), nodes=two),
        _attempt(AttemptState.RUNNING, NOW - timedelta(hours=2), nodes=two, number=2),
        # Another run on 4 nodes: 10 h, one hang; a SIGNALLED end is the daemon's, not a failure.
        _attempt(AttemptState.CANCELLED, NOW - timedelta(hours=12), NOW - timedelta(hours=2), run_id="other",
                 outcome="HANG", nodes=("n1", "n2", "n3", "n4")),
        _attempt(AttemptState.FAILED, NOW - timedelta(hours=2), NOW - timedelta(hours=1), run_id="other",
                 outcome="SIGNALLED", nodes=("n1",), number=2),
    ]
    h = failure_history("ck-run", history, NOW)
    index = FailureIndex(history, NOW)  # every run's from one pass: the same figures
    assert [index.of(r) for r in ("ck-run", "other", "none")] == [
        h, failure_history("other", history, NOW), failure_history("none", history, NOW)]
    assert (h.run_failures, h.run_node_s) == (1, 2 * 6 * 3600)
    assert (h.cluster_failures, h.cluster_node_s) == (2, (12 + 40 + 1) * 3600)
    # 53 node-hours per 2 failures, on the run's 2 nodes: 13.25 h between failures.
    assert h.mtbf_s(2) == pytest.approx(13.25 * 3600)
    ckpts = [_ck(30, step=s, save_s=t) for s, t in ((1, 100.0), (2, 20.0), (3, 30.0), (4, 40.0), (5, None),
                                                     (6, 50.0), (7, 60.0))]
    assert save_time(ckpts) == (40.0, 5)  # the 5 newest timed: 20, 30, 40, 50, 60
    yd = young_daly(ckpts, h, 2, 3600)
    assert yd.interval_s == pytest.approx(math.sqrt(2 * 40 * 13.25 * 3600))
    assert yd.to_dict()["cluster_failures"] == 2 and yd.to_dict()["save_samples"] == 5
    line = yd.describe()
    assert line.startswith(f"Young/Daly {format_span(yd.interval_s or 0)} vs configured 60.0 min")
    assert "save 40.0 s (median of 5)" in line
    assert "2 failure(s) in 53.0 h of node time on the cluster, 1 in this run's 12.0 h" in line
    none = young_daly([], failure_history("x", [], NOW), 1, 3600)
    assert none.interval_s is None and "no checkpoint save time" in none.why_none
    assert "no infrastructure failure" in none.why_none and "no advice yet" in none.describe()


def test_built_in_layout_measures_the_save_time(tmp_path: Path) -> None:
    generic(tmp_path, 7, t=1_700_000_000.0)  # files at t, DONE at t + 1
    (info,) = load_layout("generic").list_checkpoints(str(tmp_path))
    assert info.complete and info.save_s == pytest.approx(1.0)
    generic(tmp_path, 8, done=False)
    listed = load_layout("generic").list_checkpoints(str(tmp_path))
    assert [c.save_s for c in listed] == [pytest.approx(1.0), None]


def _spec(ckpt_dir: Path, interval: str = "1h", signal: str | None = None) -> str:
    opt_in = f'signal = "{signal}"\n' if signal else ""
    return (f'name = "ck"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
            f'[checkpoint]\ndir = {json.dumps(str(ckpt_dir))}\nlayout = "generic"\ninterval = "{interval}"\n'
            + opt_in)


def _no_slurm(tmp_path: Path) -> CliSlurmClient:
    """A client whose every Slurm command fails: proves the watcher never called one."""
    return CliSlurmClient(bin_dir=str(tmp_path / "no-slurm-here"))


def _kinds(events: list[NewEvent]) -> list[str]:
    return [e.kind for e in events]


def test_without_opt_in_one_alert_per_episode_and_no_signal(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    watcher = ScheduleEnforcer(_no_slurm(tmp_path), load_layout, signal_grace_s=60)
    run = _run(_spec(ckpt_dir, "1m"))
    attempt = _attempt(AttemptState.RUNNING, NOW - timedelta(seconds=69.94), job=4242)
    runs = [(run, [attempt])]
    (overdue,) = watcher.check(runs, [attempt], NOW)
    assert overdue.kind == "checkpoint.overdue" and overdue.attempt_id == attempt.id
    msg = str(overdue.data["message"])
    assert "no checkpoint yet, 69.9 s after the attempt started (interval 60.0 s)" in msg
    assert "not signalled: the spec does not opt in" in msg and "Young/Daly: no advice yet" in msg
    assert overdue.data["age_s"] == 69.9 and overdue.data["signals"] == 0
    # Still overdue for minutes: no second alert, no signal (the client would have failed loudly).
    for minutes in (1, 2, 3, 4):
        assert watcher.check(runs, [attempt], NOW + timedelta(minutes=minutes)) == []
    # A checkpoint ends the episode once; the next lateness is a new episode with its own alert.
    generic(ckpt_dir, 10, t=(NOW + timedelta(minutes=5)).timestamp())
    (ok,) = watcher.check(runs, [attempt], NOW + timedelta(minutes=5, seconds=10))
    assert ok.kind == "checkpoint.ok" and "schedule met again: step 10" in str(ok.data["message"])
    assert watcher.check(runs, [attempt], NOW + timedelta(minutes=5, seconds=20)) == []
    (again,) = watcher.check(runs, [attempt], NOW + timedelta(minutes=7))
    assert again.kind == "checkpoint.overdue"
    # DONE is written 1 s after the files: 119 s, shown as the figure is.
    assert "newest complete checkpoint (step 10) is 119.0 s old (interval 60.0 s)" in str(again.data["message"])


def test_an_ended_run_gets_nothing_and_a_restart_does_not_page_again(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    watcher = ScheduleEnforcer(_no_slurm(tmp_path), load_layout)
    run = _run(_spec(ckpt_dir, "1m"))
    attempt = _attempt(AttemptState.RUNNING, NOW - timedelta(minutes=5))
    (overdue,) = watcher.check([(run, [attempt])], [attempt], NOW)
    # The daemon restarts: the episode comes back from the recorded event, no second alert.
    recorded = Event(1, NOW, overdue.kind, overdue.run_id, overdue.attempt_id, data=overdue.data)
    restarted = ScheduleEnforcer(_no_slurm(tmp_path), load_layout)
    restarted.restore([recorded])
    assert restarted.check([(run, [attempt])], [attempt], NOW + timedelta(minutes=1)) == []
    # The run ends while overdue, then a checkpoint appears: no "schedule met again" for it.
    ended = _attempt(AttemptState.FAILED, attempt.start, NOW + timedelta(minutes=2), outcome="JOB_ERROR")
    generic(ckpt_dir, 20, t=(NOW + timedelta(minutes=2)).timestamp())
    for w in (watcher, restarted):
        assert w.check([(run, [ended])], [ended], NOW + timedelta(minutes=3)) == []
        # ...nor later, should the run come back with a running attempt that keeps its schedule.
        fresh = _attempt(AttemptState.RUNNING, NOW + timedelta(minutes=3), number=2)
        assert w.check([(run, [ended, fresh])], [ended, fresh], NOW + timedelta(minutes=3, seconds=30)) == []


def test_allow_signals_false_and_a_job_that_died_of_the_signal_are_not_signalled(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    run = _run(_spec(ckpt_dir, "1m", signal="USR1"))
    attempt = _attempt(AttemptState.RUNNING, NOW - timedelta(minutes=5), number=1)
    off = ScheduleEnforcer(_no_slurm(tmp_path), load_layout, allow_signals=False)
    (e,) = off.check([(run, [attempt])], [attempt], NOW)
    assert e.kind == "checkpoint.overdue" and "allow_signals = false" in str(e.data["message"])
    died = _attempt(AttemptState.FAILED, NOW - timedelta(hours=1), NOW - timedelta(minutes=6), number=1,
                    outcome="SIGNALLED")
    second = _attempt(AttemptState.RUNNING, NOW - timedelta(minutes=5), number=2)
    watcher = ScheduleEnforcer(_no_slurm(tmp_path), load_layout)
    (e,) = watcher.check([(run, [died, second])], [died, second], NOW)
    assert "attempt 1 died of USR1: not signalled again" in str(e.data["message"])


@pytest.fixture
def trapping_job(tmp_path: Path, slurm_conf: str) -> Iterator[tuple[int, Path]]:
    """A real Slurm job whose batch shell appends a line to a file on each USR1."""
    got = tmp_path / "got"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\ntrap 'echo USR1 >> {got}' USR1\nwhile true; do sleep 1; done\n")
    out = slurm_cmd(slurm_conf, "sbatch", "--parsable", "--job-name=b300-test-ckpt-usr1",
                    f"--output={tmp_path}/out.txt", "--time=5", str(script))
    job_id = int(out.strip().split(";")[0])
    try:
        wait_for(lambda: slurm_cmd(slurm_conf, "squeue", "-h", "-j", str(job_id), "-o", "%T").strip()
                 == "RUNNING", 60, "the job to run")
        yield job_id, got
    finally:
        subprocess.run(["scancel", str(job_id)], env={"SLURM_CONF": slurm_conf, "PATH": os.environ["PATH"]},
                       check=False, timeout=30)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slurm
def test_opted_in_job_gets_one_signal_per_interval_and_one_alert(
        tmp_path: Path, slurm_conf: str, trapping_job: tuple[int, Path]) -> None:
    job_id, got = trapping_job
    ckpt_dir = tmp_path / "ckpt"
    generic(ckpt_dir, 100, t=(NOW - timedelta(hours=3)).timestamp())
    slurm = CliSlurmClient(slurm_conf=slurm_conf, bin_dir=None, timeout=30)
    watcher = ScheduleEnforcer(slurm, load_layout, signal_grace_s=300)
    attempts = [_attempt(AttemptState.NODE_FAIL, NOW - timedelta(hours=8), NOW - timedelta(hours=4), number=1),
                _attempt(AttemptState.RUNNING, NOW - timedelta(hours=4), job=job_id, number=2)]
    runs = [(_run(_spec(ckpt_dir, "1h", signal="USR1")), attempts)]

    (sig,) = watcher.check(runs, attempts, NOW)  # a signal, no alert yet: the job may answer
    assert sig.kind == "checkpoint.signal" and sig.data["job_id"] == job_id and sig.data["number"] == 1
    assert "sent USR1 to the batch shell" in str(sig.data["message"])
    wait_for(lambda: _lines(got) == 1, 30, "USR1 to reach the job")
    # Within the grace: nothing. After it, unanswered: the one alert, with the Young/Daly advice.
    assert watcher.check(runs, attempts, NOW + timedelta(minutes=2)) == []
    (alert,) = watcher.check(runs, attempts, NOW + timedelta(minutes=5))
    assert alert.kind == "checkpoint.overdue" and alert.data["signals"] == 1
    assert "no checkpoint 5.0 min after 1 signal(s)" in str(alert.data["message"])
    # Run time 4 h + 4 h 5 min on one node, one failure: MTBF 8 h 5 min; save 1 s (the fixture's files).
    assert alert.data["young_daly"]["interval_s"] == pytest.approx(math.sqrt(2 * 1.0 * (8 * 3600 + 300)), abs=1)
    assert "Young/Daly" in str(alert.data["message"])
    # Still unanswered: a second signal only one interval after the first, never a second alert.
    assert watcher.check(runs, attempts, NOW + timedelta(minutes=59)) == []
    (sig2,) = watcher.check(runs, attempts, NOW + timedelta(minutes=60))
    assert sig2.kind == "checkpoint.signal" and sig2.data["number"] == 2
    wait_for(lambda: _lines(got) == 2, 30, "the second USR1")
    # A fresh checkpoint ends the episode once, saying how soon after the signal it came.
    generic(ckpt_dir, 200, t=(NOW + timedelta(minutes=60, seconds=9)).timestamp())
    (ok,) = watcher.check(runs, attempts, NOW + timedelta(minutes=61))
    assert ok.kind == "checkpoint.ok" and "step 200, 10.0 s after USR1" in str(ok.data["message"])
    assert _lines(got) == 2


@pytest.mark.slurm
def test_a_job_that_answers_the_signal_pages_nobody(
        tmp_path: Path, slurm_conf: str, trapping_job: tuple[int, Path]) -> None:
    job_id, got = trapping_job
    ckpt_dir = tmp_path / "ckpt"
    generic(ckpt_dir, 1, t=(NOW - timedelta(minutes=2)).timestamp())
    slurm = CliSlurmClient(slurm_conf=slurm_conf, bin_dir=None, timeout=30)
    watcher = ScheduleEnforcer(slurm, load_layout, signal_grace_s=30)
    attempt = _attempt(AttemptState.RUNNING, NOW - timedelta(hours=1), job=job_id)
    runs = [(_run(_spec(ckpt_dir, "1m", signal="USR1")), [attempt])]
    kinds: list[str] = []
    for n in range(4):  # every 90 s it is late, gets USR1, and saves within 10 s
        t = NOW + timedelta(seconds=90 * n)
        kinds += _kinds(watcher.check(runs, [attempt], t))
        # One at a time: bash runs a trap once for signals that arrive during one `sleep`.
        wait_for(lambda: _lines(got) == n + 1, 30, f"USR1 number {n + 1}")  # noqa: B023 - used at once
        generic(ckpt_dir, 2 + n, t=(t + timedelta(seconds=10)).timestamp())
        kinds += _kinds(watcher.check(runs, [attempt], t + timedelta(seconds=20)))
    assert kinds == ["checkpoint.signal", "checkpoint.ok"] * 4
