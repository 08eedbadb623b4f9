"""Active failure detection in the real daemon (issue 14): a node lost under a running
2-node training job is found by b300d's own checks, drained, set DOWN and the run
resumed from its newest checkpoint on other nodes, before Slurm marks the node down.

This module runs its own cluster with Slurm's default ``SlurmdTimeout=300`` (so the
daemon cannot be helped by Slurm noticing first) and a real sshd per node (the local
cluster's nodes share one host, so each gets an sshd of its own, as on a real
cluster each node runs one); the daemon confirms a suspect over SSH with host keys
checked. A lost node is "powered off": its slurmd killed and the job's processes on it
stopped where they are (``localcluster.sh freeze-node``), so no socket closes and the
surviving rank waits in its collective, and its sshd stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers import CLUSTER, DaemonHandle, cancel_test_jobs, make_daemon, slurm_cmd, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drift"))
import drift_nodes as dn
from drift_nodes import Sim

pytestmark = pytest.mark.slurm
TRAIN = Path(__file__).resolve().parent.parent / "workload" / "train.py"
NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
SSH_BASE = int(os.environ.get("B300_SSHD_PORT_BASE", "22201")) + 60


@dataclass
class SlowCluster:
    """A cluster of its own, SlurmdTimeout=300; ``cmd`` runs localcluster.sh against it."""

    conf: str
    env: dict[str, str]

    def cmd(self, *args: str) -> str:
        proc = subprocess.run(["bash", str(CLUSTER), *args], env=self.env, capture_output=True,
                              text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout


@pytest.fixture(scope="module")
def slow_cluster() -> Iterator[SlowCluster]:
    base_dir = os.environ.get("B300_CLUSTER_DIR", "/var/tmp/b300-cluster")
    name = os.environ.get("B300_CLUSTER_NAME", "b300local")[:26] + "slow"
    port = int(os.environ.get("B300_PORT_BASE", "16800")) + 600
    env = {**os.environ, "B300_CLUSTER_DIR": f"{base_dir}-slow", "B300_CLUSTER_NAME": name,
           "B300_PORT_BASE": str(port), "B300_SLURMD_TIMEOUT": "300"}
    env.pop("SLURM_CONF", None)
    cluster = SlowCluster("", env)
    out = cluster.cmd("up")
    conf = next(line.split("=", 1)[1].strip("'\"") for line in out.splitlines()
                if line.startswith("export SLURM_CONF="))
    cluster.conf = conf
    try:
        yield cluster
    finally:
        subprocess.run(["bash", str(CLUSTER), "down"], env=env, capture_output=True, timeout=300,
                       check=False)


@pytest.fixture(scope="module")
def node_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    versions = {n: dn.Versions() for n in NODES}
    with dn.fleet(tmp_path_factory.mktemp("node-loss-sshd"), versions, SSH_BASE) as fleet:
        yield fleet


def _daemon(tmp_path: Path, cluster: SlowCluster, sim: Sim) -> DaemonHandle:
    d = make_daemon(tmp_path, cluster.conf, poll_interval="1s")
    with d.config.open("a") as f:
        f.write(dn.drift_section(sim) + "[liveness]\nenabled = true\nprimary = 'connect'\nconfirm = 'ssh'\n")
    d.env = {**cluster.env, "SLURM_CONF": cluster.conf}
    d.start()
    return d


def _spec(tmp_path: Path, steps: int = 40) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "ckpt").mkdir(parents=True, exist_ok=True)
    command = (f"srun {sys.executable} {TRAIN} --steps {steps} --ckpt-every 5 --step-time 0.4")
    spec = tmp_path / "lost.toml"
    spec.write_text("\n".join([
        'name = "lost"', "[job]", f"command = {json.dumps(command)}", "nodes = 2",
        "ntasks_per_node = 1", "gpus_per_node = 8", 'time_limit = "00:15:00"',
        "[checkpoint]", f'dir = "{run_dir / "ckpt"}"', 'layout = "dcp"',
        "[health]", f'progress_file = "{run_dir / "progress.json"}"', 'hang_timeout = "30m"',
        "[retries]", "infra = 3",
    ]) + "\n")
    return spec


def _progress(tmp_path: Path) -> int:
    try:
        return int(json.loads((tmp_path / "run" / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def _node(conf: str, node: str) -> tuple[str, str]:
    out = slurm_cmd(conf, "sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T|%E")
    state, reason = out.strip().splitlines()[0].split("|", 1)
    return state, reason


def _events(d: DaemonHandle, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in d.run(run_id)["events"] if e["kind"] == kind]


def _bring_back(cluster: SlowCluster, sim: Sim, node: str) -> None:
    cluster.cmd("kill-node", node)     # the frozen processes (SIGKILL ends stopped ones)
    cluster.cmd("revive", node)
    dn.start([sim.nodes[node]])


def test_a_lost_node_is_drained_and_the_run_resumed_before_slurm_notices(
        tmp_path: Path, slow_cluster: SlowCluster, node_sshd: Sim) -> None:
    d = _daemon(tmp_path, slow_cluster, node_sshd)
    victim = ""
    try:
        run_id = d.submit(_spec(tmp_path))
        first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
        wait_for(lambda: _progress(tmp_path) >= 12, 120, "training to pass step 12")
        victim = first["nodes"][1]
        lost_at = time.monotonic()
        slow_cluster.cmd("freeze-node", victim)
        dn.stop([node_sshd.nodes[victim]])
        wait_for(lambda: len(d.run(run_id)["attempts"]) >= 2, 120, "a second attempt")
        resubmitted_after = time.monotonic() - lost_at
        # Slurm (SlurmdTimeout=300) has not marked the node down by itself: the daemon did.
        state, reason = _node(slow_cluster.conf, victim)
        assert "drain" in state and "node dead (b300d checks)" in reason, (state, reason)
        assert resubmitted_after < 240, resubmitted_after   # far inside Slurm's 300 s
        [lost] = _events(d, run_id, "attempt.node_lost")
        assert lost["data"]["nodes"] == [victim] and "refused" in lost["data"]["evidence"]
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        assert status["run"]["state"] == "COMPLETED", status["events"][-6:]
        a1, a2 = status["attempts"]
        assert a1["state"] in ("NODE_FAIL", "CANCELLED"), a1
        classified = next(e for e in status["events"] if e["kind"] == "attempt.classified")
        assert classified["data"]["outcome"] == "INFRA" and victim in classified["data"]["suspects"]
        assert victim in a2["excluded_nodes"] and victim not in a2["nodes"]
        step = int(Path(a2["resume_from"]).name.split("_")[1])
        assert step >= 10
        history = [json.loads(x) for x in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
        assert history[-1]["attempt"] == 2 and history[-1]["start_step"] == step
    finally:
        d.kill(signal.SIGTERM)
        cancel_test_jobs(slow_cluster.conf, d)
        if victim:
            _bring_back(slow_cluster, node_sshd, victim)


def _slurmd_pid(cluster: SlowCluster, node: str) -> int:
    return int((Path(cluster.env["B300_CLUSTER_DIR"]) / "run" / f"slurmd-{node}.pid").read_text())


def test_no_false_alarm_for_a_frozen_slurmd_or_a_lost_check_path(
        tmp_path: Path, slow_cluster: SlowCluster, node_sshd: Sim) -> None:
    """A slurmd frozen for a moment (SIGSTOP, shorter than the N misses): nothing. Then the
    check path alone lost (the node's slurmd killed, the node itself and its job alive):
    suspect, cleared by the SSH confirmation, never drained, the run never cancelled."""
    d = _daemon(tmp_path, slow_cluster, node_sshd)
    victim = ""
    try:
        run_id = d.submit(_spec(tmp_path, steps=60))
        first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
        wait_for(lambda: _progress(tmp_path) >= 3, 120, "training to start")
        victim = first["nodes"][1]
        pid = _slurmd_pid(slow_cluster, victim)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(2.0)   # the fault's length (less than 3 misses at 1 s), not a wait
        finally:
            os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)  # only the check path: the job and sshd go on
        wait_for(lambda: any(e["kind"] == "liveness.cleared" and e["node"] == victim
                             for e in d.ctl("events", "--kind", "liveness.")),
                 60, "the suspect node cleared by SSH")
        slow_cluster.cmd("restart-node", victim)
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        assert status["run"]["state"] == "COMPLETED", status["events"][-6:]
        assert len(status["attempts"]) == 1
        kinds = {e["kind"] for e in status["events"]}
        assert "attempt.node_lost" not in kinds and "node.drained" not in kinds, kinds
        assert not [e for e in d.ctl("events", "--kind", "liveness.") if e["kind"] == "liveness.dead"]
        state, _ = _node(slow_cluster.conf, victim)
        assert "drain" not in state and "down" not in state, state
        victim = ""
    finally:
        d.kill(signal.SIGTERM)
        cancel_test_jobs(slow_cluster.conf, d)
        if victim:
            _bring_back(slow_cluster, node_sshd, victim)
