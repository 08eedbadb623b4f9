"""The SSH confirmation against real sshd, and a whole monitor (real TCP + real SSH) end to end."""

from __future__ import annotations

import os
import signal
import socket
import time
from datetime import UTC, datetime, timedelta

import drift_nodes as dn
from drift_nodes import Sim

from b300.drift.scan_records import Endpoint, SshSettings
from b300.liveness.confirm import SshConfirmer, confirm_runner
from b300.liveness.rounds import LivenessMonitor
from b300.liveness.tcp import TcpProber
from b300.liveness.timing import LivenessConfig
from b300.liveness.verdicts import ConfirmOutcome, Target, Verdict

CFG = LivenessConfig()


def _settings(sim: Sim, known: str | None = None) -> SshSettings:
    return SshSettings(user="root", known_hosts=known or str(sim.known_hosts), key_file=str(sim.key))


def _confirmer(sim: Sim, addresses: dict[str, Endpoint], known: str | None = None) -> SshConfirmer:
    return SshConfirmer(confirm_runner(_settings(sim, known), addresses, CFG))


def test_alive_refused_silent_unknown(ssh_nodes: Sim) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    filler = socket.create_connection(silent.getsockname())  # the queue is full from now on
    addresses = {"n1": Endpoint("127.0.0.1", ssh_nodes.port("n1")),
                 "gone": Endpoint("127.0.0.1", dn.free_port()),
                 "silent": Endpoint("127.0.0.1", silent.getsockname()[1])}
    try:
        t0 = time.monotonic()
        results = {r.node: r for r in _confirmer(ssh_nodes, addresses).confirm(
            ["n1", "gone", "silent", "nowhere"])}
        took = time.monotonic() - t0
    finally:
        filler.close()
        silent.close()
    assert results["n1"].outcome is ConfirmOutcome.ANSWERED, results["n1"]
    assert "authenticated" in results["n1"].detail
    assert results["gone"].outcome is ConfirmOutcome.FAILED and "ssh unreachable" in results["gone"].detail
    assert results["silent"].outcome is ConfirmOutcome.FAILED
    assert results["nowhere"].outcome is ConfirmOutcome.NOT_CHECKED
    assert took < 3 * CFG.confirm_timeout_s + 2  # connect, banner and auth each bounded


def test_a_wrong_host_key_is_an_answer_not_a_death(ssh_nodes: Sim) -> None:
    other = ssh_nodes.nodes["n2"].host_pub
    known = ssh_nodes.base / "wrong_known_hosts"
    known.write_text(ssh_nodes.nodes["n1"].known_hosts_line(other))
    r = _confirmer(ssh_nodes, {"n1": Endpoint("127.0.0.1", ssh_nodes.port("n1"))},
                   str(known)).confirm(["n1"])[0]
    assert r.outcome is ConfirmOutcome.ANSWERED_REFUSED and "hostkey" in r.detail


def test_a_frozen_sshd_that_thaws_within_the_timeout_answers(ssh_nodes: Sim) -> None:
    node = ssh_nodes.nodes["n2"]
    assert node.proc is not None
    os.kill(node.proc.pid, signal.SIGSTOP)
    try:
        import threading
        threading.Timer(0.5, os.kill, (node.proc.pid, signal.SIGCONT)).start()
        r = _confirmer(ssh_nodes, {"n2": Endpoint("127.0.0.1", node.port)}).confirm(["n2"])[0]
    finally:
        os.kill(node.proc.pid, signal.SIGCONT)
    assert r.outcome is ConfirmOutcome.ANSWERED, r


def test_monitor_clears_a_cut_check_path_and_confirms_a_dead_node(ssh_nodes: Sim) -> None:
    """Real primary (TCP) and real confirmation (SSH): node ``n1``'s primary port is closed
    while its sshd lives (a cut check path: cleared, never dead); then its sshd is gone too
    (dead within N + window rounds)."""
    slurmd = socket.socket()
    slurmd.bind(("127.0.0.1", 0))
    slurmd.listen(4096)
    port = slurmd.getsockname()[1]
    healthy = socket.socket()
    healthy.bind(("127.0.0.1", 0))
    healthy.listen(4096)
    targets = [Target("n1", "127.0.0.1", port), Target("n2", "127.0.0.1", healthy.getsockname()[1])]
    ssh = {"n1": Endpoint("127.0.0.1", ssh_nodes.port("n1")), "n2": Endpoint("127.0.0.1", ssh_nodes.port("n2"))}
    monitor = LivenessMonitor(CFG, TcpProber(timeout_s=CFG.timeout_s), _confirmer(ssh_nodes, ssh))
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    seen: list[tuple[int, str, Verdict]] = []

    def rounds(start: int, count: int) -> None:
        for i in range(start, start + count):
            report = monitor.round(targets, t0 + timedelta(seconds=i))
            seen.extend((i, d.node, d.verdict) for d in report.decisions)
            assert monitor.wait_confirmations(10.0)
    try:
        rounds(0, 2)
        slurmd.close()  # the primary path to n1 is cut; n1 itself (sshd) is fine
        rounds(2, 8)
        assert (4, "n1", Verdict.SUSPECT) in seen and (5, "n1", Verdict.CLEARED) in seen
        assert not [s for s in seen if s[2] is Verdict.DEAD], seen
        addresses_gone = {"n1": Endpoint("127.0.0.1", dn.free_port()), "n2": ssh["n2"]}
        monitor = LivenessMonitor(CFG, TcpProber(timeout_s=CFG.timeout_s),
                                  _confirmer(ssh_nodes, addresses_gone))  # n1's sshd is gone too
        seen.clear()
        rounds(10, 6)
        dead = [s for s in seen if s[2] is Verdict.DEAD]
        # a fresh monitor: misses at 10, 11, 12 (suspect), confirmation fails, dead at 13
        assert dead == [(13, "n1", Verdict.DEAD)], seen
        assert not [s for s in seen if s[1] == "n2"]
    finally:
        monitor.close()
        healthy.close()
