"""Benchmark: a node drained for a transient fault -> triaged -> returned, through a real b300d.

    python tests/bench/bench_triage.py [--runs 5] [--node gpu01] [--interval 1s] [--poll 1s]

On the local cluster that ``SLURM_CONF`` names, as root: a b300d with ``[triage] enabled``
and the shipped node check (no GPU tools on the test nodes: the GPU checks say "skip";
Xid from an empty kernel log file, the local disk, InfiniBand absent). Each run drains
``--node`` with the daemon's own reason for a dead node (the fault is gone: the node is
healthy), then times, from the drain: ``triage.started`` (reservation made, node resumed
inside it, job submitted), the job running, the ``triage.verdict``, and the node out of
DRAIN with the reservation gone (returned). Prints each run, the medians, and last one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from b300.events import Kind  # noqa: E402
from b300.store import open_store  # noqa: E402
from helpers import make_daemon  # noqa: E402

REASON = "b300: node dead (b300d checks): bench transient fault"


def sh(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=True).stdout


def kinds_seen(url: str, node: str, after: int) -> dict[str, int]:
    store = open_store(url)
    try:
        return {e.kind: e.id for e in store.events(node=node, after_id=after,
                                                     kinds=[Kind.TRIAGE_STARTED, Kind.TRIAGE_VERDICT])}
    finally:
        store.close()


def last_id(url: str) -> int:
    store = open_store(url)
    try:
        evs = store.events()
        return evs[-1].id if evs else 0
    finally:
        store.close()


def one_run(url: str, node: str, timeout: float = 300.0) -> dict[str, float]:
    after = last_id(url)
    t0 = time.monotonic()
    sh("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={REASON}")
    marks: dict[str, float] = {}
    while time.monotonic() - t0 < timeout:
        now = time.monotonic() - t0
        seen = kinds_seen(url, node, after)
        if Kind.TRIAGE_STARTED in seen:
            marks.setdefault("started", now)
        if "started" in marks and "running" not in marks and "RUNNING" in sh(
                "squeue", "-h", f"--name=b300-triage-{node}", "-o", "%T"):
            marks["running"] = now
        if Kind.TRIAGE_VERDICT in seen:
            marks.setdefault("verdict", now)
            state = sh("scontrol", "show", "node", node, "-o")
            if "DRAIN" not in state.split("State=")[1].split()[0] and \
                    f"b300-triage-{node}" not in sh("scontrol", "show", "reservation", "-o"):
                marks["returned"] = now
                return marks
        time.sleep(0.2)
    raise SystemExit(f"bench_triage: {node} not returned within {timeout:.0f} s (marks {marks})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--node", default="gpu01")
    ap.add_argument("--interval", default="1s", help="[triage] interval_s as a duration (1s, 60s)")
    ap.add_argument("--poll", default="1s", help="[daemon] poll_interval")
    args = ap.parse_args()
    if "SLURM_CONF" not in os.environ or args.runs < 1:
        print("bench_triage: needs SLURM_CONF (the local cluster) and --runs >= 1", file=sys.stderr)
        return 2
    interval = float(args.interval.rstrip("s"))
    with tempfile.TemporaryDirectory(prefix="bench-triage-") as tmp:
        d = make_daemon(Path(tmp), os.environ["SLURM_CONF"], poll_interval=args.poll)
        Path(tmp, "kern.log").write_text("")
        with d.config.open("a") as f:
            f.write(f"[triage]\nenabled = true\ninterval_s = {interval}\n"
                    f"[[triage.check]]\nname = \"node-check\"\ntimeout_s = 60\n"
                    f"args = [\"--kernel-log\", \"{tmp}/kern.log\", \"--disk\", \"{tmp}\"]\n")
        d.start()
        rows = []
        try:
            for i in range(args.runs):
                marks = one_run(d.database_url, args.node)
                load = os.getloadavg()[0]
                rows.append({**marks, "load": load})
                running = marks.get("running", float("nan"))
                print(f"run {i + 1}: started {marks['started']:.1f} s, job running {running:.1f} s, "
                      f"verdict {marks['verdict']:.1f} s, returned {marks['returned']:.1f} s (load {load:.1f})",
                      flush=True)
        finally:
            d.kill()
    med = {k: statistics.median(r[k] for r in rows if k in r) for k in ("started", "verdict", "returned")}
    print(f"median of {len(rows)}: started {med['started']:.1f} s, verdict {med['verdict']:.1f} s, "
          f"returned {med['returned']:.1f} s (poll {args.poll}, [triage] interval_s {interval:g})")
    print(json.dumps({"bench": "triage", "runs": rows, "median": med, "poll": args.poll,
                      "interval_s": interval}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
