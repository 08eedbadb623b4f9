"""The checkpoint schedule: pure status and Young/Daly, and a signal reaching a real Slurm job."""

from __future__ import annotations

import json
import math
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from ckpt_fixtures import generic

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.schedule import (
    CheckpointWatcher,
    observed_mtbf,
    schedule_status,
    young_daly_interval,
)
from b300.model import Attempt, AttemptState, CheckpointInfo, Run, RunState
from b300.slurm.cli import CliSlurmClient
from helpers import slurm_cmd, wait_for

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def _ck(minutes_ago: float, complete: bool = True) -> CheckpointInfo:
    return CheckpointInfo("/c", 1, NOW - timedelta(minutes=minutes_ago), complete)


def test_young_daly_interval() -> None:
    # A 5-minute save: ~2 h at a 24 h MTBF, ~1 h at 6 h. (FIELD-NOTES' "~28 min at 1.8 h"
    # does not follow from the formula: sqrt(2 * 300 s * 1.8 h) is 32.9 min.)
    assert young_daly_interval(300, 24 * 3600) / 3600 == pytest.approx(2.0, abs=0.05)
    assert young_daly_interval(300, 6 * 3600) / 3600 == pytest.approx(1.0, abs=0.01)
    assert young_daly_interval(300, 1.8 * 3600) / 60 == pytest.approx(32.9, abs=0.1)
    with pytest.raises(ValueError):
        young_daly_interval(0, 10)


def test_status_counts_from_the_newest_complete_or_the_start() -> None:
    start = NOW - timedelta(hours=5)
    s = schedule_status("r", [_ck(90), _ck(10, complete=False)], 3600, start, NOW)
    assert s.overdue and s.age_s == 90 * 60
    assert not schedule_status("r", [_ck(30)], 3600, start, NOW).overdue
    # A job that started 20 min ago with an old checkpoint from a previous attempt is not overdue yet.
    assert not schedule_status("r", [_ck(300)], 3600, NOW - timedelta(minutes=20), NOW).overdue
    s = schedule_status("r", [], 3600, start, NOW, save_time_s=300, mtbf_s=6 * 3600)
    assert s.overdue and s.newest is None and s.optimal_interval_s == pytest.approx(3600)


def _run(spec: str, run_id: str = "ck-run") -> Run:
    return Run(run_id, run_id, spec, RunState.RUNNING, NOW, NOW)


def _attempt(state: AttemptState, start: datetime | None, end: datetime | None = None, *, job: int | None = 1,
             number: int = 1, outcome: str = "") -> Attempt:
    return Attempt(number, "ck-run", number, f"b300-ck-run-a{number}", state, NOW, NOW, slurm_job_id=job,
                   start=start, end=end, outcome=outcome)


def test_mtbf_is_run_time_per_infra_failure() -> None:
    attempts = [
        _attempt(AttemptState.NODE_FAIL, NOW - timedelta(hours=10), NOW - timedelta(hours=6)),
        _attempt(AttemptState.FAILED, NOW - timedelta(hours=6), NOW - timedelta(hours=4), outcome="INFRA"),
        _attempt(AttemptState.RUNNING, NOW - timedelta(hours=4)),
    ]
    assert observed_mtbf(attempts, NOW) == pytest.approx(5 * 3600)
    assert observed_mtbf(attempts[2:], NOW) is None


def _spec(ckpt_dir: Path, interval: str = "1h") -> str:
    return (f'name = "ck"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
            f'[checkpoint]\ndir = {json.dumps(str(ckpt_dir))}\nlayout = "generic"\ninterval = "{interval}"\n')


@pytest.mark.slurm
def test_overdue_run_alerts_and_its_real_job_gets_usr1(tmp_path: Path, slurm_conf: str) -> None:
    got = tmp_path / "got"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\ntrap 'echo got USR1 > {got}' USR1\nwhile true; do sleep 1; done\n")
    out = slurm_cmd(slurm_conf, "sbatch", "--parsable", "--job-name=b300-test-ckpt-usr1",
                    f"--output={tmp_path}/out.txt", "--time=5", str(script))
    job_id = int(out.strip().split(";")[0])
    try:
        wait_for(lambda: slurm_cmd(slurm_conf, "squeue", "-h", "-j", str(job_id), "-o", "%T").strip()
                 == "RUNNING", 60, "the job to run")
        ckpt_dir = tmp_path / "ckpt"
        generic(ckpt_dir, 100, t=(NOW - timedelta(hours=3)).timestamp())
        slurm = CliSlurmClient(slurm_conf=slurm_conf, bin_dir=None, timeout=30)
        watcher = CheckpointWatcher(slurm, load_layout, signal="USR1", save_time_s=lambda r: 300.0)
        attempts = [_attempt(AttemptState.NODE_FAIL, NOW - timedelta(hours=8), NOW - timedelta(hours=2)),
                    _attempt(AttemptState.RUNNING, NOW - timedelta(hours=2), job=job_id, number=2)]
        runs = [(_run(_spec(ckpt_dir)), attempts)]

        (alert,) = watcher.check(runs, NOW)
        assert alert.kind == "checkpoint.overdue" and alert.data["signalled"] is True
        assert alert.data["newest_step"] == 100 and alert.data["job_id"] == job_id
        assert alert.data["optimal_interval_s"] == pytest.approx(math.sqrt(2 * 300 * 8 * 3600), abs=1)
        assert "Young/Daly" in alert.message
        wait_for(lambda: got.exists() and got.read_text().strip() == "got USR1", 30, "USR1 to reach the job")

        # Still overdue a minute later: alert again, but no second signal within the interval.
        (again,) = watcher.check(runs, NOW + timedelta(minutes=1))
        assert again.data["signalled"] is False
        # A fresh checkpoint ends it.
        generic(ckpt_dir, 200, t=NOW.timestamp())
        assert watcher.check(runs, NOW + timedelta(minutes=2)) == []
    finally:
        subprocess.run(["scancel", str(job_id)], env={"SLURM_CONF": slurm_conf, "PATH": os.environ["PATH"]},
                       check=False, timeout=30)
