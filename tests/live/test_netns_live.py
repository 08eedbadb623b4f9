"""The local cluster's network-namespace mode, the light workload, and the daemon against
nodes that really go silent.

The module brings up a cluster of its own (``B300_NETNS=1``, its own dir, name and ports,
SlurmdTimeout 300 s) and takes it down at the end; the main test cluster is not touched.
Every node is a network namespace at 10.213.k.(10+NN); slurmctld and the tools stay in the
root namespace. ``power-off`` takes a node's link down and kills its processes: from here
it is silent, as a powered-off host is (a connect times out, nothing refuses it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from b300.plugins.layouts import GenericLayout
from helpers import CLUSTER, DaemonHandle, SideCluster, cancel_test_jobs, make_daemon, wait_for

pytestmark = pytest.mark.slurm
LIGHT = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "light_train.py"
# 10 minutes of an impaired link under B300_LONG_TESTS=1, a minute otherwise.
IMPAIRED_S = 600 if os.environ.get("B300_LONG_TESTS") == "1" else 60
_SIDE = SideCluster("NETNS", "b300nstest", 17300, "/var/tmp/b300-netns-test")
_ENV = _SIDE.env
_lc = _SIDE.lc
_must = _SIDE.must


def _slurm(conf: str, *argv: str, timeout: float = 60) -> str:
    return subprocess.run(list(argv), env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True,
                          timeout=timeout, check=True).stdout


@pytest.fixture(scope="module")
def netns_conf() -> Iterator[str]:
    """The netns cluster's SLURM_CONF (brought up here, down at the end of the module)."""
    with _SIDE.running() as conf:
        yield conf


def _addresses(conf: str) -> dict[str, str]:
    out = _slurm(conf, "scontrol", "show", "node", "-o")
    return dict(re.findall(r"NodeName=(\S+) .*?NodeAddr=(\S+)", out))


def _port(conf: str, node: str) -> int:
    for line in Path(conf).read_text().splitlines():
        if line.startswith(f"NodeName={node} "):
            return int(re.search(r"Port=(\d+)", line).group(1))  # type: ignore[union-attr]
    raise AssertionError(node)


def _connect(addr: str, port: int, timeout: float = 3.0) -> str:
    """'ok', 'refused' or 'timeout' for a TCP connect from the root namespace."""
    try:
        socket.create_connection((addr, port), timeout=timeout).close()
        return "ok"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"


def _state(conf: str, node: str) -> str:
    return _slurm(conf, "sinfo", "-h", "-N", "-n", node, "-o", "%T").strip()


def test_nodes_have_their_own_addresses_and_a_two_node_job_runs_across_them(netns_conf: str) -> None:
    addrs = _addresses(netns_conf)
    assert sorted(addrs) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert all(a.startswith("10.213.") for a in addrs.values()), addrs
    assert len(set(addrs.values())) == 4
    out = _slurm(netns_conf, "srun", "-N2", "--ntasks-per-node=1", "bash", "-c",
                 "echo $SLURMD_NODENAME $(ip -4 -o addr show eth0 | awk '{print $4}')", timeout=120)
    seen = dict(line.split() for line in out.splitlines())
    assert len(seen) == 2, out
    for node, cidr in seen.items():  # each task ran in its node's namespace, at its address
        assert cidr == f"{addrs[node]}/24", out


def test_power_off_is_silent_and_power_on_returns_the_node(netns_conf: str) -> None:
    addrs = _addresses(netns_conf)
    assert _connect(addrs["gpu04"], _port(netns_conf, "gpu04")) == "ok"
    _must("power-off", "gpu04")
    try:
        # Silence, not a refusal: the SYN goes unanswered (a killed slurmd on a live host
        # would answer with a RST at once).
        t0 = time.monotonic()
        assert _connect(addrs["gpu04"], _port(netns_conf, "gpu04"), timeout=2.0) == "timeout"
        assert time.monotonic() - t0 >= 1.9
        assert _connect(addrs["gpu03"], _port(netns_conf, "gpu03")) == "ok"
    finally:
        _must("power-on", "gpu04")
    wait_for(lambda: _connect(addrs["gpu04"], _port(netns_conf, "gpu04")) == "ok", 30, "gpu04's slurmd")
    wait_for(lambda: _state(netns_conf, "gpu04") in {"idle", "mixed", "allocated"}, 60, "gpu04 in service")


def test_faults_refuse_bad_input_with_one_line() -> None:
    for args in (["power-off", "gpu99"], ["netem", "gpu01", "loss;rm"], ["login-link", "sideways"],
                 ["partition", "gpu01", "../x"]):
        proc = _lc(*args, timeout=30)
        assert proc.returncode != 0, args
        assert len(proc.stderr.strip().splitlines()) == 1 and "ERROR" in proc.stderr, (args, proc.stderr)


