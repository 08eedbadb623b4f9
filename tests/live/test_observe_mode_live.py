"""``[daemon] mode``: a daemon left at its default (observe) acts on nothing of its own
accord, on the real cluster; what it would have done is recorded as ``action.withheld``.

The same failure that an acting daemon answers with a drain and a resubmission
(tests/live/test_recovery_live.py): here the node failure ends the run FAILED after
one attempt, the node keeps the reason the test gave it (the daemon drained nothing),
and the event log names the resubmission it held back.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import gated_command, make_daemon, slurm_cmd, wait_for, write_spec

pytestmark = pytest.mark.slurm


def _node_of(conf: str, job_id: int) -> str:
    return slurm_cmd(conf, "squeue", "--noheader", "--jobs", str(job_id), "--format=%N").strip()


def test_observe_mode_withholds_drain_and_resubmission(tmp_path: Path, slurm_conf: str) -> None:
    d = make_daemon(tmp_path, slurm_conf, mode="observe", poll_interval="1s")
    d.start()
    node = ""
    try:
        spec = write_spec(tmp_path / "spec.toml", "observed", gated_command(tmp_path / "gate"),
                          nodes=1, time_limit="00:10:00")
        run = d.submit(spec)
        status = d.wait_run(run, {"RUNNING"}, timeout=120)
        job_id = status["attempts"][-1]["job_id"]
        node = wait_for(lambda: _node_of(slurm_conf, job_id), 60, "the job's node")
        # A node failure as Slurm sees one: the node set DOWN ends the job NODE_FAIL.
        slurm_cmd(slurm_conf, "scontrol", "update", f"NodeName={node}", "State=DOWN",
                  "Reason=test: observe mode")
        ended = d.wait_run(run, {"FAILED", "COMPLETED", "CANCELLED"}, timeout=180)
        assert ended["run"]["state"] == "FAILED", ended
        assert len(ended["attempts"]) == 1, ended["attempts"]  # nothing resubmitted

        withheld = wait_for(lambda: d.ctl("events", "--run", run, "--kind", "action.withheld"),
                            30, "the withheld resubmission")
        assert [e["data"]["action"] for e in withheld] == ["resubmit"], withheld
        assert 'mode = "observe"' in withheld[0]["data"]["why"]
        # The daemon drained nothing (ReturnToService=2 may have returned the node by now,
        # so its reason is the test's own or none, never the daemon's).
        reason = slurm_cmd(slurm_conf, "sinfo", "--noheader", "-n", node, "-o", "%E").strip()
        assert reason in ("test: observe mode", "none"), reason
        state = slurm_cmd(slurm_conf, "sinfo", "--noheader", "-n", node, "-o", "%T").strip()
        assert "drain" not in state, state
        assert not d.ctl("events", "--kind", "node.drained", "--node", node)
        log = d.log.read_text()
        assert "mode.observe" in log and "action.withheld" in log
    finally:
        if node:  # unless ReturnToService=2 did already (then scontrol refuses: not DOWN)
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                           env={**os.environ, "SLURM_CONF": slurm_conf}, capture_output=True,
                           timeout=60, check=False)
        d.cleanup()
