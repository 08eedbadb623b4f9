"""Benchmark: time from a node failure to the run training again.

Two runs of the same 2-node PyTorch job (tests/workload/train.py) on the local
cluster, each hit by the same failure (``localcluster.sh kill-node`` of its
second node: slurmd and the job's processes there killed -9):

- **b300d**: submitted through a real b300d (``--no-requeue``); the daemon
  classifies, drains, and resubmits from the newest complete checkpoint.
- **slurm requeue**: submitted with ``sbatch --requeue`` and no daemon; Slurm
  requeues the job itself once it declares the node down.

For each it prints the phases, measured from the kill: ``detect`` (Slurm has
the node down / the daemon has classified the failure), ``drain``, ``submit``,
``queue`` (until the new allocation starts), ``start`` (the workload reports
training steps again). Run as root with the cluster up:

    python tests/bench/bench_recovery.py

On another Slurm release: bring the cluster up with ``B300_SLURM=24.11`` (or 26.05)
and ``eval "$(bash deploy/localcluster.sh env)"`` first; the output names the release.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from benchlib import CLUSTER, TRAIN, cluster_conf, node_down_at, progress, restore, sh, wait

STEPS = 400


def bench_b300d(base: Path, conf: str, poll: str) -> dict[str, float]:
    run_dir = base / "b300" / "run"
    (run_dir / "ckpt").mkdir(parents=True)
    state = base / "b300" / "state"
    cfg = base / "b300" / "b300.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{state}"\npoll_interval = "{poll}"\n'
                   f'log_format = "json"\n[slurm]\nbackend = "cli"\nconf = "{conf}"\n'
                   f'[recovery]\nsettle = "90s"\n')
    spec = base / "b300" / "job.toml"
    train = f"srun {sys.executable} {TRAIN} --steps {STEPS} --ckpt-every 5 --step-time 0.25"
    spec.write_text("\n".join([
        'name = "bench"', "[job]", f"command = {json.dumps(train)}",
        "nodes = 2", "ntasks_per_node = 1", "gpus_per_node = 8",
        "[checkpoint]", f'dir = "{run_dir / "ckpt"}"', 'layout = "dcp"']) + "\n")
    env = {**os.environ, "SLURM_CONF": conf}
    with open(base / "b300" / "b300d.log", "wb") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "b300.daemon_main", "--config",
                                   str(cfg)], env=env, stdout=out, stderr=subprocess.STDOUT)
    ctl = [sys.executable, "-m", "b300.ctl", "--config", str(cfg), "--json"]
    try:
        wait(lambda: (state / "b300d.sock").exists(), 60, "b300d")
        run_id = json.loads(sh(*ctl, "submit", str(spec), timeout=120))["run"]["id"]
        status = lambda: json.loads(sh(*ctl, "status", run_id))  # noqa: E731
        wait(lambda: progress(run_dir).get("step", 0) >= 12, 180, "training")
        victim = status()["attempts"][0]["nodes"][1]
        t0 = time.time()
        sh("bash", str(CLUSTER), "kill-node", victim)
        wait(lambda: progress(run_dir).get("attempt") == 2, 400, "attempt 2 training", 0.05)
        t_train = time.time()
        st = status()
        ev = {e["kind"]: datetime.fromisoformat(e["ts"]).timestamp() for e in st["events"]
              if e["kind"] in ("attempt.classified", "node.drained")}
        submitted = [datetime.fromisoformat(e["ts"]).timestamp() for e in st["events"]
                     if e["kind"] == "attempt.submitted"][-1]
        a2_start = datetime.fromisoformat(st["attempts"][1]["start"]).timestamp()
        down = node_down_at(victim) or float("nan")
        sh(*ctl, "cancel", run_id, check=False)
        return {"slurm_down": down - t0, "detect": ev["attempt.classified"] - t0,
                "drain": ev["node.drained"] - t0, "submit": submitted - t0,
                "queue": a2_start - t0, "start": t_train - t0,
                "added_by_daemon": submitted - down, "node": victim}  # type: ignore[dict-item]
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        restore_node = locals().get("victim")
        if restore_node:
            restore(str(restore_node))


def bench_requeue(base: Path) -> dict[str, float]:
    run_dir = base / "requeue" / "run"
    (run_dir / "ckpt").mkdir(parents=True)
    script = (f"#!/bin/bash\nexport B300_CHECKPOINT_DIR={run_dir / 'ckpt'}\n"
              f"export B300_ATTEMPT=$((SLURM_RESTART_COUNT + 1))\n"
              f"srun {sys.executable} {TRAIN} --steps {STEPS} --ckpt-every 5 --step-time 0.25\n")
    job = int(subprocess.run(["sbatch", "--parsable", "--requeue", "-N2", "--ntasks-per-node=1",
                              "--gpus-per-node=8", f"--output={base / 'requeue' / 'out.txt'}"],
                             input=script, capture_output=True, text=True, check=True,
                             timeout=60).stdout.strip().split(";")[0])
    victim = None
    try:
        wait(lambda: progress(run_dir).get("step", 0) >= 12, 180, "training")
        nodes = sh("squeue", "-h", "-j", str(job), "-o", "%N").strip()
        victim = sh("scontrol", "show", "hostnames", nodes).split()[1]
        t0 = time.time()
        sh("bash", str(CLUSTER), "kill-node", victim)

        def requeued_or_ended() -> str | None:
            # squeue lists pending/running jobs only: an empty answer means it ended.
            st = sh("squeue", "-h", "-j", str(job), "-o", "%T", check=False).strip()
            if "PENDING" in st:
                return "requeued"
            if st:
                return None
            return "ended " + sh("sacct", "-X", "-n", "-P", f"-j{job}", "-oState,ExitCode").strip()

        outcome = wait(requeued_or_ended, 400, "Slurm to requeue the job", 0.2)
        t_requeue = time.time()
        if outcome != "requeued":
            # The surviving rank failed the step before Slurm declared the node down:
            # the job ends FAILED, and Slurm's requeue (node failures only) never applies.
            nan = float("nan")
            return {"slurm_down": (node_down_at(victim) or nan) - t0, "detect": nan,
                    "drain": nan, "submit": nan, "queue": nan, "start": nan,
                    "added_by_daemon": nan, "node": victim,  # type: ignore[dict-item]
                    "outcome": f"not requeued: job {outcome} {t_requeue - t0:.1f} s after the kill"}  # type: ignore[dict-item]
        wait(lambda: progress(run_dir).get("attempt") == 2, 600, "the requeued job training",
             0.1)
        t_train = time.time()
        start = sh("squeue", "-h", "-j", str(job), "-o", "%S").strip()
        down = node_down_at(victim) or float("nan")
        return {"slurm_down": down - t0, "detect": down - t0, "drain": float("nan"),
                "submit": t_requeue - t0,
                "queue": datetime.fromisoformat(start).timestamp() - t0, "start": t_train - t0,
                "added_by_daemon": float("nan"), "node": victim,  # type: ignore[dict-item]
                "outcome": "requeued"}  # type: ignore[dict-item]
    finally:
        sh("scancel", str(job), check=False)
        if victim:
            restore(victim)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--poll", default="10s", help="b300d poll interval (default 10s)")
    args = ap.parse_args()
    conf = cluster_conf()
    release = sh("sinfo", "-V").strip()
    with tempfile.TemporaryDirectory(prefix="b300-bench-rec-") as tmp:
        base = Path(tmp)
        ours = bench_b300d(base, conf, args.poll)
        slurm = bench_requeue(base)
    phases = ["slurm_down", "detect", "drain", "submit", "queue", "start"]
    print(f"\nnode failure -> training again (seconds after the kill; b300d poll {args.poll}; "
          f"{release})")
    print(f"{'phase':<16}{'b300d':>10}{'slurm requeue':>16}")
    for p in phases:
        print(f"{p:<16}{ours[p]:>10.1f}{slurm[p]:>16.1f}")
    print(f"{'daemon adds':<16}{ours['added_by_daemon']:>10.1f}  (submit - Slurm's node down)")
    print(f"slurm requeue: {slurm['outcome']}")
    print(f"ratio slurm/b300d time to training again: {slurm['start'] / ours['start']:.2f}x")
    print(json.dumps({"b300d": ours, "slurm_requeue": slurm, "poll": args.poll,
                      "slurm": release}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
