"""Benchmark: the host-level liveness probes (ICMP echo, TCP SYN) beside today's connect.

    python tests/bench/bench_host_probes.py cost  [--nodes 10000] [--rounds 30] [--interval 1.0]
    python tests/bench/bench_host_probes.py table                         (root: network namespaces)

- ``cost``: ``--nodes`` distinct loopback addresses (127.0.0.0/8 is all local: 127.x.y.z),
  checked once per ``--interval`` for ``--rounds`` by each prober in turn: ICMP echo, a
  SYN to a closed port (the kernel's RST), and today's connect to the same closed port.
  Prints per prober the wall time of a round (must end within the interval), the CPU
  (user+sys of this process) per round and per 1,000 node-checks, and the CPU as a share
  of one core at one round per interval.
- ``table``: a host in a network namespace of its own (tests/liveness/netns.py) in each
  failure, and what each probe reports: alive, powered off (link down), all packets
  lost, ICMP echo ignored, slurmd dead (nothing listens), slurmd frozen (SIGSTOP).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "liveness"))

from b300.liveness.icmp import IcmpProber  # noqa: E402
from b300.liveness.rounds import PrimaryProber  # noqa: E402
from b300.liveness.syn import SynProber  # noqa: E402
from b300.liveness.tcp import TcpProber  # noqa: E402
from b300.liveness.verdicts import Target  # noqa: E402

CLOSED = 9  # discard: nothing listens on loopback here


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _targets(n: int) -> list[Target]:
    return [Target(f"n{i}", f"127.{(i >> 16) & 255}.{(i >> 8) & 255}.{(i & 255) or 1}"
                   if i & 255 else f"127.{(i >> 16) & 255}.{((i >> 8) & 255) + 100}.254", CLOSED)
            for i in range(1, n + 1)]


def cost(nodes: int, rounds: int, interval: float) -> None:
    targets = _targets(nodes)
    assert len({t.host for t in targets}) == nodes
    probers: dict[str, PrimaryProber] = {
        "icmp": IcmpProber(timeout_s=0.8 * interval, max_in_flight=4096),
        "syn": SynProber(timeout_s=0.8 * interval, max_in_flight=4096),
        "connect": TcpProber(timeout_s=0.8 * interval, max_in_flight=512),
    }
    print(f"{nodes} targets, {rounds} rounds at {interval:g} s")
    print(f"{'probe':8} {'wall/round p50':>15} {'max':>8} {'cpu/round':>10} {'cpu/1000':>9} "
          f"{'core %':>7}  outcomes")
    for name, prober in probers.items():
        walls, cpus = [], []
        outcomes: Counter[str] = Counter()
        for _ in range(rounds):
            w0, c0 = time.monotonic(), _cpu()
            results = prober.check(targets, interval)
            wall, cpu = time.monotonic() - w0, _cpu() - c0
            walls.append(wall)
            cpus.append(cpu)
            outcomes.update(r.outcome.value for r in results)
            time.sleep(max(0.0, interval - wall))
        walls.sort()
        per_round = sum(cpus) / rounds
        print(f"{name:8} {walls[len(walls) // 2] * 1000:13.0f}ms {walls[-1] * 1000:6.0f}ms "
              f"{per_round * 1000:8.1f}ms {per_round / nodes * 1e6:7.1f}ms {per_round / interval * 100:6.1f}%  "
              f"{dict(outcomes)}")


def table() -> None:
    import netns

    if why := netns.unavailable():
        sys.exit(f"table: {why}")
    rows = []
    cases = ["alive", "powered off", "100% loss", "icmp ignored", "slurmd dead", "slurmd frozen"]
    for case in cases:
        with netns.host() as h:
            port = netns.OPEN_PORT
            if case == "powered off":
                h.power_off()
            elif case == "100% loss":
                h.drop(100)
            elif case == "icmp ignored":
                h.ignore_echo()
            elif case == "slurmd dead":
                port = netns.CLOSED_PORT
            elif case == "slurmd frozen":
                pid = netns.sh("ip", "netns", "pids", h.ns).stdout.split()
                for p in pid:
                    os.kill(int(p), signal.SIGSTOP)
            t = [Target("n1", h.addr, port)]
            row = [case]
            for prober in (IcmpProber(timeout_s=0.8), SynProber(timeout_s=0.8), TcpProber(timeout_s=0.8)):
                r = prober.check(t, 1.0)[0]
                row.append(r.outcome.value + (f" ({r.detail})" if r.detail in ("rst", "syn-ack") else ""))
            if case == "slurmd frozen":
                for p in pid:
                    os.kill(int(p), signal.SIGCONT)
            rows.append(row)
    print("| failure | icmp | syn | connect (today) |\n| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["cost", "table"])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--interval", type=float, default=1.0)
    a = ap.parse_args()
    if a.mode == "cost":
        cost(a.nodes, a.rounds, a.interval)
    else:
        table()


if __name__ == "__main__":
    main()
