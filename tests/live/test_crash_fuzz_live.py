"""Fault injection: SIGKILL the real daemon at random moments while it recovers a run.

The run's job fails with a retryable exit code on its first attempts, so the
daemon keeps classifying, resubmitting and confirming; the test kills it with
SIGKILL at random times (and at each named crash point once) and restarts it,
many times. After every restart and at the end it checks the invariants:
never two Slurm jobs of the run active at once, never two Slurm jobs for one
attempt tag, no attempt lost (every recorded job id is the one Slurm has for
that tag), and the run completes after exactly the expected attempts.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest

from helpers import DaemonHandle, make_daemon, slurm_cmd, wait_for

pytestmark = pytest.mark.slurm
SUCCEEDS_AT = 10  # attempts 1-9 exit 75 (retryable), attempt 10 completes
CRASH_POINTS = ["before_sbatch", "after_sbatch", "recovery_classified"]


def _spec(tmp_path: Path) -> Path:
    body = (f'sleep 1; if [ "$B300_ATTEMPT" -ge {SUCCEEDS_AT} ]; then exit 0; fi; '
            'echo "transient failure"; exit 75')
    spec = tmp_path / "flaky.toml"
    spec.write_text(f'name = "flaky"\n[job]\ncommand = {json.dumps(body)}\nnodes = 1\n'
                    "gpus_per_node = 0\n[retries]\ninfra = 12\nretryable_exit_codes = [75]\n")
    return spec


def _jobs_by_tag(conf: str, run_id: str) -> dict[str, list[str]]:
    """Slurm job ids per attempt tag, from the controller and accounting together
    (a job just submitted may not be in sacct yet)."""
    acct = slurm_cmd(conf, "sacct", "-X", "-n", "-P", "--format=JobID,JobName",
                     "-S", "now-1hour", "--duplicates")
    live = slurm_cmd(conf, "squeue", "--noheader", "--states=all", "--format=%i|%j")
    tags: dict[str, set[str]] = {}
    for line in (acct + "\n" + live).splitlines():
        if "|" not in line:
            continue
        jid, name = line.split("|", 1)
        if name.startswith(f"b300-{run_id}-a"):
            tags.setdefault(name, set()).add(jid)
    return {tag: sorted(ids) for tag, ids in tags.items()}


def _active(conf: str, run_id: str) -> int:
    out = slurm_cmd(conf, "squeue", "--noheader", "--format=%j")
    return sum(1 for line in out.splitlines() if line.startswith(f"b300-{run_id}-a"))


def _check(d: DaemonHandle, conf: str, run_id: str) -> None:
    assert _active(conf, run_id) <= 1
    tags = _jobs_by_tag(conf, run_id)
    assert all(len(ids) == 1 for ids in tags.values()), tags
    for attempt in d.run(run_id)["attempts"]:
        if attempt["job_id"] is not None:
            assert tags.get(attempt["tag"]) == [str(attempt["job_id"])], (attempt, tags)


def test_random_sigkills_during_recovery_lose_and_duplicate_nothing(
    tmp_path: Path, slurm_conf: str
) -> None:
    rng = random.Random(20261129)  # noqa: S311 - reproducible test timing, not crypto
    d = make_daemon(tmp_path, slurm_conf, poll_interval="0.5s", submit_grace="3s")
    d.config.write_text(d.config.read_text() + '[recovery]\nnode_trigger = false\n')
    d.start()
    kills = 0
    try:
        run_id = d.submit(_spec(tmp_path))
        points = list(CRASH_POINTS)
        deadline = time.monotonic() + 240
        while d.run(run_id)["run"]["state"] not in ("COMPLETED", "FAILED", "CANCELLED"):
            assert time.monotonic() < deadline, "run did not finish in time"
            time.sleep(rng.uniform(0.2, 1.5))
            d.kill(signal.SIGKILL)
            kills += 1
            _check(d, slurm_conf, run_id)
            # Every named crash point once, then plain random kills.
            env = {"B300_CRASH_AT": points.pop(0)} if points else None
            d.start(extra_env=env, wait=False)
            if env:
                wait_for(lambda: (d.proc is not None and d.proc.poll() is not None)
                         or d.run(run_id)["run"]["state"] == "COMPLETED", 60,
                         f"the daemon to reach {env['B300_CRASH_AT']}")
                if d.proc is not None and d.proc.poll() is None:
                    d.kill(signal.SIGKILL)
                kills += 1
                d.start()
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
        assert status["run"]["state"] == "COMPLETED"
        attempts = status["attempts"]
        assert [a["number"] for a in attempts] == list(range(1, SUCCEEDS_AT + 1))
        assert [a["state"] for a in attempts] == ["FAILED"] * (SUCCEEDS_AT - 1) + ["COMPLETED"]
        _check(d, slurm_conf, run_id)
        assert kills >= 8
        print(f"SIGKILLs survived: {kills}")
    finally:
        d.cleanup()
