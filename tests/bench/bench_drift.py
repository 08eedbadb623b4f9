#!/usr/bin/env python3
"""Benchmark: a drift scan of 64 sshd nodes, ours (paramiko) beside ClusterShell's ``clush``.

    python tests/bench/bench_drift.py [--nodes 64] [--rounds 3] [--concurrency 64]

1. Starts ``--nodes`` real sshd instances on loopback (ports 23000 up), each a
   simulated GPU node with its own host key and stand-in vendor tools (see
   ``tests/drift/drift_nodes.py``).
2. Each round: one full :class:`DriftScanner` scan with the default probes
   (every installed probe; the image probe is off as no image is configured),
   into a fresh SQLite store, then ``clush`` running the very same probe
   script on the same nodes (fanout = ``--concurrency``, one ssh per node, host
   keys checked against the same known_hosts file).
3. Wall time and CPU: ours is this process (all its threads); clush's is its
   process and its ssh children (RUSAGE_CHILDREN). sshd and the remote shells
   run the same work for both and are counted for neither.
4. Prints a table (median of the rounds), the ratio and the time projected for
   1,000 nodes at the same concurrency (linear in the number of waves), then one
   JSON line. Every sshd it started is stopped at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "drift"))

import drift_nodes as dn  # noqa: E402

from b300.config.tables.drift import parse_drift_config  # noqa: E402
from b300.drift.plugins import load_probes  # noqa: E402
from b300.drift.scan_records import NodeStatus  # noqa: E402
from b300.drift.scanner import DriftScanner  # noqa: E402
from b300.drift.ssh import ParamikoRunner, probe_script  # noqa: E402
from b300.slurm.cli import CliSlurmClient  # noqa: E402
from b300.store import open_store  # noqa: E402


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--base-port", type=int, default=23000)
    args = ap.parse_args()
    if shutil.which("clush") is None:
        print("clush not found (pip install ClusterShell)", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="b300-bench-drift-"))
    key = dn.client_key(base)
    auth = base / "authorized_keys"
    auth.write_text(Path(f"{key}.pub").read_text())
    nodes = [dn.make_node(base, f"n{i:03d}", args.base_port + i, dn.Versions(), auth)
             for i in range(args.nodes)]
    known = base / "known_hosts"
    known.write_text("".join(n.known_hosts_line() for n in nodes))
    ssh_config = base / "ssh_config"
    ssh_config.write_text("".join(
        f"Host {n.name}\n  HostName 127.0.0.1\n  Port {n.port}\n  User root\n  IdentityFile {key}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
        for n in nodes))
    try:
        t0 = time.monotonic()
        dn.start(nodes, timeout=60)
        print(f"{len(nodes)} sshd up in {time.monotonic() - t0:.1f} s", flush=True)
        cfg = parse_drift_config({
            "known_hosts": str(known), "key_file": str(key), "concurrency": args.concurrency,
            "command_timeout": "60s", "connect_timeout": "20s",
            "nodes": {n.name: {"host": "127.0.0.1", "port": n.port} for n in nodes}}, "bench")
        probes = load_probes(cfg.probes)
        commands = {name: c for name, p in probes.items() if (c := p.command(cfg.settings)) is not None}
        ours, theirs = [], []
        for rnd in range(args.rounds):
            with open_store(f"sqlite:///{base / f'state{rnd}.db'}") as store:
                scanner = DriftScanner(cfg, store.drift, CliSlurmClient(), probes=probes,
                                       runner=ParamikoRunner(cfg.ssh, cfg.endpoints()))
                c0, w0 = _cpu(resource.RUSAGE_SELF), time.monotonic()
                result = scanner.scan(None, datetime.now(UTC))
                wall, cpu = time.monotonic() - w0, _cpu(resource.RUSAGE_SELF) - c0
            ok = sum(r.status is NodeStatus.OK for r in result.reports)
            ours.append((wall, cpu, ok, len(result.findings)))
            script = probe_script(commands, secrets.token_hex(8))
            c0, w0 = _cpu(resource.RUSAGE_CHILDREN), time.monotonic()
            proc = subprocess.run(
                ["clush", "-f", str(args.concurrency), "-w", ",".join(n.name for n in nodes),
                 "-O", f"ssh_options=-F {ssh_config}", "-t", "20", "-u", "60", script],
                capture_output=True, text=True, timeout=600, check=False)
            wall, cpu = time.monotonic() - w0, _cpu(resource.RUSAGE_CHILDREN) - c0
            answered = len({line.split(":", 1)[0] for line in proc.stdout.splitlines()
                            if ":end:kernel:0" in line})
            theirs.append((wall, cpu, answered, proc.returncode))
            print(f"round {rnd + 1}: ours {ours[-1][0]:.2f} s wall {ours[-1][1]:.2f} s CPU ({ok} ok, "
                  f"{ours[-1][3]} findings) | clush {wall:.2f} s wall {cpu:.2f} s CPU ({answered} answered, "
                  f"exit {proc.returncode})", flush=True)
    finally:
        dn.stop(nodes)
        shutil.rmtree(base, ignore_errors=True)
    o_wall, o_cpu = statistics.median(x[0] for x in ours), statistics.median(x[1] for x in ours)
    c_wall, c_cpu = statistics.median(x[0] for x in theirs), statistics.median(x[1] for x in theirs)
    waves = math.ceil(1000 / args.concurrency) / math.ceil(args.nodes / args.concurrency)
    print(f"\n{args.nodes} nodes, {len(commands)} probes ({', '.join(commands)}), concurrency "
          f"{args.concurrency}, median of {args.rounds} rounds")
    print(f"{'':8}{'wall s':>10}{'CPU s':>10}{'1,000 nodes (s, projected)':>30}")
    print(f"{'b300':8}{o_wall:>10.2f}{o_cpu:>10.2f}{o_wall * waves:>30.1f}")
    print(f"{'clush':8}{c_wall:>10.2f}{c_cpu:>10.2f}{c_wall * waves:>30.1f}")
    print(f"ratio clush/b300: wall {c_wall / o_wall:.2f}x, CPU {c_cpu / o_cpu:.2f}x")
    print(json.dumps({"nodes": args.nodes, "probes": list(commands), "concurrency": args.concurrency,
                      "rounds": args.rounds, "ours": ours, "clush": theirs, "ours_wall_s": o_wall,
                      "ours_cpu_s": o_cpu, "clush_wall_s": c_wall, "clush_cpu_s": c_cpu,
                      "projected_1000_ours_s": o_wall * waves, "projected_1000_clush_s": c_wall * waves}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
