"""Benchmark: the host-level liveness probes (ICMP echo, TCP SYN) beside today's connect.

    python tests/bench/bench_host_probes.py cost  [--nodes 10000] [--rounds 30] [--interval 1.0]
                                                  [--probes icmp,syn,connect] [--against DIR] [--block 5]
    python tests/bench/bench_host_probes.py table                         (root: network namespaces)

- ``cost``: ``--nodes`` distinct loopback addresses (127.0.0.0/8 is all local: 127.x.y.z),
  checked once per ``--interval`` for ``--rounds`` by each prober in turn: ICMP echo, a
  SYN to a closed port (the kernel's RST), and today's connect to the same closed port.
  Prints per prober the wall time of a round (must end within the interval), the CPU
  (user+sys of the probing process, medians over the rounds) per round and per 1,000
  node-checks, and the CPU as a share of one core at one round per interval. Each prober
  runs in child processes of ``--block`` rounds; ``--against DIR`` (``DIR/b300`` a link to
  another checkout's ``daemon/``) runs that checkout's prober too, block by block in turn
  with this one's, so that both see the same load. "states" is the CPU of the rest of the
  daemon's round: the results folded into the per-node states (b300.liveness.machine). On
  loopback the "node's" kernel work (answering the echo, the SYN) runs in the prober's
  system call and is counted as ours.
- ``table``: a host in a network namespace of its own (tests/liveness/netns.py) in each
  failure, and what each probe reports: alive, powered off (link down), all packets
  lost, ICMP echo ignored, slurmd dead (nothing listens), slurmd frozen (SIGSTOP).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "liveness"))

from b300.liveness.icmp import IcmpProber  # noqa: E402
from b300.liveness.machine import NodeLiveness, observe_checks  # noqa: E402
from b300.liveness.rounds import PrimaryProber  # noqa: E402
from b300.liveness.syn import SynProber  # noqa: E402
from b300.liveness.tcp import TcpProber  # noqa: E402
from b300.liveness.timing import LivenessConfig  # noqa: E402
from b300.liveness.verdicts import Target  # noqa: E402

CLOSED = 9  # discard: nothing listens on loopback here


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _targets(n: int) -> list[Target]:
    return [Target(f"n{i}", f"127.{(i >> 16) & 255}.{(i >> 8) & 255}.{(i & 255) or 1}"
                   if i & 255 else f"127.{(i >> 16) & 255}.{((i >> 8) & 255) + 100}.254", CLOSED)
            for i in range(1, n + 1)]


def _probers(interval: float) -> dict[str, PrimaryProber]:
    return {
        "icmp": IcmpProber(timeout_s=0.8 * interval, max_in_flight=4096),
        "syn": SynProber(timeout_s=0.8 * interval, max_in_flight=4096),
        "connect": TcpProber(timeout_s=0.8 * interval, max_in_flight=512),
    }


def rounds(probe: str, nodes: int, count: int, interval: float) -> None:
    """``count`` rounds of one prober (after one untimed round): one JSON line of
    [wall, user, sys] per round and the outcomes (the child of ``cost``)."""
    targets = _targets(nodes)
    prober = _probers(interval)[probe]
    prober.check(targets, interval)  # warm up: imports, the first round's buffers
    samples = []
    outcomes: Counter[str] = Counter()
    config = LivenessConfig()
    states: Mapping[str, NodeLiveness] = {}
    for _ in range(count):
        w0, r0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
        results = prober.check(targets, interval)
        wall, r1 = time.monotonic() - w0, resource.getrusage(resource.RUSAGE_SELF)
        # The rest of the daemon's round: the results into the per-node states.
        states = observe_checks(states, results, datetime.now(UTC), config).states
        r2 = resource.getrusage(resource.RUSAGE_SELF)
        samples.append([wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime,
                        r2.ru_utime + r2.ru_stime - r1.ru_utime - r1.ru_stime])
        outcomes.update(r.outcome.value for r in results)
        time.sleep(max(0.0, interval - (time.monotonic() - w0)))
    print(json.dumps({"samples": samples, "outcomes": outcomes}))


def cost(nodes: int, count: int, interval: float, probes: list[str], against: str | None, block: int) -> None:
    """Each prober's rounds in child processes, ``block`` rounds at a time; with ``against``
    (a folder holding a ``b300`` package) that checkout's prober too, block by block in
    turn with this one's, so that both see the same load. Medians over the rounds."""
    sides = {"this": os.environ.get("PYTHONPATH", "")} | ({"against": against} if against else {})
    assert len({t.host for t in _targets(nodes)}) == nodes
    print(f"{nodes} targets, {count} rounds at {interval:g} s, load {os.getloadavg()[0]:.1f}")
    print(f"{'probe':8} {'side':8} {'wall/round p50':>15} {'max':>8} {'cpu/round p50':>13} {'user':>6} "
          f"{'sys':>6} {'cpu/1000':>9} {'core %':>7} {'states':>10}  outcomes")
    summary = {}
    for probe in probes:
        got: dict[str, list[list[float]]] = {side: [] for side in sides}
        outcomes: dict[str, Counter[str]] = {side: Counter() for side in sides}
        for _ in range(-(-count // block)):
            for side, path in sides.items():
                env = dict(os.environ, PYTHONPATH=path) if path else dict(os.environ)
                argv = [sys.executable, __file__, "rounds", "--probe", probe, "--nodes", str(nodes),
                        "--rounds", str(block), "--interval", str(interval)]
                out = subprocess.run(argv,
                                     capture_output=True, text=True, timeout=600, env=env, check=True)
                line = json.loads(out.stdout.splitlines()[-1])
                got[side] += line["samples"]
                outcomes[side].update(line["outcomes"])
        for side, samples in got.items():
            wall = statistics.median(x[0] for x in samples)
            cpu = statistics.median(x[1] + x[2] for x in samples)
            user = statistics.median(x[1] for x in samples)
            system = statistics.median(x[2] for x in samples)
            machine = statistics.median(x[3] for x in samples)
            summary[f"{probe}/{side}"] = {"cpu_ms": cpu * 1000, "user_ms": user * 1000, "sys_ms": system * 1000,
                                          "wall_ms": wall * 1000, "states_ms": machine * 1000,
                                          "rounds": len(samples)}
            print(f"{probe:8} {side:8} {wall * 1000:13.0f}ms {max(x[0] for x in samples) * 1000:6.0f}ms "
                  f"{cpu * 1000:11.1f}ms {user * 1000:6.1f} {system * 1000:6.1f} {cpu / nodes * 1e6:7.1f}ms "
                  f"{cpu / interval * 100:6.1f}% {machine * 1000:8.1f}ms  {dict(outcomes[side])}")
    print(json.dumps({"nodes": nodes, "interval": interval, "load": os.getloadavg()[0], "sides": sides,
                      "probes": summary}))


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
    ap.add_argument("mode", choices=["cost", "table", "rounds"])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--probes", default="icmp,syn,connect", help="cost: which probers, in this order")
    ap.add_argument("--probe", choices=["icmp", "syn", "connect"], help="rounds: the prober")
    ap.add_argument("--against", help="cost: also measure DIR/b300, block by block in turn with this one")
    ap.add_argument("--block", type=int, default=5, help="cost: rounds per child process")
    a = ap.parse_args()
    if a.mode == "cost":
        probes = a.probes.split(",")
        if not probes or any(p not in ("icmp", "syn", "connect") for p in probes) or a.block < 1:
            sys.exit(f"cost: bad --probes {a.probes!r} or --block {a.block}")
        cost(a.nodes, a.rounds, a.interval, probes, a.against, a.block)
    elif a.mode == "rounds":
        if a.probe is None:
            sys.exit("rounds: --probe is required")
        rounds(a.probe, a.nodes, a.rounds, a.interval)
    else:
        table()


if __name__ == "__main__":
    main()
