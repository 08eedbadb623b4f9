"""The host probes' pure parts and choices: the TCP header, the fallback, the confirmation's
reading of probe outcomes, and the state machine fed the host probes' outcomes."""

from __future__ import annotations

import socket
import struct
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from b300.liveness.batch import checksum
from b300.liveness.icmp import IcmpProber
from b300.liveness.machine import Health, observe_checks, observe_confirmations
from b300.liveness.probes import ProbeConfirmer, choose
from b300.liveness.syn import SynProber, tcp_segment
from b300.liveness.tcp import TcpProber
from b300.liveness.timing import LivenessConfig
from b300.liveness.verdicts import CheckOutcome, CheckResult, ConfirmOutcome, ConfirmResult, Target, Verdict

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CFG = LivenessConfig()
ports = st.integers(1, 65535)
addrs = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))


@given(addrs, addrs, ports, ports, st.integers(0, 2**32 - 1))
@settings(max_examples=200)
def test_the_syn_checksum_verifies_over_the_pseudo_header(src: str, dst: str, sport: int, dport: int,
                                                          seq: int) -> None:
    seg = tcp_segment(src, dst, sport, dport, seq, 0, 0x02)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, 20)
    assert len(seg) == 20 and checksum(pseudo + seg) == 0
    assert struct.unpack("!HHI", seg[:8]) == (sport, dport, seq) and seg[13] == 0x02


def test_the_checksum_is_rfc1071s() -> None:
    # RFC 1071's example words 0001 f203 f4f5 f6f7: sum 0xddf2, checksum 0x220d.
    assert checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0x220D


def test_defaults_are_icmp_then_syn_and_fall_back_to_connect_with_a_reason() -> None:
    assert choose(CFG, ssh_ready=False, probe=lambda k: "") == choose(CFG, ssh_ready=True, probe=lambda k: "")
    c = choose(CFG, ssh_ready=False, probe=lambda k: "")
    assert (c.primary, c.confirm, c.notes) == ("icmp", "syn", ())
    # No raw socket and no ping group: neither host probe runs; SSH confirms where [drift]
    # allows (today's checks), else liveness is off, and the lines say what to set.
    c = choose(CFG, ssh_ready=True, probe=lambda k: "Operation not permitted")
    assert (c.primary, c.confirm) == ("connect", "ssh")
    assert "CAP_NET_RAW" in c.notes[0] and "ping_group_range" in c.notes[0]
    c = choose(CFG, ssh_ready=False, probe=lambda k: "Operation not permitted")
    assert (c.primary, c.confirm) == ("connect", "") and "liveness is off" in c.notes[1]
    # A ping group but no CAP_NET_RAW: ICMP stays, the confirmation is the connect check.
    c = choose(CFG, ssh_ready=False, probe=lambda k: "" if k == "icmp" else "Operation not permitted")
    assert (c.primary, c.confirm) == ("icmp", "connect") and "CAP_NET_RAW" in c.notes[0]


def test_ssh_confirmation_needs_drift() -> None:
    cfg = LivenessConfig(primary="connect", confirm="ssh")
    c = choose(cfg, ssh_ready=True, probe=lambda k: "")
    assert (c.primary, c.confirm, c.notes) == ("connect", "ssh", ())
    c = choose(cfg, ssh_ready=False, probe=lambda k: "")
    assert c.confirm == "syn" and "[drift]" in c.notes[0]


def test_ipv6_targets_are_not_checked_by_the_ipv4_probes() -> None:
    t = [Target("n1", "::1", 22)]
    assert IcmpProber(timeout_s=0.2).check(t, 0.5)[0].outcome is CheckOutcome.NOT_CHECKED
    r = SynProber(timeout_s=0.2).check(t, 0.5)[0]
    assert r.outcome is CheckOutcome.NOT_CHECKED


def test_a_confirmation_by_connect_counts_a_reset_as_alive() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # bound, not listening: a connect is refused
        target = Target("n1", "127.0.0.1", closed)
        c = ProbeConfirmer(TcpProber(timeout_s=0.5), {"n1": target}.get, 1.0, "connect")
        out = c.confirm(["n1", "n2"])
    assert [(r.node, r.outcome) for r in out] == [("n1", ConfirmOutcome.ANSWERED),
                                                   ("n2", ConfirmOutcome.NOT_CHECKED)]


outcomes = st.sampled_from([CheckOutcome.OK, CheckOutcome.TIMEOUT, CheckOutcome.UNREACHABLE,
                            CheckOutcome.NOT_CHECKED])


