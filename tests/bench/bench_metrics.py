#!/usr/bin/env python3
"""Benchmark: one ``GET /metrics`` scrape with ``--runs`` runs in the store.

    python tests/bench/bench_metrics.py [--runs 1000] [--active 100] [--scrapes 20] [--renders 1000]
                                        [--events 0] [--database-url URL]

1. Fills a fresh SQLite store: ``--runs`` runs, ``--active`` of them RUNNING with a
   checkpoint folder, two attempts (one ended by a node failure) and three stored
   checkpoints each; the rest COMPLETED (what a store looks like after months).
   ``--events N``: also N counted events per run (resubmissions, training findings,
   step relaunches: what ``/metrics`` counts). ``--database-url``: an empty database
   instead (e.g. PostgreSQL).
2. Starts the daemon's metrics server (``b300.ops.metrics.MetricsServer``) on loopback
   and times ``--scrapes`` scrapes over HTTP (store reading included).
3. Times ``--renders`` renderings of one snapshot (the exposition format alone, no
   store, no HTTP): the part prometheus_client replaced.
4. Prints a table and, last, one JSON line with every figure (medians and p90, ms).

Needs nothing but the package: no Slurm, no network beyond 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta

from b300.interfaces import NewEvent
from b300.model import AttemptState, CheckpointInfo, RunState
from b300.ops.health import CycleSnapshot
from b300.ops.logs import configure_logging
from b300.ops.metrics import MetricsServer, collect_metrics, render_metrics
from b300.store import SqlStore, open_store

SPEC = ('name = "bench"\n[job]\ncommand = "true"\nnodes = 2\ngpus_per_node = 0\n'
        '[checkpoint]\ndir = "/ckpt/{run}"\nlayout = "dcp"\ninterval = "30m"\n')
NODES = ("gpu01", "gpu02")


def fill(store: SqlStore, runs: int, active: int, now: datetime) -> None:
    """``runs`` runs, the first ``active`` RUNNING with checkpoints, the rest COMPLETED."""
    for i in range(runs):
        run_id = f"run-{i:05d}"
        started = now - timedelta(hours=2)
        store.create_run(run_id, run_id, SPEC.format(run=run_id), started - timedelta(hours=8))
        a = store.begin_attempt(run_id, started - timedelta(hours=6))
        store.confirm_attempt(a.id, 100_000 + 2 * i, started - timedelta(hours=6))
        store.update_attempt(a.id, started, state=AttemptState.NODE_FAIL, nodes=NODES,
                             start=started - timedelta(hours=6), end=started, outcome="INFRA")
        b = store.begin_attempt(run_id, started)
        store.confirm_attempt(b.id, 100_001 + 2 * i, started)
        if i < active:
            store.update_attempt(b.id, started, state=AttemptState.RUNNING, nodes=NODES,
                                 start=started)
            store.set_run_state(run_id, RunState.RUNNING, started)
            store.checkpoints.record_listing(run_id, [
                CheckpointInfo(f"/ckpt/{run_id}/step_{s}", s, started + timedelta(minutes=20 * s), True,
                               10, 3, save_s=40.0 + s) for s in (1, 2, 3)], now)
        else:
            store.update_attempt(b.id, now, state=AttemptState.COMPLETED, nodes=NODES,
                                 start=started, end=now)
            store.set_run_state(run_id, RunState.COMPLETED, now)


#: What /metrics counts, in the mix ``--events`` appends (payloads as the daemon writes them).
COUNTED = (("recovery.resubmit", {"outcome": "INFRA", "resume_from": "/ckpt/x/step_2", "suspects": ["gpu02"],
                                  "checkpoints_checked": 3}),
           ("training.straggler", {"evidence": "gpu02 took 1.3 s for step 100, 1.6x the median 0.8 s "
                                   "of the other 1 host(s), for 10 steps in a row", "host": "gpu02",
                                   "value": 1.3, "threshold": 1.04, "step": 100}),
           ("training.loss_spike", {"evidence": "loss 9.1 at step 120 above 2.8", "value": 9.1,
                                    "threshold": 2.8, "step": 120}),
           ("attempt.step_relaunch", {"job_id": 100_001, "generation": 1, "exclude": ["gpu02"],
                                      "outcome": "INFRA", "spares_left": 0, "cause": "dead"}))


def add_events(store: SqlStore, runs: int, per_run: int, now: datetime) -> None:
    for i in range(runs):
        run_id = f"run-{i:05d}"
        store.append_events([NewEvent(COUNTED[k % len(COUNTED)][0], run_id=run_id,
                                      node="gpu02", data=COUNTED[k % len(COUNTED)][1])
                             for k in range(per_run)], now - timedelta(hours=1))


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered) * 1000, 3),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 3),
            "min_ms": round(ordered[0] * 1000, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--active", type=int, default=100, help="of --runs, how many are RUNNING")
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--renders", type=int, default=1000)
    ap.add_argument("--events", type=int, default=0, help="counted events per run")
    ap.add_argument("--database-url", default=None, help="an empty database (default: SQLite in a temp dir)")
    args = ap.parse_args()
    configure_logging("json", "warning")  # no debug line per request in the timing
    now = datetime.now(UTC)
    cycle = CycleSnapshot(1, 0, 0.01, time.time(), None)
    with tempfile.TemporaryDirectory(prefix="b300-bench-metrics-") as tmp:
        store = open_store(args.database_url or f"sqlite:///{os.path.join(tmp, 'state.db')}")
        t0 = time.perf_counter()
        fill(store, args.runs, min(args.active, args.runs), now)
        if args.events:
            add_events(store, args.runs, args.events, now)
        fill_s = time.perf_counter() - t0

        server = MetricsServer("127.0.0.1", 0, lambda: collect_metrics(store, cycle, datetime.now(UTC)))
        server.start()
        url = f"http://127.0.0.1:{server.address[1]}/metrics"
        scrapes: list[float] = []
        size = 0
        try:
            for _ in range(args.scrapes):
                t = time.perf_counter()
                with urllib.request.urlopen(url, timeout=60) as resp:
                    size = len(resp.read())
                scrapes.append(time.perf_counter() - t)
        finally:
            server.stop()

        snapshot = collect_metrics(store, cycle, now)
        renders: list[float] = []
        for _ in range(args.renders):
            t = time.perf_counter()
            text = render_metrics(snapshot)
            renders.append(time.perf_counter() - t)
        store.close()

    figures = {"runs": args.runs, "events_per_run": args.events, "active": min(args.active, args.runs),
               "fill_s": round(fill_s, 1),
               "scrape": _ms(scrapes), "scrapes": args.scrapes, "body_bytes": size,
               "render": _ms(renders), "renders": args.renders, "render_bytes": len(text.encode()),
               "load": os.getloadavg()[0]}
    print(f"{'what':<28}{'median ms':>12}{'p90 ms':>10}{'min ms':>10}")
    print(f"{'scrape (HTTP, store)':<28}{figures['scrape']['median_ms']:>12}"
          f"{figures['scrape']['p90_ms']:>10}{figures['scrape']['min_ms']:>10}")
    print(f"{'render (exposition only)':<28}{figures['render']['median_ms']:>12}"
          f"{figures['render']['p90_ms']:>10}{figures['render']['min_ms']:>10}")
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
