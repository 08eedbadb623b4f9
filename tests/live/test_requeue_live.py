"""Slurm's own requeue, handled level-triggered: a daemon killed right after it recorded
the requeue (before draining or excluding anything) does both after its restart, once.

A 2-node job submitted with ``requeue = true``; one of its nodes crashes and is set DOWN (Slurm ends
the job NODE_FAIL and requeues it itself: same job id, PENDING again). The daemon dies at
the crash point ``requeue_recorded`` (the tracker committed the requeue and its strikes;
nothing else happened); the restarted daemon drains the node and keeps the job off it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from b300.store import open_store
from helpers import CLUSTER, make_daemon, slurm_cmd, wait_for, write_spec

pytestmark = pytest.mark.slurm


def test_a_requeue_recorded_before_a_crash_is_drained_and_excluded_once(
        tmp_path: Path, slurm_conf: str, fresh_nodes: list[str]) -> None:
    d = make_daemon(tmp_path, slurm_conf)
    d.start({"B300_CRASH_AT": "requeue_recorded"})
    try:
        run_id = d.submit(write_spec(tmp_path / "rq.toml", "requeued", "srun sleep 600", nodes=2,
                                     requeue=True, time_limit="00:15:00"))
        first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
        wait_for(lambda: len(d.run(run_id)["attempts"][0]["nodes"]) == 2, 60, "the job's nodes")
        victim = d.run(run_id)["attempts"][0]["nodes"][1]
        fresh_nodes.append(victim)
        # The node crashes (slurmd and the job's processes killed) and is marked DOWN at once
        # (as a site's health check or the daemon's liveness would): Slurm requeues the job.
        subprocess.run(["bash", str(CLUSTER), "kill-node", victim], check=True, timeout=60,
                       capture_output=True)
        slurm_cmd(slurm_conf, "scontrol", "update", f"NodeName={victim}", "State=DOWN",
                  "Reason=test: requeue")
        assert d.proc is not None
        wait_for(lambda: d.proc is not None and d.proc.poll() is not None, 60,
                 "b300d to die right after recording the requeue")
        with open_store(d.database_url) as store:
            kinds = [e.kind for e in store.events(run_id=run_id)]
        assert "attempt.requeued" in kinds and "node.drained" not in kinds  # the crash window

        d.start()
        def drained_status() -> dict[str, Any] | None:
            s = d.run(run_id)
            return s if any(e["kind"] == "node.drained" for e in s["events"]) else None

        status = wait_for(drained_status, 60, "the drain after the restart")
        drained = [e for e in status["events"] if e["kind"] == "node.drained"]
        assert [e["node"] for e in drained] == [victim]
        assert "requeued by Slurm" in drained[0]["data"]["reason"]
        [requeued] = [e for e in status["events"] if e["kind"] == "attempt.requeued"]
        assert requeued["data"]["suspects"] == [victim] and requeued["data"]["job_id"] == first["job_id"]
        # Still the same Slurm job (no resubmission); kept off the node if it had not started yet.
        assert [a["job_id"] for a in status["attempts"]] == [first["job_id"]]
        excluded = [e for e in status["events"] if e["kind"] == "attempt.excluded"]
        assert len(excluded) <= 1
        if excluded:
            assert victim in excluded[0]["data"]["exclude"]
            shown = slurm_cmd(slurm_conf, "scontrol", "show", "job", str(first["job_id"]))
            assert f"ExcNodeList={victim}" in shown
        reason = slurm_cmd(slurm_conf, "sinfo", "-h", "-n", victim, "-o", "%E")
        assert reason.startswith("b300: run") and "requeued by Slurm" in reason
        # Several cycles later: still one drain, at most one exclusion.
        time.sleep(3)  # six poll cycles at 0.5 s
        again = d.run(run_id)["events"]
        assert len([e for e in again if e["kind"] == "node.drained"]) == 1
        assert len([e for e in again if e["kind"] == "attempt.excluded"]) == len(excluded)
    finally:
        d.cleanup()
