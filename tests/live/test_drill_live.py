"""``b300ctl drill`` against a real b300d on the local Slurm cluster (issue 14).

A 2-node CPU training job (tests/workload/train.py, DCP checkpoints every 5 steps, a
progress file) is drilled: one of its nodes is set DOWN with a drill reason (or crashed
with ``localcluster.sh kill-node`` as the site's crash command); the daemon measures
until the run trains again from its newest checkpoint on other nodes, records
``drill.*`` events with the figures, and returns the node to service. Refusals: a node
not in the attempt, a run without a checkpoint, a run not running, a non-admin.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_node_loss_live as nl
from as_user import ctl_as
from test_node_loss_live import node_sshd, slow_cluster  # noqa: F401  (fixtures, shared)

from helpers import CLUSTER, DaemonHandle, cancel_test_jobs, make_daemon, slurm_cmd, wait_for, write_spec

pytestmark = pytest.mark.slurm
TRAIN = Path(__file__).resolve().parent.parent / "workload" / "train.py"
NOBODY = 65534


def _spec(tmp_path: Path, steps: int = 60) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "ckpt").mkdir(parents=True, exist_ok=True)
    command = f"srun {sys.executable} {TRAIN} --steps {steps} --ckpt-every 5 --step-time 0.4"
    spec = tmp_path / "drilled.toml"
    spec.write_text("\n".join([
        'name = "drilled"', "[job]", f"command = {json.dumps(command)}", "nodes = 2",
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


def _checkpointed(tmp_path: Path) -> bool:
    return any((p / ".metadata").exists() for p in (tmp_path / "run" / "ckpt").glob("step_*"))


def _node_state(conf: str, node: str) -> str:
    return slurm_cmd(conf, "sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T").strip()


def _daemon(tmp_path: Path, slurm_conf: str, drill: str = "") -> DaemonHandle:
    d = make_daemon(tmp_path, slurm_conf, poll_interval="1s")
    if drill:
        with d.config.open("a") as f:
            f.write(drill)
    d.start()
    return d


def _refused(proc: subprocess.CompletedProcess[str], words: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and words in lines[0], proc.stderr


def _drill_events(d: DaemonHandle, run_id: str) -> list[dict[str, Any]]:
    return [e for e in d.ctl("events", "--run", run_id) if e["kind"].startswith("drill.")]


def _drill_and_check(tmp_path: Path, d: DaemonHandle, slurm_conf: str, method: str) -> None:
    run_id = d.submit(_spec(tmp_path))
    first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
    wait_for(lambda: _checkpointed(tmp_path) and _progress(tmp_path) >= 7, 120, "a checkpoint and step 7")
    outside = next(n for n in ("gpu01", "gpu02", "gpu03", "gpu04") if n not in first["nodes"])
    _refused(d.ctl_raw("drill", run_id, "--node", outside), f"node {outside} is not in run {run_id}")
    victim = first["nodes"][1]
    assert _node_state(slurm_conf, victim) in ("allocated", "mixed")
    proc = d.ctl_raw("--json", "drill", run_id, "--node", victim, "--method", method,
                     "--timeout", "4m", timeout=400)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    record = json.loads(proc.stdout)
    started, finished = record["started"], record["finished"]
    assert started["node"] == victim and started["method"] == method and started["node_was_healthy"]
    assert finished["outcome"] == "trained again" and finished["returned"] == "resumed", finished
    # Every milestone was reached, in order.
    order = ["detect_s", "excluded_s", "resubmit_s", "allocation_s", "training_s"]
    figures = [finished[k] for k in order]
    assert all(isinstance(f, int | float) for f in figures), finished
    assert figures == sorted(figures), finished
    assert finished["new_attempt"] == 2 and finished["resume_step"] >= 5
    assert finished["trained_step"] > finished["resume_step"]
    assert finished["last_step"] >= started["step_at_failure"]
    assert finished["steps_lost"] == max(0, finished["last_step"] - finished["resume_step"])
    # The record is in the store: the events b300ctl shows, with the same figures.
    kinds = [e["kind"] for e in _drill_events(d, run_id)]
    assert kinds == ["drill.started", "drill.injected", "drill.finished"], kinds
    status = d.run(run_id)
    a2 = status["attempts"][1]
    assert victim in a2["excluded_nodes"] and victim not in a2["nodes"]
    assert a2["resume_from"].endswith(f"step_{finished['resume_step']:06d}")
    history = [json.loads(x) for x in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert history[-1]["attempt"] == 2 and history[-1]["start_step"] == finished["resume_step"]
    # The node was healthy before: it is back in service.
    wait_for(lambda: _node_state(slurm_conf, victim) in ("idle", "allocated", "mixed"), 60,
             f"{victim} back in service")
    done = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
    assert done["run"]["state"] == "COMPLETED", done["events"][-6:]


def test_a_drill_down_measures_the_recovery_and_the_run_trains_again(tmp_path: Path, slurm_conf: str) -> None:
    d = _daemon(tmp_path, slurm_conf)
    try:
        _drill_and_check(tmp_path, d, slurm_conf, "down")
    finally:
        d.cleanup()


def test_a_drill_crash_runs_the_site_command(tmp_path: Path, slurm_conf: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("localcluster.sh kill-node needs root")
    script = json.dumps(str(CLUSTER))
    d = _daemon(tmp_path, slurm_conf, (
        f'[drill]\ncrash_command = ["/bin/bash", {script}, "kill-node", "{{node}}"]\n'
        f'restore_command = ["/bin/bash", {script}, "restart-node", "{{node}}"]\n'))
    try:
        _drill_and_check(tmp_path, d, slurm_conf, "crash")
    finally:
        d.cleanup()


def test_refused_without_a_checkpoint_or_when_not_running(tmp_path: Path, slurm_conf: str) -> None:
    d = _daemon(tmp_path, slurm_conf)
    try:
        _refused(d.ctl_raw("drill", "r-nosuch"), "r-nosuch")
        run_dir = tmp_path / "bare"
        run_dir.mkdir()
        spec = write_spec(tmp_path / "bare.toml", "bare", "sleep 300", nodes=2)
        with spec.open("a") as f:
            f.write(f'[checkpoint]\ndir = "{run_dir / "ckpt"}"\nlayout = "dcp"\n'
                    f'[health]\nprogress_file = "{run_dir / "progress.json"}"\n')
        (run_dir / "ckpt").mkdir()
        run_id = d.submit(spec)
        d.wait_run(run_id, {"RUNNING"}, timeout=120)
        _refused(d.ctl_raw("drill", run_id), "has no verified checkpoint")
        d.ctl("cancel", run_id)
        d.wait_run(run_id, {"CANCELLED"}, timeout=120)
        _refused(d.ctl_raw("drill", run_id), "is not running")
        assert not _drill_events(d, run_id)
        _refused(d.ctl_raw("drill", run_id, "--timeout", "2h"), "--timeout must be between")
    finally:
        d.cleanup()


@pytest.fixture
def shared(tmp_path: Path, slurm_conf: str) -> Iterator[tuple[DaemonHandle, Path, str]]:
    """A b300d whose socket and config user nobody can reach (the daemon itself must refuse)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as user nobody")
    top = Path(tempfile.mkdtemp(prefix="b300-drill-"))
    top.chmod(0o755)
    sock = top / "b300d.sock"
    d = make_daemon(tmp_path, slurm_conf, socket=str(sock))
    cfg = top / "b300.toml"
    try:
        d.start(wait=False)
        wait_for(sock.exists, 60, "the daemon's socket")
        shutil.copy(d.config, cfg)
        cfg.chmod(0o644)
        sock.chmod(0o666)
        yield d, cfg, str(sock)
    finally:
        d.cleanup()
        shutil.rmtree(top, ignore_errors=True)