def test_partition_cuts_the_login_node_off_but_not_the_other_nodes(netns_conf: str) -> None:
    addrs = _addresses(netns_conf)
    _must("partition", "gpu03")
    try:
        assert _connect(addrs["gpu03"], _port(netns_conf, "gpu03"), timeout=2.0) == "timeout"
        # gpu04 still reaches gpu03's slurmd (inside the namespaces).
        probe = (f"import socket; socket.create_connection(('{addrs['gpu03']}', "
                 f"{_port(netns_conf, 'gpu03')}), timeout=3).close(); print('ok')")
        out = subprocess.run(["ip", "netns", "exec", f"b300-{_ENV['B300_CLUSTER_NAME']}-gpu04",
                              sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "ok", out.stderr
    finally:
        _must("heal")
    assert _connect(addrs["gpu03"], _port(netns_conf, "gpu03")) == "ok"
    _must("login-link", "down")
    try:
        assert _connect(addrs["gpu02"], _port(netns_conf, "gpu02"), timeout=2.0) == "timeout"
    finally:
        _must("login-link", "up")
    assert _connect(addrs["gpu02"], _port(netns_conf, "gpu02")) == "ok"


def _light_env(conf: str, tmp: Path) -> dict[str, str]:
    env = {**os.environ, "SLURM_CONF": conf, "B300_CHECKPOINT_DIR": str(tmp / "ckpt"),
           "B300_PROGRESS_FILE": str(tmp / "progress.jsonl")}
    env.pop("B300_RESUME_FROM", None)
    return env


_SRUN2 = ["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", sys.executable, str(LIGHT)]


def _light(conf: str, tmp: Path, steps: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_SRUN2, "--steps", str(steps), "--ckpt-every", "5", "--step-time", "0.1"],
                          env=_light_env(conf, tmp), capture_output=True, text=True, timeout=120, check=False)


def test_light_workload_trains_checkpoints_and_resumes(netns_conf: str, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    first = _light(netns_conf, tmp_path, 12)
    assert first.returncode == 0, first.stderr
    listed = GenericLayout().list_checkpoints(str(tmp_path / "ckpt"))
    assert [(c.step, c.complete) for c in listed] == [(5, True), (10, True)]
    lines = [json.loads(x) for x in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "event" not in x] == list(range(1, 13))
    assert all(x["v"] == 1 and x["rank"] == 0 for x in lines)
    again = _light(netns_conf, tmp_path, 14)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("from step 10") == 2, again.stdout


def test_a_silent_peer_fails_the_job_fast(netns_conf: str, tmp_path: Path) -> None:
    """Rank 1 stopped where it is (no socket closes): rank 0's socket timeout (5 s) fails the
    step and the job; srun --kill-on-bad-exit then ends the stopped rank."""
    (tmp_path / "ckpt").mkdir()
    proc = subprocess.Popen([*_SRUN2, "--steps", "100000", "--step-time", "0.1", "--timeout", "5"],
                            env=_light_env(netns_conf, tmp_path), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (tmp_path / "progress.jsonl").exists()
                 and len((tmp_path / "progress.jsonl").read_text().splitlines()) > 5, 60, "training")
        peer = _rank_pid(1)
        t0 = time.monotonic()
        os.kill(peer, signal.SIGSTOP)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert took < 30, took
    assert "rank 0 on" in err and "the step failed" in err and "timed out" in err, err


def _rank_pid(rank: int) -> int:
    """The light workload's process of ``rank`` in this module's cluster (by its environment)."""
    want = {f"SLURM_PROCID={rank}".encode(), f"SLURM_CLUSTER_NAME={_ENV['B300_CLUSTER_NAME']}".encode()}
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            env = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if want <= env and b"light_train.py" in cmd:
            return pid
    raise AssertionError(f"no rank {rank} process")


# ---------------------------------------------------------------- the daemon on silent nodes

@pytest.fixture
def acting(tmp_path: Path, netns_conf: str) -> Iterator[DaemonHandle]:
    """A b300d that acts, with liveness on, a crash command of power-off and a restore of power-on."""
    d = make_daemon(tmp_path, netns_conf)
    lc = ["/usr/bin/env", *[f"{k}={v}" for k, v in _ENV.items()], "/bin/bash", str(CLUSTER)]
    d.config.write_text(d.config.read_text() + "[drill]\n"
                        + f"crash_command = {json.dumps([*lc, 'power-off', '{node}'])}\n"
                        + f"restore_command = {json.dumps([*lc, 'power-on', '{node}'])}\n"
                        + "[liveness]\nenabled = true\n")
    d.start()
    try:
        yield d
    finally:
        d.cleanup()
        cancel_test_jobs(netns_conf, d)
        _lc("heal", timeout=30)
        _lc("login-link", "up", timeout=30)
        for n in ("gpu01", "gpu02", "gpu03", "gpu04"):
            _lc("netem", n, "clear", timeout=30)
        _must("up")  # every node back in service


def _training_spec(tmp_path: Path, nodes: int = 2, steps: int = 2000) -> Path:
    run = tmp_path / "run"
    (run / "ckpt").mkdir(parents=True, exist_ok=True)
    command = (f"srun --kill-on-bad-exit=1 {sys.executable} {LIGHT} --steps {steps} --ckpt-every 5"
               " --step-time 0.3")
    spec = tmp_path / "light.toml"
    spec.write_text("\n".join([
        'name = "light"', "[job]", f"command = {json.dumps(command)}", f"nodes = {nodes}",
        "ntasks_per_node = 1", "gpus_per_node = 8", 'time_limit = "00:30:00"',
        "[checkpoint]", f'dir = "{run / "ckpt"}"', 'layout = "generic"',
        "[health]", f'progress_file = "{run / "progress.json"}"', 'hang_timeout = "30m"',
        "[retries]", "infra = 3",
    ]) + "\n")
    return spec


def _step(tmp_path: Path) -> int:
    try:
        return int(json.loads((tmp_path / "run" / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def _start_training(d: DaemonHandle, tmp_path: Path, nodes: int = 2) -> tuple[str, list[str]]:
    run_id = d.submit(_training_spec(tmp_path, nodes))
    wait_for(lambda: _step(tmp_path) >= 7 and any((tmp_path / "run" / "ckpt").glob("step_*/DONE")), 180,
             "training past a checkpoint")
    attempt = d.run(run_id)["attempts"][-1]
    return run_id, list(attempt["nodes"])


def test_a_powered_off_node_is_drained_and_the_run_resumed_before_slurm_notices(
        acting: DaemonHandle, tmp_path: Path, netns_conf: str) -> None:
    run_id, _ = _start_training(acting, tmp_path)
    rec = acting.ctl("drill", run_id, "--method", "crash", "--timeout", "4m")
    node = rec["started"]["node"]
    f = rec["finished"]
    assert f["outcome"] == "trained again", rec
    assert f["detected_by"] == "liveness.dead", rec
    assert f["detect_s"] < 30 and f["training_s"] < 120, rec
    assert f["resume_step"] >= 5, rec
    # Slurm itself never called the node DOWN meanwhile (SlurmdTimeout=300): the drain was ours.
    states = [e["data"].get("state", "") for e in acting.ctl("events", "--node", node)
              if e["kind"] == "node.state"]
    assert not [s for s in states if "down" in s.lower()], states


def _quiet_for(d: DaemonHandle, run_id: str, seconds: float) -> None:
    """The run stays RUNNING on its first attempt, nothing drained or cancelled, for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r = d.run(run_id)
        assert r["run"]["state"] == "RUNNING" and len(r["attempts"]) == 1, r["events"][-6:]
        time.sleep(3)
    kinds = [e["kind"] for e in d.ctl("events", "--run", run_id)]
    assert not [k for k in kinds if k in {"node.drained", "attempt.cancel_requested", "liveness.dead"}], kinds


def _first_attempt_events(d: DaemonHandle) -> list[dict[str, Any]]:
    return [e for e in d.ctl("events") if e["kind"] in {"node.drained", "liveness.dead"}]


def test_a_lossy_link_drains_nothing_and_cancels_nothing(acting: DaemonHandle, tmp_path: Path) -> None:
    run_id, nodes = _start_training(acting, tmp_path)
    # With tc netem in the kernel: 5% loss and 200 ms +- 200 ms delay; without: 5% loss.
    proc = _lc("netem", nodes[1], "loss", "5%", "delay", "200ms", "200ms", timeout=30)
    if proc.returncode != 0:
        _must("netem", nodes[1], "loss", "5%")
    _quiet_for(acting, run_id, IMPAIRED_S)
    assert not _first_attempt_events(acting)


def _slurmd_pid(conf: str, node: str) -> int:
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"slurmd") and [b"-f", conf.encode()] == args[1:3] and \
                args[3:5] == [b"-N", node.encode()]:
            return pid
    raise AssertionError(f"no slurmd of {node}")


def test_a_frozen_slurmd_drains_nothing_and_cancels_nothing(
        acting: DaemonHandle, tmp_path: Path, netns_conf: str) -> None:
    """slurmd stopped (SIGSTOP) while the job trains on: the node's kernel still answers."""
    run_id, nodes = _start_training(acting, tmp_path)
    pid = _slurmd_pid(netns_conf, nodes[1])
    os.kill(pid, signal.SIGSTOP)
    try:
        _quiet_for(acting, run_id, 60)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert not _first_attempt_events(acting)


def test_the_login_nodes_own_link_down_drains_nothing(acting: DaemonHandle, tmp_path: Path) -> None:
    run_id, _ = _start_training(acting, tmp_path)
    _must("login-link", "down")
    try:
        time.sleep(30)
    finally:
        _must("login-link", "up")
    _quiet_for(acting, run_id, 20)
    assert not _first_attempt_events(acting)


def test_a_partition_of_half_the_nodes_is_reported_not_drained(acting: DaemonHandle, tmp_path: Path) -> None:
    run_id, nodes = _start_training(acting, tmp_path, nodes=4)
    cut = nodes[2:]
    _must("partition", *cut)
    try:
        reported = wait_for(lambda: [e for e in acting.ctl("events") if e["kind"] == "liveness.partition"
                                     and set(cut) <= set(e["data"]["nodes"])], 60, "the partition reported")
        _quiet_for(acting, run_id, 30)
    finally:
        _must("heal")
    assert reported
    assert not [e for e in acting.ctl("events") if e["kind"] == "node.drained"]
