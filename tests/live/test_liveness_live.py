"""Active failure detection against the real local cluster (issue 14, phase 1).

The primary check is a TCP connect to each node's real slurmd (addresses from the
real ``scontrol show node``); the confirmation is an SSH round trip to an sshd that
stands for the node's own (the drift tests' simulated nodes: the local cluster's
nodes share one host, so each gets an sshd of its own). A crash takes both: the
test kills the node (``localcluster.sh kill-node``) and stops its sshd.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from b300.drift.scan_records import Endpoint, SshSettings
from b300.liveness.confirm import SshConfirmer, confirm_runner
from b300.liveness.machine import window_rounds
from b300.liveness.rounds import LivenessMonitor, RoundReport
from b300.liveness.slurm_addr import parse_node_addresses, targets_for
from b300.liveness.tcp import TcpProber
from b300.liveness.timing import LivenessConfig
from b300.liveness.verdicts import CheckOutcome, Target, Verdict
from helpers import CLUSTER, slurm_cmd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drift"))
import drift_nodes as dn
from drift_nodes import Sim

pytestmark = pytest.mark.slurm
CFG = LivenessConfig()
VICTIM, NEIGHBOUR = "gpu04", "gpu03"
BASE_PORT = int(os.environ.get("B300_SSHD_PORT_BASE", "22201")) + 50


@pytest.fixture(scope="module")
def node_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    versions = {n: dn.Versions() for n in [NEIGHBOUR, VICTIM]}
    with dn.fleet(tmp_path_factory.mktemp("liveness-live"), versions, BASE_PORT) as fleet:
        yield fleet


def _targets(conf: str) -> list[Target]:
    out = slurm_cmd(conf, "scontrol", "show", "node", "-o", f"{NEIGHBOUR},{VICTIM}")
    targets, missing = targets_for([NEIGHBOUR, VICTIM], parse_node_addresses(out))
    assert not missing, missing
    return targets


def test_every_nodes_slurmd_is_a_target_at_its_own_port(slurm_conf: str) -> None:
    """The daemon's own path (CliSlurmClient.node_addresses) on every node of the cluster:
    gpu01 listens on the cluster's SlurmdPort, for which scontrol prints no Port=; its
    target must still be its slurmd (it was 6818 before: refused, every run on gpu01 SPLIT)."""
    from b300.slurm.cli import CliSlurmClient

    nodes = ["gpu01", "gpu02", "gpu03", "gpu04"]
    conf_ports = {}
    for line in Path(slurm_conf).read_text().splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName") in nodes and "Port" in fields:
            conf_ports[fields["NodeName"]] = int(fields["Port"])
    targets, missing = targets_for(nodes, CliSlurmClient(slurm_conf=slurm_conf).node_addresses(nodes))
    assert not missing, missing
    assert {t.node: t.port for t in targets} == conf_ports
    results = TcpProber(timeout_s=CFG.timeout_s).check(targets, CFG.interval_s)
    assert [(r.node, r.outcome.value) for r in results] == [(n, "ok") for n in nodes]


def _monitor(sim: Sim) -> LivenessMonitor:
    settings = SshSettings(user="root", known_hosts=str(sim.known_hosts), key_file=str(sim.key))
    addresses = {n: Endpoint("127.0.0.1", node.port) for n, node in sim.nodes.items()}
    return LivenessMonitor(CFG, TcpProber(timeout_s=CFG.timeout_s, max_in_flight=CFG.max_in_flight),
                           SshConfirmer(confirm_runner(settings, addresses, CFG)))


def _rounds(monitor: LivenessMonitor, targets: list[Target], seconds: float, *,
            until_dead: bool = False) -> list[tuple[float, RoundReport]]:
    """Rounds every interval_s for ``seconds`` (the cadence is the check's own, not a wait),
    or until a node is confirmed dead."""
    out = []
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < seconds:
        out.append((time.monotonic(), monitor.round(targets, datetime.now(UTC))))
        if until_dead and out[-1][1].dead:
            break
        i += 1
        time.sleep(max(0.0, start + i * CFG.interval_s - time.monotonic()))
    return out


def _slurmd_pid(conf: str, node: str) -> int:
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if not comm.read_text().startswith("slurmd"):
                continue
            args = (comm.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if conf.encode() in args and b"-N" in args and args[args.index(b"-N") + 1] == node.encode():
            return int(comm.parent.name)
    pytest.fail(f"no slurmd for {node}")


def _verdicts(rounds: list[tuple[float, RoundReport]], node: str) -> list[tuple[float, Verdict]]:
    return [(t, d.verdict) for t, r in rounds for d in r.decisions if d.node == node]


def test_crashed_node_is_confirmed_dead_within_n_checks_and_the_window(
        slurm_conf: str, node_sshd: Sim) -> None:
    targets = _targets(slurm_conf)
    monitor = _monitor(node_sshd)
    try:
        before = _rounds(monitor, targets, 3.0)
        assert not [d for _, r in before for d in r.decisions], "a healthy cluster raised a verdict"
        subprocess.run(["bash", str(CLUSTER), "kill-node", VICTIM], check=True, timeout=60,
                       capture_output=True)
        dn.stop([node_sshd.nodes[VICTIM]])  # the crash takes the node's sshd too
        killed = time.monotonic()
        after = _rounds(monitor, targets, 8.0, until_dead=True)
        slurm_then = slurm_cmd(slurm_conf, "sinfo", "-h", "-N", "-n", VICTIM, "-o", "%T").strip()
    finally:
        monitor.close()
        dn.start([node_sshd.nodes[VICTIM]])
        subprocess.run(["bash", str(CLUSTER), "restart-node", VICTIM], timeout=120, capture_output=True)
    dead = [t for t, v in _verdicts(after, VICTIM) if v is Verdict.DEAD]
    assert len(dead) == 1, _verdicts(after, VICTIM)
    detect = dead[0] - killed
    bound = (CFG.misses_to_suspect + window_rounds(CFG) + 1) * CFG.interval_s
    print(f"\n{VICTIM}: confirmed dead {detect:.2f} s after the kill (bound {bound:.1f} s)")
    assert detect <= bound
    evidence = next(d.evidence for _, r in after for d in r.decisions if d.verdict is Verdict.DEAD)
    assert "refused" in evidence and "confirmation failed" in evidence and "ssh unreachable" in evidence
    assert not _verdicts(after, NEIGHBOUR)
    # Slurm had not noticed yet (it marks the node not responding ~15-20 s after the kill
    # with SlurmdTimeout=20, measured; 100 s with 300).
    assert "*" not in slurm_then and "down" not in slurm_then, slurm_then


def test_slurmd_frozen_for_less_than_the_window_is_never_confirmed(slurm_conf: str, node_sshd: Sim) -> None:
    """SIGSTOP for just under the silence the thresholds tolerate, then SIGCONT. A frozen
    slurmd's kernel still completes the handshake on its listen backlog, so the TCP check
    keeps answering (measured: docs/benchmarks.md, "Liveness checks"); nothing is suspected."""
    targets = _targets(slurm_conf)
    monitor = _monitor(node_sshd)
    pid = _slurmd_pid(slurm_conf, VICTIM)
    freeze = (CFG.misses_to_suspect - 1) * CFG.interval_s + CFG.confirm_window_s - 0.5
    try:
        os.kill(pid, signal.SIGSTOP)
        frozen = _rounds(monitor, targets, freeze)
        os.kill(pid, signal.SIGCONT)
        thawed = _rounds(monitor, targets, 4.0)
    finally:
        os.kill(pid, signal.SIGCONT)
        monitor.close()
    assert frozen and all(r.answered == 2 for _, r in frozen)
    assert not _verdicts(frozen + thawed, VICTIM)
    assert monitor.states[VICTIM].misses == 0
    assert slurm_cmd(slurm_conf, "scontrol", "show", "node", VICTIM).count("State=IDLE") == 1


def test_cut_check_path_is_cleared_by_the_confirmation(slurm_conf: str, node_sshd: Sim) -> None:
    """The primary check of a healthy node points at a closed port (the check path is cut,
    not the node): suspect after N misses, cleared by the SSH confirmation, never dead."""
    good = _targets(slurm_conf)
    cut = [t if t.node != VICTIM else Target(VICTIM, t.host, dn.free_port()) for t in good]
    monitor = _monitor(node_sshd)
    try:
        rounds = _rounds(monitor, cut, 8.0)
    finally:
        monitor.close()
    verdicts = [v for _, v in _verdicts(rounds, VICTIM)]
    assert verdicts[:2] == [Verdict.SUSPECT, Verdict.CLEARED], verdicts
    assert Verdict.DEAD not in verdicts
    cleared = next(d for _, r in rounds for d in r.decisions if d.verdict is Verdict.CLEARED)
    assert "answers the confirmation" in cleared.evidence and "authenticated" in cleared.evidence
    assert all(r.outcome is not CheckOutcome.OK for r in
               TcpProber(timeout_s=0.5).check([t for t in cut if t.node == VICTIM], 1.0))
