"""Benchmark: what a liveness check of every node in use costs the login node.

    python tests/bench/bench_liveness.py tcp   [--nodes 1000] [--rounds 60] [--interval 1.0] [--hog 0]
    python tests/bench/bench_liveness.py ssh   [--sshd 8] [--conns 128] [--rounds 20]
    python tests/bench/bench_liveness.py slurm [--calls 20]            (needs SLURM_CONF)

- ``tcp`` (the chosen primary check): ``--nodes`` listening sockets on loopback, served by a
  child process that accepts and closes like a real slurmd, checked by
  :class:`b300.liveness.tcp.TcpProber` once per ``--interval`` for ``--rounds``. Prints the
  prober's CPU (user+sys of this process) per round and per 1,000 node-checks, the
  latency percentiles and every check that was not OK (the miss rate that
  docs/design/liveness.md turns into a false-positive rate). ``--hog N`` runs N busy processes
  beside it (nice 0) to measure under load.
- ``ssh``: ``--sshd`` real OpenSSH servers on loopback (the drift tests' simulated nodes),
  ``--conns`` persistent paramiko connections spread over them; each round sends one
  keepalive ``global_request`` on every connection. Prints CPU per 1,000 round trips, the
  idle CPU of holding the connections, and a fresh connect + ``exec true`` (the
  confirmation check) per node. Extrapolated to 1,000 connections in the output.
- ``slurm``: ``sinfo -N`` (all nodes' states in one call) and ``scontrol ping``
  (the controller only): CPU of the child processes and wall time per call.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "drift"))

from b300.drift.scan_records import Endpoint, SshSettings  # noqa: E402
from b300.liveness.tcp import TcpProber  # noqa: E402
from b300.liveness.verdicts import CheckOutcome, Target  # noqa: E402

_SERVE = r"""
import os, resource, selectors, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n = int(sys.argv[1])
sel = selectors.DefaultSelector()
ports = []
for _ in range(n):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(4096); s.setblocking(False)
    sel.register(s, selectors.EVENT_READ); ports.append(s.getsockname()[1])
print(" ".join(map(str, ports)), flush=True)
while True:
    for key, _ in sel.select(1.0):
        try:
            c, _ = key.fileobj.accept(); c.close()
        except OSError:
            pass
