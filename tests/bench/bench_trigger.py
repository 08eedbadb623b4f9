"""Benchmark: from slurmctld setting a node DOWN to b300d acting on it.

A real b300d (SQLite, poll interval 300 s so that only the trigger can wake it)
arms its PERM ``strigger --node --down`` on the local cluster. Each event kills
an idle node's slurmd (``localcluster.sh kill-node``) and sets the node DOWN at
once (``scontrol update state=down``, so that the instant is known to the client
to the millisecond instead of waiting out SlurmdTimeout; a node whose slurmd
lives would be returned to service by ReturnToService=2), at a random phase
(the bench waits 0-15 s first), then reads three times:

- ``wake``: the daemon logged the trigger's ``control.wake`` (slurmctld ran the
  trigger program, which reached the daemon's socket);
- ``acted``: the daemon's cycle recorded the node DOWN (its ``node.state`` event);
- the trigger program's own run time, and that of the program this release
  replaced (``python -m b300.ctl notify node-down``), each timed on its own.

The node is restarted and resumed (and the daemon woken until it sees it idle)
before the next event. Run as root with the cluster up (about 20 s per event):

    python tests/bench/bench_trigger.py [--events 10] [--node gpu04]

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchlib import CLUSTER, sh, wait


def log_lines(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def ts(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()


def node_events(url: str, node: str, state: str, after: float) -> list[float]:
    from b300.store import open_store

    store = open_store(url)
    try:
        return [e.ts.timestamp() for e in store.events(kinds=["node.state"])
                if e.node == node and str(e.data.get("state", "")).upper().startswith(state)
                and e.ts.timestamp() >= after]
    finally:
        store.close()


def time_program(argv: list[str], runs: int) -> float:
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, capture_output=True, timeout=60, check=True)
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=10)
    ap.add_argument("--node", default="gpu04", help="an idle node with no jobs")
    args = ap.parse_args()
    conf = os.environ.get("SLURM_CONF")
    if not conf or os.geteuid() != 0:
        raise SystemExit("run as root with SLURM_CONF set (eval \"$(bash deploy/localcluster.sh env)\")")
    tmp = Path(tempfile.mkdtemp(prefix="b300-bench-trigger-", dir="/var/tmp"))
    state = tmp / "state"
    state.mkdir()
    cfg = tmp / "b300.toml"
    cfg.write_text(f'[daemon]\nmode = "act"\nstate_dir = "{state}"\npoll_interval = "300s"\n'
                   f'log_format = "json"\nlog_level = "info"\n[slurm]\nbackend = "cli"\nconf = "{conf}"\n')
    url = f"sqlite:///{state}/state.db"
    log = tmp / "b300d.log"
    env = {**os.environ, "SLURM_CONF": conf}
    with open(log, "ab") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "b300.app.main", "--config", str(cfg)],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
    program = state / "node-down-trigger"
    rows: list[dict[str, float]] = []
    try:
        wait(lambda: any(r.get("event") == "trigger.armed" for r in log_lines(log)), 60, "trigger.armed", 0.05)
        print(f"slurm {sh('sinfo', '-V').strip()}; trigger program {program}")
        from b300.control.server import call_daemon

        for i in range(args.events):
            time.sleep(random.uniform(0, 15))  # noqa: S311 - a random phase against the trigger pass
            seen = len(log_lines(log))
            sh("bash", str(CLUSTER), "kill-node", args.node)
            t_down = time.time()
            sh("scontrol", "update", f"NodeName={args.node}", "State=DOWN", "Reason=bench_trigger")
            wake = wait(lambda s=seen: [r for r in log_lines(log)[s:] if r.get("event") == "control.wake"],
                        120, "the trigger's wake", every=0.5)[0]
            acted = wait(lambda t=t_down: node_events(url, args.node, "DOWN", t), 60, "node.state DOWN",
                         every=0.5)[0]
            rows.append({"wake": ts(wake) - t_down, "acted": acted - t_down})
            print(f"event {i + 1:2d}: DOWN -> wake {rows[-1]['wake']:5.2f} s, -> acted "
                  f"{rows[-1]['acted']:5.2f} s", flush=True)
            sh("bash", str(CLUSTER), "restart-node", args.node, timeout=180)
            t_up = time.time()
            # restart-node usually returns it already (ReturnToService=2); resume if not.
            subprocess.run(["scontrol", "update", f"NodeName={args.node}", "State=RESUME"],
                           capture_output=True, timeout=30, check=False)
            for _ in range(60):  # wake the daemon until its cycle has seen the node idle again
                call_daemon(str(state / "b300d.sock"), {"op": "wake", "why": "bench: resumed"}, timeout=30)
                time.sleep(1)
                if node_events(url, args.node, "IDLE", t_up):
                    break
            else:
                raise SystemExit("the daemon never saw the node idle again")
        new_prog = time_program([str(program), "bench"], 10)
        old_prog = time_program([sys.executable, "-m", "b300.ctl", "--config", str(cfg), "notify",
                                 "node-down", "bench"], 10)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        subprocess.run(["bash", str(CLUSTER), "restart-node", args.node],
                       capture_output=True, env=env, timeout=180, check=False)
        subprocess.run(["scontrol", "update", f"NodeName={args.node}", "State=RESUME"],
                       capture_output=True, env=env, timeout=30, check=False)
        out = sh("strigger", "--get")
        for line in out.splitlines()[1:]:
            f = line.split()
            if f and f[0].isdigit() and f[-1] == str(program):
                sh("strigger", "--clear", f"--id={f[0]}")
    wake_s = sorted(r["wake"] for r in rows)
    acted_s = sorted(r["acted"] for r in rows)
    result = {
        "events": len(rows),
        "wake_median_s": round(statistics.median(wake_s), 2), "wake_min_s": round(wake_s[0], 2),
        "wake_max_s": round(wake_s[-1], 2),
        "acted_median_s": round(statistics.median(acted_s), 2), "acted_min_s": round(acted_s[0], 2),
        "acted_max_s": round(acted_s[-1], 2),
        "program_s": round(new_prog, 3), "old_program_s": round(old_prog, 3),
    }
    print(f"DOWN -> daemon acting over {len(rows)} events: median {result['acted_median_s']} s, "
          f"range {result['acted_min_s']}-{result['acted_max_s']} s (wake: median "
          f"{result['wake_median_s']} s); trigger program {new_prog * 1000:.0f} ms "
          f"(python -m b300.ctl notify: {old_prog * 1000:.0f} ms)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
