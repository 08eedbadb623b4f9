"""Benchmark: node death -> training again, side by side in one run, for the ways b300d
restarts a 2-node run on the namespace cluster (``B300_NETNS=1``; up already, SLURM_CONF set):

- ``elastic``: ``[elastic]`` (torchrun, min 1 max 2, 1 spare; tests/workload/elastic_train.py):
  the daemon starts an agent on the spare in the same job;
- ``inalloc``: ``spare_nodes = 1`` (b300.launcher; deploy/examples/light_train.py): a new step
  on the healthy nodes of the same job;
- ``resubmit``: no spares: the job is cancelled and resubmitted from the newest checkpoint.

Each run: a fresh b300d (liveness on, poll 0.5 s), the run trains past a checkpoint, then
its second node (not the batch host) is powered off (``localcluster.sh power-off``: link
down, silent) two steps after a checkpoint. ``again_s``: seconds from the power-off to the
first step written after a restart (a step no later than the checkpoint's + 1, so a step a
survivor finishes late is not counted); for ``elastic`` also ``size_s``: to the first
worker start at world size 2 again. The workloads differ (torch with gloo vs the standard
library) and so do their start-up times: ``start_s`` is each run's own first training step
after its submission, as a yardstick. Run as root:

    python tests/bench/bench_elastic.py [--runs 3] [--modes elastic,inalloc,resubmit]

Prints one line per run, the medians per mode and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from helpers import CLUSTER, cancel_test_jobs, make_daemon, wait_for  # noqa: E402

ELASTIC = REPO / "tests" / "workload" / "elastic_train.py"
LIGHT = REPO / "deploy" / "examples" / "light_train.py"


def lc(*args: str) -> None:
    subprocess.run(["bash", str(CLUSTER), *args], capture_output=True, text=True, timeout=300, check=False)


def spec(mode: str, run: Path) -> str:
    lines = ['name = "bench"', "[job]"]
    if mode == "elastic":
        cmd = f"{ELASTIC} --steps 100000 --step-s 0.3 --ckpt-every 5 --timeout 10"
        lines += [f"command = {json.dumps(cmd)}", "nodes = 2", "spare_nodes = 1"]
    elif mode == "inalloc":
        cmd = f"{sys.executable} {LIGHT} --steps 100000 --ckpt-every 5 --step-time 0.3 --timeout 10"
        lines += [f"command = {json.dumps(cmd)}", "nodes = 2", "spare_nodes = 1", "ntasks_per_node = 1"]
    else:
        cmd = (f"srun --kill-on-bad-exit=1 {sys.executable} {LIGHT} --steps 100000 --ckpt-every 5 "
               "--step-time 0.3 --timeout 10")
        lines += [f"command = {json.dumps(cmd)}", "nodes = 2", "ntasks_per_node = 1"]
    lines += ["gpus_per_node = 0", 'time_limit = "00:20:00"', "[job.environment]",
              'GLOO_SOCKET_IFNAME = "eth0"', "[checkpoint]", f'dir = "{run / "ckpt"}"',
              'layout = "generic"', "[health]", f'progress_file = "{run / "progress.{host}.jsonl"}"',
              'hang_timeout = "30m"', "[retries]", "infra = 3"]
    if mode == "elastic":
        lines += ["[elastic]", "min_nodes = 1", "max_nodes = 2", "max_restarts = 3", "port = 29571"]
    return "\n".join(lines) + "\n"


def steps(run: Path) -> list[dict[str, Any]]:
    out = []
    for f in run.glob("progress.*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "event" not in rec and "step" in rec:
                out.append(rec)
    return sorted(out, key=lambda r: r["time"])


def newest_ckpt(run: Path) -> int:
    found = [int(m.group(1)) for d in (run / "ckpt").glob("step_*")
             if (m := re.fullmatch(r"step_(\d+)", d.name)) and (d / "DONE").exists()]
    return max(found, default=0)


def one(mode: str, n: int, conf: str) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix=f"bench-elastic-{mode}-"))
    run = base / "run"
    (run / "ckpt").mkdir(parents=True)
    (base / "spec.toml").write_text(spec(mode, run))
    d = make_daemon(base, conf)
    d.config.write_text(d.config.read_text() + "[liveness]\nenabled = true\n")
    d.start()
    victim = ""
    try:
        t_sub = time.time()
        run_id = d.submit(base / "spec.toml")
        wait_for(lambda: steps(run), 180, "first step")
        start_s = steps(run)[0]["time"] - t_sub
        # Two steps past a checkpoint (>= 5), so a restart's first step is a rewind.
        wait_for(lambda: newest_ckpt(run) >= 5 and steps(run)[-1]["step"] == newest_ckpt(run) + 2,
                 180, "two steps past a checkpoint", every=0.05)
        nodes = d.run(run_id)["attempts"][-1]["nodes"]
        victim = nodes[1]
        t0 = time.time()
        lc("power-off", victim)
        # Read once the node is off (no step completes without it, so no newer checkpoint
        # comes): on a loaded machine training may have passed another checkpoint between
        # the wait above and the power-off, and a restart resumes from that one.
        ckpt = newest_ckpt(run)

        def again() -> float | None:
            late = [r for r in steps(run) if r["time"] > t0 and r["step"] <= ckpt + 1]
            return late[0]["time"] if late else None
        t_again = wait_for(again, 240, "training again")
        row: dict[str, Any] = {"mode": mode, "run": n, "victim": victim, "again_s": round(t_again - t0, 1),
                               "start_s": round(start_s, 1)}
        if mode == "elastic":
            def size() -> float | None:
                hist = run / "history.jsonl"
                starts = [json.loads(x) for x in hist.read_text().splitlines()] if hist.exists() else []
                back = [s for s in starts if s["time"] > t0 and s["world"] == 2]
                return back[0]["time"] if back else None
            row["size_s"] = round(wait_for(size, 120, "world size 2 again") - t0, 1)
        row["attempts"] = len(d.run(run_id)["attempts"])
        return row
    finally:
        d.cleanup()
        cancel_test_jobs(conf, d)
        if victim:
            lc("power-on", victim)
        lc("up")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="elastic,inalloc,resubmit")
    args = ap.parse_args()
    conf = os.environ.get("SLURM_CONF", "")
    modes = args.modes.split(",")
    if not conf or not 1 <= args.runs <= 20 or not set(modes) <= {"elastic", "inalloc", "resubmit"}:
        print("bench_elastic: needs SLURM_CONF of a namespace cluster, --runs 1..20 and known --modes",
              file=sys.stderr)
        return 2
    rows = []
    for n in range(1, args.runs + 1):
        for mode in modes:   # interleaved, so the modes see the same machine load
            row = one(mode, n, conf)
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary: dict[str, Any] = {"runs": args.runs}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {k: statistics.median(r[k] for r in mine)
                         for k in ("again_s", "size_s", "start_s", "attempts") if k in mine[0]}
        print(f"{mode:9s} node off -> training again: median {summary[mode]['again_s']:.1f} s "
              f"(N={len(mine)}), attempts {summary[mode]['attempts']}, "
              f"start-up {summary[mode]['start_s']:.1f} s"
              + (f", world size 2 again {summary[mode]['size_s']:.1f} s" if "size_s" in summary[mode] else ""))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
