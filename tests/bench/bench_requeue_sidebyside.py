"""Benchmark: a powered-off node under a 2-node training job, three recoveries side by side.

    python tests/bench/bench_requeue_sidebyside.py [--timeouts 20,300] [--runs 3]
                                                   [--modes daemon,expedite,requeue]
                                                   [--out runs.jsonl] [--keep DIR]

As root, on the local cluster the ``B300_*`` knobs of ``deploy/localcluster.sh`` name, in
its network-namespace mode on Slurm 26.05 with expedited requeue allowed
(``B300_NETNS=1 B300_SLURM=26.05 B300_EXPEDITED_REQUEUE=1``; with another release the
``expedite`` mode is refused). For each SlurmdTimeout in ``--timeouts`` the bench brings
the same cluster up again with that timeout (``localcluster.sh up``, same nodes, same
state), then ``--runs`` times, for each mode, runs a 2-node job of
deploy/examples/light_train.py (standard library only; a checkpoint every 5 steps, a
progress line every 0.5 s step) and, once it is past step 7 with a checkpoint, powers
off the job's second node (``localcluster.sh power-off``: its link down, its slurmd and
job processes killed: silence). Modes:

- ``daemon``: a real b300d at its defaults: only ``[daemon] mode = "act"`` (plus where
  its state lives and the cluster's slurm.conf); liveness, poll interval and everything
  else as shipped. The run is submitted with ``b300ctl submit``; the workload's
  collectives time out after 15 s (``--timeout 15``);
- ``expedite``: Slurm alone, ``sbatch --requeue=expedite`` under
  ``SlurmctldParameters=enable_expedited_requeue``; the same 15 s collective timeout, so
  the job fails and Slurm decides from the nodes' epilogs whether to requeue it;
- ``requeue``: Slurm alone, plain ``sbatch --requeue``; the surviving rank waits (a
  600 s collective timeout, as a NCCL watchdog would) until Slurm marks the node DOWN
  and requeues the job.

Every mode is measured the same way from outside, polling every 0.25 s, in seconds from
the power-off command starting: ``excluded`` (Slurm shows the node drained, down or with
a reason), ``resubmitted`` (the job PENDING again, requeued, or a new job of the run in
the queue), ``training`` (a progress line written by a new attempt: each attempt writes
its own progress file). The job script resumes from the newest checkpoint with DONE.
Prints each run, then the medians per timeout and mode, then one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import sh, wait, work_dir

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "deploy" / "localcluster.sh"
TRAIN = REPO / "deploy" / "examples" / "light_train.py"
MODES = ("daemon", "expedite", "requeue")
FIGURES = ("excluded_s", "resubmit_s", "training_s")
COLLECTIVE_TIMEOUT = {"daemon": 15, "expedite": 15, "requeue": 600}
GIVE_UP_S = 900.0


def slurm_config() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in sh("scontrol", "show", "config").splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def cluster_up(timeout_s: int) -> None:
    env = {**os.environ, "B300_SLURMD_TIMEOUT": str(timeout_s)}
    proc = subprocess.run(["bash", str(CLUSTER), "up"], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"localcluster.sh up failed: {proc.stderr.strip().splitlines()[-1:]}")
    wait(lambda: slurm_config().get("SlurmdTimeout", "").split()[0] == str(timeout_s), 60,
         f"SlurmdTimeout={timeout_s}")
    wait(all_idle, 120, "every node idle")


def all_idle() -> bool:
    states = sh("sinfo", "-h", "-N", "-o", "%N %T", check=False).split()
    return bool(states) and all(s == "idle" for s in states[1::2])


def node_excluded(node: str) -> bool:
    """Slurm shows the node down, failed or drained, or with a reason set."""
    out = sh("sinfo", "-h", "-N", f"--nodes={node}", "-o", "%T|%E", check=False).strip()
    state, _, reason = (out.splitlines() or ["|"])[0].partition("|")
    return any(w in state for w in ("down", "drain", "fail")) or reason.strip() not in ("", "none")


def progress_lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and "event" not in rec and "step" in rec:
                out.append(rec)
    return out


def job_script(run_dir: Path, mode: str) -> Path:
    """The job: each attempt writes its own progress file (job id, restart count) and
    light_train.py resumes from the newest checkpoint with DONE in the checkpoint folder."""
    script = run_dir / "job.sh"
    script.write_text("\n".join([
        "#!/bin/bash",
        f"export B300_CHECKPOINT_DIR={run_dir / 'ckpt'}",
        f"export B300_PROGRESS_FILE={run_dir}/progress-$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}.jsonl",
        f"exec srun {sys.executable} {TRAIN} --steps 2000 --ckpt-every 5 --step-time 0.5 "
        f"--timeout {COLLECTIVE_TIMEOUT[mode]}", ""]))
    script.chmod(0o755)
    return script


def ready(run_dir: Path) -> tuple[Path, int] | None:
    """Past step 7 with a complete checkpoint: (the progress file, its last step)."""
    files = sorted(run_dir.glob("progress-*.jsonl"))
    if len(files) != 1 or not list((run_dir / "ckpt").glob("step_*/DONE")):
        return None
    lines = progress_lines(files[0])
    return (files[0], int(lines[-1]["step"])) if lines and int(lines[-1]["step"]) >= 7 else None


def restore(node: str) -> None:
    sh("bash", str(CLUSTER), "power-on", node, check=False, timeout=180)
    sh("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    with contextlib.suppress(SystemExit):
        wait(all_idle, 120, "every node idle")


def one(base: Path, mode: str, timeout_s: int, n: int, conf: str) -> dict[str, Any]:
    work = base / f"t{timeout_s}-{mode}-{n}"
    run_dir = work / "run"
    (run_dir / "ckpt").mkdir(parents=True)
    script = job_script(run_dir, mode)
    daemon: subprocess.Popen[bytes] | None = None
    ctl: list[str] = []
    run_id = ""
    jobs: set[str] = set()
    victim = ""
    try:
        if mode == "daemon":
            state = work / "state"
            cfg = work / "b300.toml"
            cfg.write_text(f'[daemon]\nmode = "act"\nstate_dir = "{state}"\nlog_format = "json"\n'
                           f'[slurm]\nconf = "{conf}"\n')
            spec = work / "job.toml"
            spec.write_text(f'name = "sbs-{timeout_s}-{n}"\n[job]\ncommand = "bash {script}"\nnodes = 2\n'
                            'ntasks_per_node = 1\ngpus_per_node = 8\n'
                            f'[checkpoint]\ndir = "{run_dir / "ckpt"}"\nlayout = "generic"\n')
            with open(work / "b300d.log", "wb") as out:
                daemon = subprocess.Popen([sys.executable, "-m", "b300.app.main", "--config", str(cfg)],
                                          stdout=out, stderr=subprocess.STDOUT)
            wait(lambda: (state / "b300d.sock").exists(), 60, "b300d")
            ctl = [sys.executable, "-m", "b300.ctl", "--config", str(cfg), "--json"]
            run_id = json.loads(sh(*ctl, "submit", str(spec)))["run"]["id"]
        else:
            flag = "--requeue=expedite" if mode == "expedite" else "--requeue"
            out = sh("sbatch", "--parsable", flag, "-J", f"sbs-{mode}", "-N2", "--ntasks-per-node=1",
                     "--gpus-per-node=8", f"--output={work / 'out-%j.txt'}", str(script))
            jobs.add(out.strip().split(";")[0])
        if mode == "daemon":  # the daemon checks the nodes it knows in use: past its first poll
            wait(lambda: json.loads(sh(*ctl, "status", run_id))["attempts"][-1].get("state") == "RUNNING",
                 120, "b300d to see the job running")
            time.sleep(2)
        first, last_step = wait(lambda: ready(run_dir), 300, "a checkpoint and step 7")
        job0 = first.name.split("-")[1]
        jobs.add(job0)
        victim = sh("scontrol", "show", "hostnames",
                    sh("squeue", "-h", "-j", job0, "-o", "%N").strip()).split()[1]
        t0 = time.time()
        sh("bash", str(CLUSTER), "power-off", victim, timeout=120)
        marks: dict[str, float] = {}
        outcome = "gave up"
        end = time.monotonic() + GIVE_UP_S
        while time.monotonic() < end:
            now = time.time()
            if "excluded_s" not in marks and node_excluded(victim):
                marks["excluded_s"] = now - t0
            queue = sh("squeue", "-h", "-o", "%i|%T", check=False).split()
            if "resubmit_s" not in marks:
                for row in queue:
                    jid, _, st = row.partition("|")
                    again = st in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")
                    if (jid != job0 and mode == "daemon") or (jid == job0 and again):
                        marks["resubmit_s"] = now - t0
                if mode != "daemon" and "resubmit_s" not in marks:
                    show = sh("scontrol", "show", "job", "-o", job0, check=False)
                    if "Restarts=0" not in show and "Restarts=" in show:
                        marks["resubmit_s"] = now - t0
            for f in run_dir.glob("progress-*.jsonl"):
                if f != first and progress_lines(f):
                    rec = progress_lines(f)[0]
                    marks.setdefault("resubmit_s", now - t0)
                    marks["training_s"] = now - t0
                    marks["resumed_at"] = int(rec["step"]) - 1
                    marks["steps_lost"] = last_step - (int(rec["step"]) - 1)
                    jobs.add(f.name.split("-")[1])
                    break
            if "training_s" in marks:
                outcome = "trained again"
                break
            if mode != "daemon" and not queue and "resubmit_s" not in marks:
                acct = sh("sacct", "-X", "-n", "-P", f"-j{job0}", "-oState,ExitCode", check=False).strip()
                outcome = f"not requeued: job ended {acct} {now - t0:.0f} s after the power-off"
                break
            held = sh("squeue", "-h", "-j", job0, "-o", "%r", check=False).strip()
            if mode != "daemon" and "Held" in held and "training_s" not in marks and now - t0 > 60:
                outcome = f"held by Slurm ({held}) {now - t0:.0f} s after the power-off"
                break
            time.sleep(0.25)
        return {**{k: round(v, 1) for k, v in marks.items() if k.endswith("_s")},
                **{k: v for k, v in marks.items() if not k.endswith("_s")},
                "outcome": outcome, "node": victim, "step_at_crash": last_step}
    finally:
        if run_id:
            sh(*ctl, "cancel", run_id, check=False)
        for j in jobs:
            sh("scancel", j, check=False)
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(60)
            except subprocess.TimeoutExpired:
                daemon.kill()
        sh("scancel", "-n", f"sbs-{mode}", check=False)
        if victim:
            restore(victim)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeouts", default="20,300", help="SlurmdTimeout values, in seconds (default 20,300)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help="of daemon,expedite,requeue (default all)")
    ap.add_argument("--out", help="append each run's figures to this file as a JSON line")
    ap.add_argument("--keep", help="work in this (new) folder and keep it: logs, stores, job output")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    try:
        timeouts = [int(t) for t in args.timeouts.split(",") if t]
    except ValueError:
        print(f"--timeouts: comma-separated seconds, got {args.timeouts!r}", file=sys.stderr)
        return 2
    if not set(modes) <= set(MODES) or not modes or not 1 <= args.runs <= 20 or not timeouts \
            or not all(5 <= t <= 3600 for t in timeouts):
        print("--modes: of daemon, expedite, requeue; --runs: 1 to 20; --timeouts: 5 to 3600 s each",
              file=sys.stderr)
        return 2
    if os.environ.get("B300_NETNS") != "1":
        print("needs the network-namespace cluster: set B300_NETNS=1 (and the other B300_* knobs)",
              file=sys.stderr)
        return 2
    if "expedite" in modes and os.environ.get("B300_EXPEDITED_REQUEUE") != "1":
        print("mode expedite needs B300_SLURM=26.05 B300_EXPEDITED_REQUEUE=1", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        base = work_dir(stack, args.keep, "b300-bench-sbs-")
        base.chmod(0o755)
        for t in timeouts:
            cluster_up(t)
            config = slurm_config()
            conf = os.environ["SLURM_CONF"]
            release = sh("sinfo", "-V").strip()
            print(f"SlurmdTimeout={t}: {release}, SlurmctldParameters={config.get('SlurmctldParameters')}",
                  flush=True)
            for n in range(args.runs):
                for mode in modes:
                    started = time.time()
                    f = one(base, mode, t, n + 1, conf)
                    f = {**f, "mode": mode, "run": n + 1, "slurmd_timeout": t, "slurm": release,
                         "load1": round(os.getloadavg()[0], 2),
                         "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}
                    results.append(f)
                    print(f"t={t} {mode} #{n + 1}: " + " ".join(f"{k}={f.get(k)}" for k in (
                        *FIGURES, "steps_lost", "outcome", "load1")), flush=True)
                    if args.out:
                        with open(args.out, "a") as o:
                            o.write(json.dumps(f) + "\n")
    print(f"\npowered-off node -> ... (seconds from the power-off, median of {args.runs})")
    print(f"{'SlurmdTimeout':>13} {'mode':<9}" + "".join(f"{k.removesuffix('_s'):>12}" for k in FIGURES))
    for t in timeouts:
        for mode in modes:
            rows = [r for r in results if r["slurmd_timeout"] == t and r["mode"] == mode]
            cells = []
            for k in FIGURES:
                vals = [float(r[k]) for r in rows if isinstance(r.get(k), int | float)]
                cells.append(f"{statistics.median(vals):>12.1f}" if len(vals) == len(rows) else
                             f"{f'{len(vals)}/{len(rows)}':>12}")
            print(f"{t:>13} {mode:<9}" + "".join(cells))
    print(json.dumps({"runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
