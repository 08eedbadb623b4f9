"""Whom a failure is blamed on, on the real cluster with the real CPU workload.

- A rank that dies of its own exception makes its peers print gloo "Connection
  closed by peer": that is the job's error (JOB_ERROR, not resubmitted), and no
  node gets a strike.
- The black-hole rule counts only infrastructure failures, restarts a node's
  count when an operator returns it (``scontrol update state=resume``, seen in
  sinfo, or ``b300ctl nodes resume``), drains a node once per failure with the
  specific reason kept, and never drains from the recovery of a run that did
  not run there.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from test_resubmit_live import ENDED, start_daemon, train_spec

from helpers import DaemonHandle, slurm_cmd, wait_for

pytestmark = pytest.mark.slurm


def _sinfo(conf: str, node: str) -> tuple[str, str]:
    out = slurm_cmd(conf, "sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T|%E")
    state, reason = out.strip().splitlines()[0].split("|", 1)
    return state, reason


def _scontrol(conf: str, node: str, *what: str, check: bool = True) -> None:
    if check:
        slurm_cmd(conf, "scontrol", "update", f"NodeName={node}", *what)
        return
    # Cleanup: resuming a node that is already back is refused; that is fine.
    subprocess.run(["scontrol", "update", f"NodeName={node}", *what], capture_output=True,
                   env={**os.environ, "SLURM_CONF": conf}, timeout=30, check=False)


def test_a_ranks_own_exception_is_the_jobs_error_not_the_nodes(
    tmp_path, slurm_conf: str  # type: ignore[no-untyped-def]
) -> None:
    d = start_daemon(tmp_path, slurm_conf)
    try:
        # Rank 1 raises at step 6; rank 0, waiting in the allreduce, sees the connection close.
        run_id = d.submit(train_spec(tmp_path, "ownerr", "--fail-at", "6", "--fail-rank", "1"))
        status = d.wait_run(run_id, ENDED, timeout=180)
        log = "\n".join(p.read_text() for p in (d.state_dir / "job-logs").glob("*.out"))
        assert "bad hyperparameters" in log and "Connection closed by peer" in log, log[-2000:]
        assert status["run"]["state"] == "FAILED", status["events"][-5:]
        [a1] = status["attempts"]
        [classified] = [e for e in status["events"] if e["kind"] == "attempt.classified"]
        assert classified["data"]["outcome"] == "JOB_ERROR", classified["data"]
        assert any("bad hyperparameters" in r for r in classified["data"]["reasons"])
        kinds = [e["kind"] for e in status["events"]]
        assert "node.failed" not in kinds and "node.suspect" not in kinds
        assert "recovery.waiting" not in kinds, "no settle wait for a code crash"
        for node in a1["nodes"]:
            assert "drain" not in _sinfo(slurm_conf, node)[0]
    finally:
        d.cleanup()


def _fail_node_under(d: DaemonHandle, conf: str, run_id: str, node: str) -> None:
    """Set ``node`` DOWN while the run's attempt runs on it (a node failure, at once)."""
    _scontrol(conf, node, "State=DOWN", "Reason=test-node-failure")
    wait_for(lambda: any(e["kind"] == "attempt.classified" for e in d.run(run_id)["events"]),
             120, f"{run_id}'s failure to be classified")


def test_black_hole_rule_counts_infra_only_and_respects_the_operator(
    tmp_path, slurm_conf: str  # type: ignore[no-untyped-def]
) -> None:
    extra = '[recovery]\nblackhole_failures = 2\nsettle = "5s"\n'
    d = start_daemon(tmp_path, slurm_conf, extra)
    victim = ""
    try:
        long = ("--steps", "400")
        run_a = d.submit(train_spec(tmp_path / "a", "runa", *long))
        a_nodes = d.wait_run(run_a, {"RUNNING"}, timeout=120)["attempts"][0]["nodes"]
        victim = a_nodes[-1]
        _fail_node_under(d, slurm_conf, run_a, victim)
        wait_for(lambda: _sinfo(slurm_conf, victim)[1].startswith("b300"), 60,
                 "the victim drained")
        d.wait_run(run_a, {"PENDING", "RUNNING"}, timeout=60)
        d.ctl("cancel", run_a)
        d.wait_run(run_a, ENDED, timeout=60)
        # The operator returns the node with scontrol; the daemon sees it in sinfo.
        _scontrol(slurm_conf, victim, "State=RESUME")
        wait_for(lambda: not _sinfo(slurm_conf, victim)[0].startswith(("drain", "down")), 60,
                 "the victim back")
        # Run B (all four nodes, so also the victim) loses the victim too: one drain, its reason.
        run_b = d.submit(train_spec(tmp_path / "b", "runb", *long, nodes=4))
        d.wait_run(run_b, {"RUNNING"}, timeout=120)
        _fail_node_under(d, slurm_conf, run_b, victim)
        wait_for(lambda: any(e["kind"] == "recovery.resubmit" for e in d.run(run_b)["events"]),
                 60, "run B's resubmission")
        state, reason = _sinfo(slurm_conf, victim)
        assert run_b in reason and "black hole" not in reason, (state, reason)
        d.ctl("cancel", run_b)
        d.wait_run(run_b, ENDED, timeout=60)
        # Returned with b300ctl this time; run C (one node: Slurm takes the first idle one,
        # not the victim) never runs there and fails of its own error.
        d.ctl("nodes", "resume", victim)
        wait_for(lambda: not _sinfo(slurm_conf, victim)[0].startswith(("drain", "down")), 60,
                 "the victim back")
        run_c = d.submit(train_spec(tmp_path / "c", "runc", "--fail-at", "3", nodes=1))
        d.wait_run(run_c, ENDED, timeout=180)
        c = d.run(run_c)
        assert victim not in c["attempts"][0]["nodes"]
        assert [e["data"]["outcome"] for e in c["events"] if e["kind"] == "attempt.classified"] \
            == ["JOB_ERROR"]
        drains = d.ctl("events", "--kind", "node.drained", "--node", victim)
        assert len(drains) == 2, drains
        assert all("black hole" not in str(e) for e in drains), drains
        [row] = [r for r in d.ctl("nodes") if r["node"] == victim]
        assert (row["failed"], row["drained"]) == (2, 2), row
        assert row["resumed"] >= 1
        assert "drain" not in _sinfo(slurm_conf, victim)[0]
    finally:
        d.cleanup()
        if victim:
            _scontrol(slurm_conf, victim, "State=RESUME", check=False)
