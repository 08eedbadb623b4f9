"""In-allocation restart (issue 15, the fast path), end to end on the local cluster.

A real 2-node PyTorch run with ``spare_nodes = 1`` (one job of 3 nodes, ``--no-kill``)
loses a node (its slurmd and job processes killed, its sshd stopped); the daemon's
liveness checks confirm it dead, and the run trains again on the spare in the same Slurm
job, in a new step, from the newest checkpoint, while the other nodes are busy with jobs
of another user (one running, one waiting behind it). A background sampler of
the training processes checks that never more than one training step of the run ran.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from ClusterShell.NodeSet import NodeSet

from helpers import CLUSTER, DaemonHandle, make_daemon, slurm_cmd, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drift"))
import drift_nodes as dn
from drift_nodes import Sim

pytestmark = pytest.mark.slurm
TRAIN = Path(__file__).resolve().parent.parent / "workload" / "train.py"
NODES = [f"gpu{i:02d}" for i in range(1, 7)]
SSH_BASE = int(os.environ.get("B300_SSHD_PORT_BASE", "22201")) + 70
STEPS = 40
OTHER_USER = "nobody"
# The cluster of this module: six nodes of its own (the suite's cluster has four), set by
# the ``six_nodes`` fixture; localcluster.sh kill-node/restart-node run with its env.
_CLUSTER_ENV: dict[str, str] = {}


@pytest.fixture(scope="module")
def six_nodes() -> Iterator[str]:
    """A 6-node cluster of its own (dir, name and ports beside the suite's); its SLURM_CONF."""
    base_dir = os.environ.get("B300_CLUSTER_DIR", "/var/tmp/b300-cluster")
    name = os.environ.get("B300_CLUSTER_NAME", "b300local")[:25] + "spare"
    port = int(os.environ.get("B300_PORT_BASE", "16800")) + 700
    env = {**os.environ, "B300_CLUSTER_DIR": f"{base_dir}-spares6", "B300_CLUSTER_NAME": name,
           "B300_PORT_BASE": str(port), "B300_NODES": "6"}
    env.pop("SLURM_CONF", None)
    proc = subprocess.run(["bash", str(CLUSTER), "up"], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    conf = next(line.split("=", 1)[1].strip("'\"") for line in proc.stdout.splitlines()
                if line.startswith("export SLURM_CONF="))
    _CLUSTER_ENV.clear()
    _CLUSTER_ENV.update(env)
    try:
        yield conf
    finally:
        subprocess.run(["bash", str(CLUSTER), "down"], env=env, capture_output=True, timeout=300,
                       check=False)
        _CLUSTER_ENV.clear()


@pytest.fixture
def slurm_conf(six_nodes: str) -> str:
    """This module's tests run on the 6-node cluster."""
    return six_nodes


@pytest.fixture(scope="module")
def node_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    versions = {n: dn.Versions() for n in NODES}
    with dn.fleet(tmp_path_factory.mktemp("spares-sshd"), versions, SSH_BASE) as fleet:
        yield fleet


def _daemon(tmp_path: Path, conf: str, sim: Sim) -> DaemonHandle:
    d = make_daemon(tmp_path, conf, poll_interval="1s")
    with d.config.open("a") as f:
        f.write(dn.drift_section(sim) + "[liveness]\nenabled = true\nprimary = 'connect'\nconfirm = 'ssh'\n")
    return d


def _spec(tmp_path: Path, *train_args: str, infra: int = 3) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "ckpt").mkdir(parents=True, exist_ok=True)
    # With spare_nodes the command is what each task runs: the launcher adds the srun.
    command = (f"{sys.executable} {TRAIN} --steps {STEPS} --ckpt-every 5 --step-time 0.4 "
               f"{' '.join(train_args)}")
    spec = tmp_path / "spare.toml"
    spec.write_text("\n".join([
        'name = "spare"', "[job]", f"command = {json.dumps(command)}", "nodes = 2",
        "spare_nodes = 1", "ntasks_per_node = 1", "gpus_per_node = 8", 'time_limit = "00:15:00"',
        "[checkpoint]", f'dir = "{run_dir / "ckpt"}"', 'layout = "dcp"',
        "[health]", f'progress_file = "{run_dir / "progress.json"}"', 'hang_timeout = "30m"',
        "[retries]", f"infra = {infra}",
    ]) + "\n")
    return spec


class TrainingCounter:
    """Samples the training processes of one run (every node is on this machine): the most
    steps with live ranks at once, the most ranks at once, and the step ids seen. (Slurm's
    own list can keep a step that has no process left: see b300.launcher.stale_step.)"""

    def __init__(self, marker: str) -> None:
        self.marker, self.most_steps, self.most_ranks, self.seen = marker, 0, 0, set[str]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> list[str]:
        steps = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if str(TRAIN).encode() not in cmd:   # the rank itself, not the bash -c around it
                    continue
                env = dict(kv.split(b"=", 1) for kv in
                           Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            if self.marker.encode() in env.get(b"B300_CHECKPOINT_DIR", b""):
                steps.append(f"{env.get(b'SLURM_JOB_ID', b'?').decode()}."
                             f"{env[b'SLURM_STEP_ID'].decode()}")
        return steps

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            ranks = self._sample()
            self.seen.update(ranks)
            self.most_steps = max(self.most_steps, len(set(ranks)))
            self.most_ranks = max(self.most_ranks, len(ranks))

    def __enter__(self) -> TrainingCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def _other_user(conf: str, *args: str) -> int:
    """sbatch as another user (the cluster's other tenants)."""
    env = {"SLURM_CONF": conf, "PATH": os.environ["PATH"]}
    out = subprocess.run(["runuser", "-u", OTHER_USER, "--", "sbatch", "--parsable",
                          "--output=/dev/null", "--exclusive", *args], capture_output=True,
                         text=True, timeout=60, check=True, env=env, cwd="/tmp")
    return int(out.stdout.strip().split(";")[0])


@pytest.fixture
def busy(slurm_conf: str) -> Iterator[list[int]]:
    jobs: list[int] = []
    yield jobs
    if jobs:
        slurm_cmd(slurm_conf, "scancel", *map(str, jobs))


@pytest.fixture
def killed(slurm_conf: str, node_sshd: Sim) -> Iterator[list[str]]:
    nodes: list[str] = []
    yield nodes
    for node in nodes:
        subprocess.run(["bash", str(CLUSTER), "revive", node], capture_output=True,
                       timeout=120, check=False, env=_CLUSTER_ENV or None)
        dn.start([node_sshd.nodes[node]])


def _progress(tmp_path: Path) -> int:
    try:
        return int(json.loads((tmp_path / "run" / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def _history(tmp_path: Path) -> list[dict[str, Any]]:
    try:
        lines = (tmp_path / "run" / "history.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines]


def _events(status: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in status["events"] if e["kind"] == kind]


def _lose(conf: str, sim: Sim, node: str, killed: list[str]) -> float:
    killed.append(node)
    subprocess.run(["bash", str(CLUSTER), "kill-node", node], check=True, timeout=60,
                   capture_output=True, env=_CLUSTER_ENV or None)
    dn.stop([sim.nodes[node]])
    return time.time()


def _fill_the_rest(conf: str, run_nodes: list[str], busy: list[int]) -> None:
    """Every node outside the run's job busy with another user's job, one more waiting."""
    others = [n for n in NODES if n not in run_nodes]
    busy.append(_other_user(conf, f"--nodes={len(others)}", f"--nodelist={','.join(others)}",
                            "--wrap", "sleep 900"))
    busy.append(_other_user(conf, "--nodes=2", "--wrap", "sleep 60"))
    wait_for(lambda: slurm_cmd(conf, "squeue", "--noheader", f"--jobs={busy[0]}",
                               "--format=%T").strip() == "RUNNING", 60, "the other user's job")


def _start_run(d: DaemonHandle, tmp_path: Path, conf: str, busy: list[int],
               *train_args: str) -> tuple[str, dict[str, Any]]:
    run_id = d.submit(_spec(tmp_path, *train_args))
    status = d.wait_run(run_id, {"RUNNING"}, timeout=120)
    first = status["attempts"][0]
    assert len(first["nodes"]) == 3, first
    _fill_the_rest(conf, first["nodes"], busy)
    return run_id, first


def test_a_lost_node_trains_again_on_the_spare_in_the_same_job(
        tmp_path: Path, slurm_conf: str, node_sshd: Sim, busy: list[int], killed: list[str]) -> None:
    d = _daemon(tmp_path, slurm_conf, node_sshd)
    d.start()
    try:
        with TrainingCounter(str(tmp_path)) as counter:
            gate = tmp_path / "go"   # generation 0 waits after step 12: the node dies in training
            run_id, first = _start_run(d, tmp_path, slurm_conf, busy,
                                       "--pause-at", "12", "--gate", str(gate))
            wait_for(lambda: _progress(tmp_path) >= 12, 120, "training to pass step 12")
            step_nodes = _history(tmp_path)[0]["step_nodes"]
            batch_host = first["nodes"][0]
            # A node of the step that is not the batch host (its loss would end the job).
            victim = next(n for n in NodeSet(step_nodes) if n != batch_host)
            lost_at = _lose(slurm_conf, node_sshd, victim, killed)
            gate.touch()
            wait_for(lambda: len(_history(tmp_path)) >= 2, 150, "a second step to start training")
            status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        assert status["run"]["state"] == "COMPLETED", status["events"][-6:]
        [attempt] = status["attempts"]             # no new job: the same one
        assert attempt["job_id"] == first["job_id"]
        assert (counter.most_steps, counter.most_ranks) == (1, 2), vars(counter)
        assert counter.seen == {f"{first['job_id']}.0", f"{first['job_id']}.1"}, counter.seen
        [relaunch] = _events(status, "attempt.step_relaunch")
        assert relaunch["data"]["generation"] == 1 and relaunch["data"]["exclude"] == [victim]
        assert relaunch["data"]["suspects"] == [victim] and relaunch["data"]["spares_left"] == 0
        [started] = _events(status, "attempt.step_started")
        assert victim not in started["data"]["nodes"] and len(started["data"]["nodes"]) == 2
        assert [e["data"]["nodes"] for e in _events(status, "attempt.node_lost")] == [[victim]]
        for kind in ("node.drained", "node.failed"):   # as a resubmission records them
            assert [e["node"] for e in d.ctl("events", "--kind", kind, "--run", run_id)] == [victim]
        assert not _events(status, "recovery.resubmit")
        g0, g1 = _history(tmp_path)
        assert g0["job_id"] == g1["job_id"] == first["job_id"]
        assert (g0["generation"], g1["generation"]) == (0, 1) and g1["step_id"] > g0["step_id"]
        resume = relaunch["data"]["resume_from"]
        step = int(Path(resume).name.split("_")[1])
        assert g1["resume_from"] == resume and g1["start_step"] == step >= 10
        assert victim not in g1["step_nodes"]
        done = json.loads((tmp_path / "run" / "done.json").read_text())
        assert done == {"step": STEPS, "attempt": 1, "job_id": first["job_id"]}
        # The other user's jobs were never needed nor touched.
        out = slurm_cmd(slurm_conf, "squeue", "--noheader", f"--jobs={busy[0]}", "--format=%T")
        assert out.strip() == "RUNNING"
        confirmed = datetime.fromisoformat(relaunch["ts"]).timestamp()
        [status_file] = (tmp_path / "state" / "job-logs" / "launch").glob("*/status.json")
        final = json.loads(status_file.read_text())
        assert (final["generation"], final["state"], final["exit_code"]) == (1, "ended", 0)
        print(f"\nspare relaunch: node killed -> confirmed dead {confirmed - lost_at:.1f} s; "
              f"confirmed dead -> new step listed by Slurm {final['started_at'] - confirmed:.1f} s; "
              f"-> training again (checkpoint loaded) {g1['time'] - confirmed:.1f} s")
    finally:
        d.cleanup()


def test_daemon_killed_mid_relaunch_ends_with_one_training_step(
        tmp_path: Path, slurm_conf: str, node_sshd: Sim, busy: list[int], killed: list[str]) -> None:
    """b300d dies (SIGKILL) right after recording the relaunch, before the plan is on disk.
    Restarted, it writes the plan from its record; the launcher relaunches once."""
    d = _daemon(tmp_path, slurm_conf, node_sshd)
    d.start(extra_env={"B300_CRASH_AT": "relaunch_recorded"})
    try:
        with TrainingCounter(str(tmp_path)) as counter:
            gate = tmp_path / "go"
            run_id, first = _start_run(d, tmp_path, slurm_conf, busy,
                                       "--pause-at", "8", "--gate", str(gate))
            wait_for(lambda: _progress(tmp_path) >= 8, 120, "training to pass step 8")
            victim = next(n for n in NodeSet(_history(tmp_path)[0]["step_nodes"])
                          if n != first["nodes"][0])
            _lose(slurm_conf, node_sshd, victim, killed)
            gate.touch()
            wait_for(lambda: d.proc is not None and d.proc.poll() is not None, 120,
                     "b300d to die right after recording the relaunch")
            assert d.proc is not None and d.proc.returncode == -signal.SIGKILL
            d.start()
            status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        assert status["run"]["state"] == "COMPLETED", status["events"][-6:]
        [attempt] = status["attempts"]
        assert attempt["job_id"] == first["job_id"]
        assert (counter.most_steps, counter.most_ranks) == (1, 2), vars(counter)
        assert counter.seen == {f"{first['job_id']}.0", f"{first['job_id']}.1"}, counter.seen
        [relaunch] = _events(status, "attempt.step_relaunch")   # recorded once, across the crash
        assert relaunch["data"]["generation"] == 1
        history = _history(tmp_path)
        assert [h["generation"] for h in history] == [0, 1]
        assert history[1]["start_step"] == int(Path(relaunch["data"]["resume_from"]).name.split("_")[1])
        assert json.loads((tmp_path / "run" / "done.json").read_text())["job_id"] == first["job_id"]
    finally:
        d.cleanup()


def test_with_no_spare_left_the_run_resumes_in_a_new_job(
        tmp_path: Path, slurm_conf: str, node_sshd: Sim, killed: list[str]) -> None:
    """The first lost node takes the spare; the second leaves fewer healthy nodes than the
    step needs: today's path (the job cancelled, a new one from the newest checkpoint)."""
    d = _daemon(tmp_path, slurm_conf, node_sshd)
    d.start()
    try:
        gate = tmp_path / "go"
        run_id = d.submit(_spec(tmp_path, "--pause-at", "8", "--gate", str(gate)))
        first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
        wait_for(lambda: _progress(tmp_path) >= 8, 120, "training to pass step 8")
        batch_host = first["nodes"][0]
        v1 = next(n for n in NodeSet(_history(tmp_path)[0]["step_nodes"]) if n != batch_host)
        _lose(slurm_conf, node_sshd, v1, killed)
        gate.touch()
        wait_for(lambda: len(_history(tmp_path)) >= 2, 150, "the step on the spare")
        g1 = _history(tmp_path)[1]
        wait_for(lambda: _progress(tmp_path) >= g1["start_step"] + 2, 120, "the spare to train")
        v2 = next(n for n in NodeSet(g1["step_nodes"]) if n != batch_host)
        _lose(slurm_conf, node_sshd, v2, killed)
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        assert status["run"]["state"] == "COMPLETED", status["events"][-6:]
        a1, a2 = status["attempts"]
        assert a1["state"] == "CANCELLED" and a2["job_id"] != a1["job_id"]
        assert len(_events(status, "attempt.step_relaunch")) == 1
        [classified] = _events(status, "attempt.classified")
        assert classified["data"]["outcome"] == "INFRA" and classified["data"]["suspects"] == [v2]
        [resub] = _events(status, "recovery.resubmit")
        assert v2 in a2["excluded_nodes"] and not {v1, v2} & set(a2["nodes"])
        last = _history(tmp_path)[-1]
        assert (last["attempt"], last["generation"], last["job_id"]) == (2, 0, a2["job_id"])
        assert last["start_step"] == int(Path(resub["data"]["resume_from"]).name.split("_")[1])
    finally:
        d.cleanup()


def test_a_step_node_drained_for_drift_is_left_for_the_spare(
        tmp_path: Path, slurm_conf: str, node_sshd: Sim) -> None:
    """A node of the running step gets another NCCL: the drift scan drains it, and the step
    moves to the spare in the same job (the node is alive: the old step ends cleanly)."""
    d = _daemon(tmp_path, slurm_conf, node_sshd)
    d.start()
    victim = ""
    try:
        with TrainingCounter(str(tmp_path)) as counter:
            gate = tmp_path / "go"
            run_id = d.submit(_spec(tmp_path, "--pause-at", "8", "--gate", str(gate)))
            first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
            wait_for(lambda: _progress(tmp_path) >= 8, 120, "training to pass step 8")
            victim = next(n for n in NodeSet(_history(tmp_path)[0]["step_nodes"])
                          if n != first["nodes"][0])
            node_sshd.nodes[victim].set_nccl("2.21.5")
            d.ctl("drift", "scan")
            gate.touch()
            wait_for(lambda: len(_history(tmp_path)) >= 2, 150, "a step without the drifted node")
            status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        assert status["run"]["state"] == "COMPLETED", status["events"][-6:]
        [attempt] = status["attempts"]
        assert attempt["job_id"] == first["job_id"]
        assert (counter.most_steps, counter.most_ranks) == (1, 2), vars(counter)
        [relaunch] = _events(status, "attempt.step_relaunch")
        assert relaunch["data"]["cause"] == "drift" and relaunch["data"]["exclude"] == [victim]
        g0, g1 = _history(tmp_path)
        assert victim not in NodeSet(g1["step_nodes"]) and g1["job_id"] == g0["job_id"]
        assert g1["start_step"] == int(Path(relaunch["data"]["resume_from"]).name.split("_")[1])
    finally:
        d.cleanup()
        if victim:
            node_sshd.nodes[victim].set_nccl("2.23.4")
            slurm_cmd(slurm_conf, "scontrol", "update", f"NodeName={victim}", "State=RESUME")