@given(st.lists(outcomes, min_size=1, max_size=40))
@settings(max_examples=300)
def test_a_node_that_answers_the_confirmation_is_never_dead(seq: list[CheckOutcome]) -> None:
    """ICMP filtered (or lost) but the SYN confirmation answers: whatever the primary sees,
    no DEAD verdict."""
    states: dict = {}
    for i, o in enumerate(seq):
        now = T0 + timedelta(seconds=i)
        step = observe_checks(states, [CheckResult("n1", o, 0.001)], now, CFG)
        assert Verdict.DEAD not in [d.verdict for d in step.decisions]
        states = dict(step.states)
        if step.confirm:
            step = observe_confirmations(states, [ConfirmResult("n1", ConfirmOutcome.ANSWERED, 0.01)],
                                         now + timedelta(milliseconds=500), CFG)
            assert Verdict.DEAD not in [d.verdict for d in step.decisions]
            states = dict(step.states)


@given(st.integers(0, 5))
def test_silence_to_both_is_dead_after_n_plus_the_window(before: int) -> None:
    """A powered-off node: both probes silent from round ``before`` on; dead at the
    (N + window)-th silent round, not earlier."""
    states: dict = {}
    verdicts = []
    for i in range(before + 8):
        now = T0 + timedelta(seconds=i)
        o = CheckOutcome.OK if i < before else CheckOutcome.TIMEOUT
        step = observe_checks(states, [CheckResult("n1", o, 0.001)], now, CFG)
        states = dict(step.states)
        verdicts += [(i, d.verdict) for d in step.decisions]
        if step.confirm:
            step = observe_confirmations(states, [ConfirmResult("n1", ConfirmOutcome.FAILED, 0.8)],
                                         now + timedelta(milliseconds=900), CFG)
            states = dict(step.states)
            verdicts += [(i, d.verdict) for d in step.decisions]
    dead = [i for i, v in verdicts if v is Verdict.DEAD]
    assert dead == [before + CFG.misses_to_suspect]  # N misses, then one round of window
    assert states["n1"].health is Health.DEAD


def test_the_syn_probe_sends_segments_whose_checksum_verifies() -> None:
    """The incremental checksum of the probe matches the one of :func:`tcp_segment`: the
    segments the kernel answers are the ones the probe builds (answers from a real
    listener, a wrong checksum would be dropped silently)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        results = SynProber(timeout_s=0.5).check([Target("n1", "127.0.0.1", port),
                                                  Target("n2", "127.0.0.3", port)], 1.0)
    assert [(r.outcome, r.detail) for r in results] == [(CheckOutcome.OK, "syn-ack"), (CheckOutcome.OK, "rst")]


def test_without_cap_net_raw_the_start_up_line_says_what_to_set() -> None:
    """In a process without CAP_NET_RAW (and outside ping_group_range, as here): the real
    socket refusals turn into the fallback and the line naming the capability and sysctl."""
    import os
    import shutil
    import subprocess
    import sys

    import pytest

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to start a process without CAP_NET_RAW")
    script = ("from b300.liveness.timing import LivenessConfig\nfrom b300.liveness.probes import choose\n"
              "c = choose(LivenessConfig(), ssh_ready=False)\nprint(c.primary, repr(c.confirm))\n"
              "print('\\n'.join(c.notes))\n")
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-net_raw"]
    out = subprocess.run([*drop, sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    with open("/proc/sys/net/ipv4/ping_group_range") as f:
        low, high = map(int, f.read().split())
    if low <= 0 <= high:  # root's group may open ICMP datagram sockets here
        assert out.startswith("icmp 'connect'"), out
    else:
        assert out.startswith("connect ''"), out
        assert "CAP_NET_RAW" in out and "ping_group_range" in out and "liveness is off" in out, out


def test_ipv6_nodes_get_the_connect_check_beside_the_ipv4_host_probe() -> None:
    from b300.liveness.probes import prober

    with socket.socket(socket.AF_INET6) as srv:
        srv.bind(("::1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        targets = [Target("n1", "127.0.0.1", port), Target("n2", "::1", port), Target("n3", "127.0.0.2", port)]
        results = prober("icmp", CFG, 0.5).check(targets, 1.0)
    assert [(r.node, r.outcome, r.detail) for r in results] == [
        ("n1", CheckOutcome.OK, "echo reply"), ("n2", CheckOutcome.OK, ""),
        ("n3", CheckOutcome.OK, "echo reply")]
