"""``[training] straggler_action = "drain"`` end to end: the real CPU workload (PyTorch,
gloo, 2 nodes) on the real cluster with rank 1 sleeping 0.3 s of its own work per step,
a real b300d.

The daemon finds the straggler, drains its node in Slurm with the evidence as the reason
(``node.drained`` with ``straggler``, once), and the run keeps training on it (a drain
never kills the job). When the attempt later fails of itself (a retryable exit), recovery
resubmits it from its newest checkpoint, the drained node is not blamed for the failure
(no ``node.failed`` strike) and Slurm places the next attempt elsewhere. Bounded waits
only; no duration is asserted.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import DaemonHandle, make_daemon, wait_for

pytestmark = pytest.mark.slurm
TRAIN = Path(__file__).resolve().parent.parent / "workload" / "train.py"


def _events(d: DaemonHandle, run_id: str, kind: str) -> list[dict[str, Any]]:
    from b300.store import open_store

    store = open_store(d.database_url)
    try:
        return [{"ts": e.ts.timestamp(), "node": e.node, "data": e.data, "attempt_id": e.attempt_id}
                for e in store.events(run_id=run_id, kinds=[kind])]
    finally:
        store.close()


def _node(slurm_conf: str, node: str) -> tuple[str, str]:
    out = subprocess.run(["sinfo", "--noheader", "--Node", "-n", node, "--format=%T|%E"], check=True,
                         capture_output=True, text=True, timeout=30,
                         env={**os.environ, "SLURM_CONF": slurm_conf}).stdout
    state, _, reason = out.splitlines()[0].partition("|")
    return state.strip(), reason.strip()


def _steps(path: Path) -> list[int]:
    try:
        return [json.loads(line)["step"] for line in path.read_text().splitlines()
                if line.strip() and '"step"' in line]
    except (OSError, ValueError):
        return []


def test_a_slow_host_is_drained_and_the_next_attempt_avoids_it(tmp_path: Path, slurm_conf: str) -> None:
    d = make_daemon(tmp_path, slurm_conf, poll_interval="1s")
    d.config.write_text(d.config.read_text() + (
        '[training]\nstraggler_action = "drain"\nstraggler_drain_every = "1h"\n'
        "[training.straggler]\nsteps = 5\n"))
    d.start()
    drained: str | None = None
    try:
        run_dir = tmp_path / "slow"
        (run_dir / "ckpt").mkdir(parents=True)
        progress = str(run_dir / "progress.{host}.jsonl")
        command = (f"srun {sys.executable} {TRAIN} --steps 200 --ckpt-every 10 --step-time 0.2 "
                   f"--progress-file {shlex.quote(progress)} --slow-rank 1 --slow-s 0.3 --slow-from 10 "
                   f"--fail-at 70 --fail-code 75")
        spec = tmp_path / "slow.toml"
        spec.write_text("\n".join([
            'name = "slow"', "[job]", f"command = {json.dumps(command)}", "nodes = 2",
            "ntasks_per_node = 1", "gpus_per_node = 8", 'time_limit = "00:15:00"',
            "[checkpoint]", f'dir = "{run_dir / "ckpt"}"', 'layout = "dcp"',
            "[retries]", "retryable_exit_codes = [75]",
            "[health]", f"progress_file = {json.dumps(progress)}",
        ]) + "\n")
        run_id = d.submit(spec)
        event = wait_for(lambda: _events(d, run_id, "node.drained"), 240, "the straggler drain", every=1.0)[0]
        drained = event["node"]
        first = d.run(run_id)["attempts"][0]
        assert drained == first["nodes"][1]  # rank 1 runs on the allocation's second node
        assert "straggler" in event["data"] and "5 steps in a row" in event["data"]["straggler"]
        finding = _events(d, run_id, "training.straggler")
        assert [f["node"] for f in finding] == [drained]
        state, reason = _node(slurm_conf, drained)
        assert "drain" in state.lower(), state
        assert reason.startswith(f"b300: straggler in run {run_id} job {first['job_id']}: {drained} took")
        print(f"drained {drained} ({state}): {reason}")
        # The job keeps training on the drained node: rank 1's file grows past the drain.
        host_file = Path(progress.replace("{host}", drained))
        at_drain = max(_steps(host_file), default=0)
        wait_for(lambda: max(_steps(host_file), default=0) >= at_drain + 5, 120,
                 "rank 1 to go on training after the drain", every=0.5)
        # The attempt fails of itself (exit 75 at step 70): resubmitted, elsewhere.
        second = wait_for(lambda: [a for a in d.run(run_id)["attempts"][1:] if a.get("nodes")], 240,
                          "the second attempt to get nodes", every=1.0)[0]
        assert drained not in second["nodes"], second
        outcome = _events(d, run_id, "attempt.classified")[0]["data"]["outcome"]
        print(f"attempt 1: {outcome} on {first['nodes']}; attempt 2 on {second['nodes']}, "
              f"resumed from {second['resume_from']}")
        assert outcome == "RETRYABLE_EXIT" and second["resume_from"]
        assert [e for e in _events(d, run_id, "node.failed") if e["node"] == drained] == []
        assert len(_events(d, run_id, "node.drained")) == 1
        d.wait_run(run_id, {"COMPLETED"}, timeout=300)
        # Attempt 2 straggled too (same slow rank): within straggler_drain_every, not drained.
        kept = _events(d, run_id, "training.straggler_kept")
        assert kept and "at most one per 1 h" in kept[0]["data"]["why"], kept
    finally:
        d.cleanup()
        if drained:
            subprocess.run(["scontrol", "update", f"nodename={drained}", "state=resume"], check=False,
                           env={**os.environ, "SLURM_CONF": slurm_conf},
                           timeout=30, capture_output=True)