def test_a_non_admin_is_refused(shared: tuple[DaemonHandle, Path, str], tmp_path: Path) -> None:
    d, cfg, _sock = shared
    run_id = d.submit(write_spec(tmp_path / "job.toml", "drill-nobody", "sleep 300"))
    proc = ctl_as(NOBODY, NOBODY, (), "--config", str(cfg), "drill", run_id)  # from any clone
    _refused(proc, "user nobody may not drill")
    refusals = [json.loads(line) for line in d.log.read_text().splitlines() if '"control.refused"' in line]
    assert [r["op"] for r in refusals] == ["drill"] and refusals[0]["uid"] == NOBODY
    assert not [e for e in d.ctl("events") if e["kind"].startswith("drill.")]
    cancel_test_jobs(d.slurm_conf, d)
    d.kill(signal.SIGTERM)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "crashed"])
def test_the_drill_outlives_its_client_and_a_daemon_restart(tmp_path: Path, slurm_conf: str,
                                                            stop: signal.Signals) -> None:
    """The daemon owns the drill: b300ctl killed once it started, then b300d stopped (or
    killed -9) and started again in the middle of the recovery; the record is still
    finished with every figure. (The SIGTERM right after the drill's start was lost by
    the daemon 3 times in 4 before its main thread waited in bounded steps.)"""
    d = _daemon(tmp_path, slurm_conf)
    try:
        run_id = d.submit(_spec(tmp_path))
        d.wait_run(run_id, {"RUNNING"}, timeout=120)
        wait_for(lambda: _checkpointed(tmp_path) and _progress(tmp_path) >= 7, 120, "a checkpoint and step 7")
        with subprocess.Popen([sys.executable, "-m", "b300.ctl", "--config", str(d.config), "drill", run_id,
                               "--timeout", "4m"], stdout=subprocess.PIPE, text=True, env=d.env) as ctl:
            try:
                assert ctl.stdout is not None
                first = ctl.stdout.readline()
            finally:
                ctl.kill()
        assert first.startswith("drill ") and f"run {run_id}" in first, first
        d.kill(stop)   # waits at most 30 s for it to end
        d.start()
        finished = wait_for(lambda: [e for e in _drill_events(d, run_id) if e["kind"] == "drill.finished"],
                            240, "the drill finished by the restarted daemon")[0]["data"]
        assert finished["outcome"] == "trained again", finished
        assert all(isinstance(finished[k], int | float) for k in
                   ("detect_s", "excluded_s", "resubmit_s", "allocation_s", "training_s", "steps_lost"))
        assert finished["returned"] == "resumed"
        assert '"drill.resumed_watching"' in d.log.read_text()
    finally:
        d.cleanup()



