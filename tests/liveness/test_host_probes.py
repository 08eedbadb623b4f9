"""The ICMP echo and TCP SYN probes against a host of their own (a network namespace).

Real sockets, real packets, a real second network stack: the namespace answers,
is powered off (its link down), loses packets, stops answering ICMP echo. Root
only (skipped with the reason otherwise); every namespace is removed after its test.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from b300.liveness.icmp import IcmpProber
from b300.liveness.probes import ProbeConfirmer
from b300.liveness.rounds import LivenessMonitor
from b300.liveness.syn import SynProber
from b300.liveness.timing import LivenessConfig
from b300.liveness.verdicts import CheckOutcome, Decision, Target, Verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns

pytestmark = pytest.mark.skipif(bool(netns.unavailable()), reason=netns.unavailable() or "-")


@pytest.fixture
def host() -> Iterator[netns.Host]:
    with netns.host() as h:
        yield h


def _icmp(h: netns.Host) -> CheckOutcome:
    return IcmpProber(timeout_s=0.8).check([Target("n1", h.addr, 1)], 1.0)[0].outcome


def _syn(h: netns.Host, port: int = netns.OPEN_PORT) -> tuple[CheckOutcome, str]:
    r = SynProber(timeout_s=0.8).check([Target("n1", h.addr, port)], 1.0)[0]
    return r.outcome, r.detail


def test_a_live_host_answers_both_and_a_closed_port_is_an_answer(host: netns.Host) -> None:
    assert _icmp(host) is CheckOutcome.OK
    assert _syn(host) == (CheckOutcome.OK, "syn-ack")
    # Nothing listens: the host's kernel resets, which is the host alive (not a miss).
    assert _syn(host, netns.CLOSED_PORT) == (CheckOutcome.OK, "rst")


def test_a_powered_off_host_is_silence_to_both(host: netns.Host) -> None:
    assert _icmp(host) is CheckOutcome.OK
    host.power_off()
    assert _icmp(host) is CheckOutcome.TIMEOUT
    assert _syn(host)[0] is CheckOutcome.TIMEOUT
    assert _syn(host, netns.CLOSED_PORT)[0] is CheckOutcome.TIMEOUT


def test_all_packets_lost_is_silence(host: netns.Host) -> None:
    if not host.netem("loss", "100%"):
        host.drop(100)
    assert _icmp(host) is CheckOutcome.TIMEOUT
    assert _syn(host)[0] is CheckOutcome.TIMEOUT


def test_a_host_that_ignores_echo_is_silent_to_icmp_but_alive_to_syn_and_never_dead(
        host: netns.Host) -> None:
    host.ignore_echo()
    assert _icmp(host) is CheckOutcome.TIMEOUT
    assert _syn(host)[0] is CheckOutcome.OK
    decisions = _rounds(host, 7)
    verdicts = [d.verdict for d in decisions]
    assert Verdict.DEAD not in verdicts
    assert Verdict.CLEARED in verdicts, decisions  # suspect, then the SYN confirmation cleared it


def test_a_powered_off_host_is_dead_at_the_defaults(host: netns.Host) -> None:
    assert not _rounds(host, 2)
    host.power_off()
    verdicts = [d.verdict for d in _rounds(host, 8)]
    assert verdicts[-1] is Verdict.DEAD and verdicts.count(Verdict.DEAD) == 1, verdicts


def test_loss_and_jitter_never_kill_a_live_host_at_the_defaults(host: netns.Host) -> None:
    how = host.lossy(5, 200)
    decisions = _rounds(host, 25)
    assert Verdict.DEAD not in [d.verdict for d in decisions], (how, decisions)


def _rounds(h: netns.Host, n: int, nodes: int = 1) -> list[Decision]:
    """``n`` rounds at the default [liveness] (ICMP primary, SYN confirmation, 1 s apart)
    against ``nodes`` node names all at the namespace's address; every decision."""
    cfg = LivenessConfig()
    primary = IcmpProber(timeout_s=cfg.timeout_s)
    monitor: LivenessMonitor
    confirmer = ProbeConfirmer(SynProber(timeout_s=cfg.confirm_timeout_s * 0.9),
                               lambda node: monitor.target(node), cfg.confirm_timeout_s, "syn")
    monitor = LivenessMonitor(cfg, primary, confirmer)
    targets = [Target(f"n{i}", h.addr, netns.OPEN_PORT) for i in range(nodes)]
    out: list[Decision] = []
    try:
        for _ in range(n):
            start = time.monotonic()
            out += monitor.round(targets, datetime.now(UTC)).decisions
            time.sleep(max(0.0, cfg.interval_s - (time.monotonic() - start)))
    finally:
        monitor.close()
    return out


def test_without_cap_net_raw_the_icmp_datagram_socket_is_used_where_the_group_may(host: netns.Host) -> None:
    """Inside the namespace (ping_group_range is per namespace), root's group allowed to
    ping and CAP_NET_RAW dropped: the ICMP probe runs on a datagram socket and answers;
    the SYN probe cannot run and says why."""
    import shutil
    import subprocess

    if not shutil.which("setpriv"):
        pytest.skip("setpriv is not installed")
    host.inside("sysctl", "-q", "net.ipv4.ping_group_range=0 0")
    outer = host.addr.rsplit(".", 1)[0] + ".1"
    script = ("from b300.liveness.icmp import IcmpProber, open_icmp_socket\n"
              "from b300.liveness.probes import can_run\nfrom b300.liveness.verdicts import Target\n"
              "s, dgram = open_icmp_socket(); s.close(); print('dgram', dgram)\n"
              f"rs = IcmpProber(timeout_s=0.8).check([Target('a', '127.0.0.1', 1), Target('b', '{outer}', 1),"
              " Target('c', '10.99.99.99', 1)], 1.0)\n"
              "print(*[(r.outcome.value) for r in rs]); print('syn', can_run('syn'))\n")
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-net_raw"]
    out = subprocess.run(["ip", "netns", "exec", host.ns, *drop, sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=60, check=True)
    lines = out.stdout.splitlines()
    # 10.99.99.99: no route inside the namespace, the kernel says so at once.
    assert lines[:2] == ["dgram True", "ok ok unreachable"], out
    assert lines[2].startswith("syn ") and "permitted" in lines[2], out