"""


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@contextmanager
def _hogs(n: int) -> Iterator[None]:
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def bench_tcp(args: argparse.Namespace) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the daemon does this at start-up
    server = subprocess.Popen([sys.executable, "-c", _SERVE, str(args.nodes)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        ports = [int(p) for p in server.stdout.readline().split()]
        targets = [Target(f"n{i:04d}", "127.0.0.1", port) for i, port in enumerate(ports)]
        prober = TcpProber(timeout_s=args.timeout, max_in_flight=args.in_flight)
        prober.check(targets, args.interval)  # warm up (imports, first connections)
        cpu_rounds: list[float] = []
        wall_rounds: list[float] = []
        latencies: list[float] = []
        bad: Counter[str] = Counter()
        with _hogs(args.hog):
            next_at = time.monotonic()
            for _ in range(args.rounds):
                next_at += args.interval
                c0, w0 = _cpu(), time.monotonic()
                results = prober.check(targets, args.interval)
                cpu_rounds.append(_cpu() - c0)
                wall_rounds.append(time.monotonic() - w0)
                for r in results:
                    if r.outcome is CheckOutcome.OK:
                        latencies.append(r.latency_s)
                    else:
                        bad[f"{r.outcome.value} {r.detail}"] += 1
                time.sleep(max(0.0, next_at - time.monotonic()))
        checks = args.nodes * args.rounds
        per_round = statistics.median(cpu_rounds)
        print(f"tcp: {args.nodes} nodes x {args.rounds} rounds every {args.interval:g} s, timeout "
              f"{args.timeout:g} s, {args.hog} hog(s), load {os.getloadavg()[0]:.1f}")
        print(f"  CPU per round: median {per_round * 1000:.1f} ms, max {max(cpu_rounds) * 1000:.1f} ms; "
              f"per 1,000 node-checks {per_round / args.nodes * 1000 * 1000:.1f} ms; "
              f"{per_round / args.interval * 100:.1f}% of one core at this interval")
        print(f"  wall per round: median {statistics.median(wall_rounds) * 1000:.1f} ms, "
              f"max {max(wall_rounds) * 1000:.1f} ms")
        print(f"  latency of an answered check: p50 {_pct(latencies, 0.5) * 1e6:.0f} us, "
              f"p99 {_pct(latencies, 0.99) * 1e6:.0f} us, max {max(latencies) * 1e3:.1f} ms")
        print(f"  not OK: {sum(bad.values())} of {checks} checks" + "".join(
            f"\n    {n} x {what}" for what, n in bad.most_common()))
    finally:
        server.kill()
        server.wait(10)


def bench_ssh(args: argparse.Namespace) -> None:
    import drift_nodes as dn
    import paramiko

    from b300.drift.ssh import ParamikoRunner

    base_port = int(os.environ.get("B300_SSHD_PORT_BASE", "22201"))
    with tempfile.TemporaryDirectory(prefix="b300-bench-live-") as tmp:
        base = Path(tmp)
        key = dn.client_key(base)
        auth = base / "authorized_keys"
        auth.write_text(Path(f"{key}.pub").read_text())
        nodes = [dn.make_node(base, f"s{i}", base_port + i, dn.Versions(), auth) for i in range(args.sshd)]
        known = base / "known_hosts"
        known.write_text("".join(n.known_hosts_line() for n in nodes))
        dn.start(nodes)
        clients: list[paramiko.SSHClient] = []
        try:
            c0, w0 = _cpu(), time.monotonic()
            for i in range(args.conns):
                c = paramiko.SSHClient()
                c.load_host_keys(str(known))
                c.set_missing_host_key_policy(paramiko.RejectPolicy())
                c.connect("127.0.0.1", port=nodes[i % len(nodes)].port, username="root",
                          key_filename=str(key), allow_agent=False, look_for_keys=False, timeout=10)
                clients.append(c)
            connect_cpu = (_cpu() - c0) / args.conns
            print(f"ssh: {args.conns} persistent connections over {args.sshd} sshd, load "
                  f"{os.getloadavg()[0]:.1f}")
            print(f"  connect (key exchange + auth): {connect_cpu * 1000:.1f} ms CPU each, "
                  f"{(time.monotonic() - w0) / args.conns * 1000:.0f} ms wall each (serial)")
            transports = [c.get_transport() for c in clients]
            c0 = _cpu()
            time.sleep(5.0)
            idle = (_cpu() - c0) / 5.0
            print(f"  holding them idle: {idle * 1000:.1f} ms CPU per second "
                  f"({idle / args.conns * 1000 * 1000:.1f} ms/s per 1,000 connections), "
                  f"{threading.active_count()} threads")
            lat: list[float] = []
            cpu_rounds = []
            for _ in range(args.rounds):
                c0 = _cpu()
                done: list[float] = []

                def one(t: paramiko.Transport, done: list[float] = done) -> None:
                    t0 = time.monotonic()
                    t.global_request("keepalive@openssh.com", wait=True)
                    done.append(time.monotonic() - t0)
                threads = [threading.Thread(target=one, args=(t,)) for t in transports if t is not None]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(30)
                cpu_rounds.append(_cpu() - c0)
                lat.extend(done)
            per = statistics.median(cpu_rounds) / args.conns
            print(f"  keepalive round trip: {per * 1e3 * 1000:.0f} ms CPU per 1,000 checks "
                  f"(one thread per check, as paramiko's wait=True needs); latency p50 "
                  f"{_pct(lat, 0.5) * 1000:.1f} ms p99 {_pct(lat, 0.99) * 1000:.1f} ms")
            print(f"  extrapolated to 1,000 nodes: {per * 1000:.2f} s CPU per round + "
                  f"{idle / args.conns * 1000:.2f} s per second to hold 1,000 connections "
                  f"(1,000 paramiko transport threads)")
            settings = SshSettings(user="root", known_hosts=str(known), key_file=str(key),
                                   connect_timeout_s=5, command_timeout_s=10, concurrency=8)
            runner = ParamikoRunner(settings, {n.name: Endpoint("127.0.0.1", n.port) for n in nodes})
            c0, w0 = _cpu(), time.monotonic()
            runs = runner.run([n.name for n in nodes], {"alive": "true"})
            ok = sum(r.status.value == "ok" for r in runs.values())
            print(f"  fresh connect + exec true (the confirmation check), {len(nodes)} nodes at once: "
                  f"{(_cpu() - c0) / len(nodes) * 1000:.0f} ms CPU per node, "
                  f"{time.monotonic() - w0:.2f} s wall for all, {ok}/{len(nodes)} answered")
            for c in clients:
                c.close()  # the confirmations below run without the pooled connections
            clients.clear()
            _confirm_rounds(args, settings, {n.name: Endpoint("127.0.0.1", n.port) for n in nodes})
        finally:
            for c in clients:
                c.close()
            dn.stop(nodes)


def _confirm_rounds(args: argparse.Namespace, settings: SshSettings, addresses: dict[str, Endpoint]) -> None:
    """The confirmation as the monitor runs it (liveness defaults), on live nodes: how often
    it fails a node that is alive (the q of docs/design/liveness.md) and how long it takes."""
    from b300.liveness.confirm import SshConfirmer, confirm_runner
    from b300.liveness.timing import LivenessConfig
    config = LivenessConfig()
    confirmer = SshConfirmer(confirm_runner(settings, addresses, config))
    outcomes: Counter[str] = Counter()
    lat: list[float] = []
    for _ in range(args.confirm_rounds):
        for r in confirmer.confirm(sorted(addresses)):
            outcomes[r.outcome.value] += 1
            lat.append(r.latency_s)
    print(f"  confirmations of live nodes ({args.confirm_rounds} rounds of {len(addresses)} at once, "
          f"confirm_timeout_s {config.confirm_timeout_s:g}): {dict(outcomes)}; "
          f"round p50 {_pct(lat, 0.5):.2f} s max {max(lat):.2f} s; load {os.getloadavg()[0]:.1f}")


def bench_slurm(args: argparse.Namespace) -> None:
    for argv in (["sinfo", "-h", "-N", "-o", "%N %T"], ["scontrol", "ping"]):
        walls = []
        c0 = _children_cpu()
        for _ in range(args.calls):
            w0 = time.monotonic()
            subprocess.run(argv, capture_output=True, check=True, timeout=30)
            walls.append(time.monotonic() - w0)
        cpu = (_children_cpu() - c0) / args.calls
        print(f"{' '.join(argv)}: {cpu * 1000:.1f} ms CPU per call (the tool; slurmctld's share not "
              f"counted), wall p50 {_pct(walls, 0.5) * 1000:.0f} ms max {max(walls) * 1000:.0f} ms; "
              f"load {os.getloadavg()[0]:.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tcp")
    t.add_argument("--nodes", type=int, default=1000)
    t.add_argument("--rounds", type=int, default=60)
    t.add_argument("--interval", type=float, default=1.0)
    t.add_argument("--timeout", type=float, default=0.8)
    t.add_argument("--in-flight", type=int, default=512)
    t.add_argument("--hog", type=int, default=0)
    s = sub.add_parser("ssh")
    s.add_argument("--sshd", type=int, default=8)
    s.add_argument("--conns", type=int, default=128)
    s.add_argument("--rounds", type=int, default=20)
    s.add_argument("--confirm-rounds", type=int, default=25)
    sl = sub.add_parser("slurm")
    sl.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    {"tcp": bench_tcp, "ssh": bench_ssh, "slurm": bench_slurm}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