def test_a_crash_drill_with_active_detection_beats_slurm(
        tmp_path: Path, slow_cluster: nl.SlowCluster, node_sshd: nl.Sim) -> None:  # noqa: F811
    """Slurm's default SlurmdTimeout=300 and the daemon's own checks ([liveness], confirmed
    over each node's sshd; the cluster and sshds of test_node_loss_live): the crash
    (slurmd killed, the job's processes frozen, the node's sshd stopped: a node powered
    off) is found by the daemon, and the run trains again before Slurm marks the node down."""
    if os.geteuid() != 0:
        pytest.skip("localcluster.sh freeze-node needs root")
    crash = tmp_path / "crash.sh"
    crash.write_text("#!/bin/bash\nset -eu\n"
                     f"bash {CLUSTER} freeze-node \"$1\"\n"
                     f"kill -TERM \"$(cat {node_sshd.base}/\"$1\"/sshd.pid)\"\n")
    d = nl._daemon(tmp_path, slow_cluster, node_sshd)
    victim = ""
    try:
        d.kill(signal.SIGTERM)
        with d.config.open("a") as f:
            f.write(f'[drill]\ncrash_command = ["/bin/bash", {json.dumps(str(crash))}, "{{node}}"]\n')
        d.start()
        run_id = d.submit(_spec(tmp_path))
        first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
        wait_for(lambda: _checkpointed(tmp_path) and _progress(tmp_path) >= 7, 120, "a checkpoint and step 7")
        victim = first["nodes"][1]
        proc = d.ctl_raw("--json", "drill", run_id, "--node", victim, "--method", "crash",
                         "--timeout", "4m", timeout=400)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        finished = json.loads(proc.stdout)["finished"]
        assert finished["outcome"] == "trained again", finished
        assert finished["detected_by"] == "liveness.dead", finished
        order = [finished[k] for k in ("detect_s", "excluded_s", "resubmit_s", "allocation_s", "training_s")]
        assert order == sorted(order), finished
        history = [json.loads(x) for x in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
        assert history[-1]["attempt"] == 2 and history[-1]["start_step"] == finished["resume_step"]
        # Slurm (SlurmdTimeout=300) never marked the node down by itself: the daemon's
        # drain reason is the one on it, set before Slurm's own "Not responding".
        drained = [e for e in d.ctl("events", "--node", victim) if e["kind"] == "node.drained"]
        assert drained and "node dead (b300d checks)" in drained[0]["data"]["reason"], drained
        print(f"\ncrash drill with active detection (SlurmdTimeout=300): {json.dumps(finished)}")
    finally:
        d.kill(signal.SIGTERM)
        cancel_test_jobs(slow_cluster.conf, d)
        if victim:   # the drill resumed it in Slurm; its slurmd, processes and sshd come back here
            slow_cluster.cmd("kill-node", victim)
            slow_cluster.cmd("revive", victim)
            nl.dn.stop([node_sshd.nodes[victim]])   # reaps the sshd the crash stopped
            nl.dn.start([node_sshd.nodes[victim]])
