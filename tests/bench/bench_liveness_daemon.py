#!/usr/bin/env python3
"""Benchmark: b300d's own CPU with active failure localisation on and off (issue 14).

A real b300d tracks one run whose job holds ``--nodes`` nodes of the local cluster,
for ``--minutes`` minutes, once with ``[liveness] enabled = true`` (every node in use
checked by a TCP connect to its slurmd each ``interval_s``, 1 s by default) and once
with ``enabled = false`` (it is on by default wherever ``[drift]`` reaches the nodes);
the two alternate ``--pairs`` times. For each it prints the daemon's CPU seconds (its
own, and its reaped children's: the Slurm tools it runs) over the window, from
``/proc/PID/stat``, and the share of one core. The liveness check confirms a suspect
over SSH, so both daemons get the same ``[drift]`` section (one real sshd per node on
loopback, as the drift tests run them; no scheduled scans): the only difference between
the two is ``[liveness]``.

    B300_NODES=64 B300_CLUSTER_DIR=/var/tmp/b300-cluster-l64 B300_CLUSTER_NAME=l64 \\
        B300_PORT_BASE=29000 bash deploy/localcluster.sh up
    eval "$(B300_NODES=64 B300_CLUSTER_DIR=... bash deploy/localcluster.sh env)"
    python tests/bench/bench_liveness_daemon.py --nodes 64 --minutes 10

Needs the cluster up (SLURM_CONF) with at least ``--nodes`` idle nodes; cancels its
job and stops its daemon on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "drift"))

import drift_nodes as dn  # noqa: E402

from helpers import DaemonHandle, cancel_test_jobs, make_daemon, write_spec  # noqa: E402

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> tuple[float, float]:
    """(own CPU s, reaped children's CPU s) of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / _TICKS, (cutime + cstime) / _TICKS


def _one(mode: str, nodes: int, minutes: float, conf: str, poll: str, drift: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"b300-bench-live-{mode}-"))
    d: DaemonHandle = make_daemon(tmp, conf, poll_interval=poll, log_level="info")
    d.config.write_text(d.config.read_text() + drift
                        + f"[liveness]\nenabled = {'true' if mode == 'on' else 'false'}\n")
    d.start()
    try:
        on = '"liveness.on"' in d.log.read_text()
        if on != (mode == "on"):
            raise SystemExit(f"the '{mode}' daemon has liveness {'on' if on else 'off'}: see {d.log}")
        hold = int(minutes * 60 + 300)
        spec = write_spec(tmp / "job.toml", f"bench-live-{mode}", f"sleep {hold}", nodes=nodes,
                          time_limit=f"{hold // 3600:02d}:{hold % 3600 // 60 + 5:02d}:00")
        run_id = d.submit(spec)
        d.wait_run(run_id, {"RUNNING"}, timeout=300)
        assert d.proc is not None
        time.sleep(20)  # past the first cycles and the first liveness rounds
        pid = d.proc.pid
        self0, kids0 = _cpu(pid)
        t0 = time.monotonic()
        load0 = os.getloadavg()[0]
        deadline = t0 + minutes * 60
        while time.monotonic() < deadline:
            time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
            if d.proc.poll() is not None:
                raise SystemExit(f"b300d exited {d.proc.returncode}: see {d.log}")
        self1, kids1 = _cpu(pid)
        wall = time.monotonic() - t0
        state = d.run(run_id)["run"]["state"]
        return {"mode": mode, "nodes": nodes, "wall_s": round(wall, 1), "self_cpu_s": round(self1 - self0, 2),
                "children_cpu_s": round(kids1 - kids0, 2),
                "core_pct": round(100 * (self1 - self0 + kids1 - kids0) / wall, 2),
                "self_core_pct": round(100 * (self1 - self0) / wall, 2),
                "load": [round(load0, 1), round(os.getloadavg()[0], 1)], "run_state_after": state,
                "log": str(d.log)}
    finally:
        d.kill(signal.SIGTERM)
        cancel_test_jobs(conf, d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--pairs", type=int, default=1, help="off/on pairs, alternating (1)")
    ap.add_argument("--poll", default="10s", help="the daemon's poll_interval (10s)")
    ap.add_argument("--ssh-port", type=int, default=29600, help="first loopback port of the sshd nodes")
    args = ap.parse_args()
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        print("bench_liveness_daemon: SLURM_CONF is not set (eval localcluster.sh env first)", file=sys.stderr)
        return 2
    names = [f"gpu{i:02d}" for i in range(1, args.nodes + 1)]
    base = Path(tempfile.mkdtemp(prefix="b300-bench-live-sshd-"))
    with dn.fleet(base, {n: dn.Versions() for n in names}, args.ssh_port) as sim:
        drift = dn.drift_section(sim, command_timeout="20s")
        pairs = [("off", "on") if i % 2 == 0 else ("on", "off") for i in range(args.pairs)]
        results = [_report(_one(mode, args.nodes, args.minutes, conf, args.poll, drift))
                   for pair in pairs for mode in pair]
    print(json.dumps({"bench": "liveness_daemon", "results": results}))
    return 0


def _report(r: dict[str, Any]) -> dict[str, Any]:
    print(f"  liveness {r['mode']:3}  {r['nodes']} nodes  {r['wall_s']:.0f} s: daemon {r['self_cpu_s']:.2f} s "
          f"CPU + Slurm tools {r['children_cpu_s']:.2f} s = {r['core_pct']:.2f}% of a core "
          f"(load {r['load'][0]}-{r['load'][1]}; run {r['run_state_after']})", flush=True)
    return r


if __name__ == "__main__":
    sys.exit(main())
