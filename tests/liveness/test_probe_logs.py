"""No log line on the node: the SYN and ICMP probes against a real slurmd and a real sshd.

slurmd logs two ``error:`` lines for every TCP connect that sends nothing (today's
``connect`` check), sshd one for a bare connect at LogLevel INFO. A half-open SYN is
reset by our own kernel before the node's kernel hands it to a process, and an ICMP
echo is answered by the kernel: neither adds a line. The plain connects are run too,
so that the test fails if the logs were not being written at all.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from b300.liveness.icmp import IcmpProber
from b300.liveness.slurm_addr import parse_node_addresses, parse_slurmd_port, with_default_port
from b300.liveness.syn import SynProber
from b300.liveness.tcp import TcpProber
from b300.liveness.verdicts import CheckOutcome, Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drift"))
import drift_nodes as dn

N = 20
SSHD_PORT = int(os.environ.get("B300_SSHD_PORT_BASE", "22201")) + 60

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the SYN probe's raw socket needs CAP_NET_RAW (root)")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """One real sshd on loopback logging at INFO to a file: (port, log)."""
    base = tmp_path_factory.mktemp("probe-logs")
    key = dn.client_key(base)
    auth = base / "authorized_keys"
    auth.write_text(Path(f"{key}.pub").read_text())
    node = dn.make_node(base, "n1", SSHD_PORT, dn.Versions(), auth)
    config = node.root / "sshd_config"
    config.write_text(config.read_text().replace("LogLevel ERROR", "LogLevel INFO"))
    log = base / "sshd.log"
    log.touch()
    proc = subprocess.Popen([dn.SSHD, "-D", "-E", str(log), "-f", str(config)])
    try:
        for _ in range(200):  # bounded: sshd listens within a few seconds
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", SSHD_PORT)) == 0:
                    break
            time.sleep(0.05)
        time.sleep(0.5)
        yield SSHD_PORT, log
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def slurmd(slurm_conf: str) -> tuple[Target, Path]:
    """The last node of the test cluster: its slurmd's target and log file."""
    show = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True,
                          timeout=30, check=True).stdout
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                            timeout=30, check=True).stdout
    addresses = with_default_port(parse_node_addresses(show), parse_slurmd_port(config) or 6818)
    node = sorted(addresses)[-1]
    a = addresses[node]
    m = re.search(r"^SlurmdLogFile\s*=\s*(\S+)", config, re.MULTILINE)
    assert m, "the test cluster logs slurmd to a file"
    assert a.port is not None
    return Target(node, a.addr, a.port), Path(m.group(1).replace("%n", node))


def _lines(path: Path) -> int:
    time.sleep(0.5)  # the daemon writes its line after the connection is gone
    return len(path.read_bytes().splitlines())


def _probe(kind: str, target: Target) -> None:
    for _ in range(N):
        if kind == "syn":
            r = SynProber(timeout_s=0.8).check([target], 1.0)[0]
        elif kind == "icmp":
            r = IcmpProber(timeout_s=0.8).check([target], 1.0)[0]
        else:
            r = TcpProber(timeout_s=0.8).check([target], 1.0)[0]
        assert r.outcome is CheckOutcome.OK, r


@pytest.mark.parametrize("kind", ["syn", "icmp"])
def test_host_probes_add_no_line_to_slurmds_log(slurmd: tuple[Target, Path], kind: str) -> None:
    target, log = slurmd
    before = _lines(log)
    _probe(kind, target)
    assert _lines(log) == before, log.read_text().splitlines()[before:][:6]


def test_plain_connects_do_add_lines_to_slurmds_log(slurmd: tuple[Target, Path]) -> None:
    target, log = slurmd
    before = _lines(log)
    _probe("connect", target)
    assert _lines(log) - before >= N


@pytest.mark.parametrize("kind", ["syn", "icmp"])
def test_host_probes_add_no_line_to_sshds_log(sshd: tuple[int, Path], kind: str) -> None:
    port, log = sshd
    before = _lines(log)
    _probe(kind, Target("n1", "127.0.0.1", port))
    assert _lines(log) == before, log.read_text().splitlines()[before:][:6]


def test_plain_connects_do_add_lines_to_sshds_log(sshd: tuple[int, Path]) -> None:
    port, log = sshd
    before = _lines(log)
    _probe("connect", Target("n1", "127.0.0.1", port))
    assert _lines(log) - before >= N
