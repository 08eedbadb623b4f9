"""Benchmark: node crash -> excluded -> training again, three ways, the same crash.

    python tests/bench/bench_drill.py [--runs 3] [--modes requeue,slurm,active] [--poll 1s]
                                      [--out runs.jsonl] [--keep DIR]

On the local cluster that ``SLURM_CONF`` names (its ``SlurmdTimeout`` is read from
``scontrol show config`` and printed), as root: for each mode, ``--runs`` times, a 2-node
PyTorch job (tests/workload/train.py, a DCP checkpoint every 5 steps) runs and, once it
has a checkpoint and passed step 7, one of its nodes is crashed. The crash is the same in
every mode: the node "powered off" (``localcluster.sh freeze-node``: slurmd killed, the
job's processes stopped where they are, so no socket closes; and the node's sshd
stopped). Modes:

- ``requeue``: Slurm alone: ``sbatch --requeue``, no daemon; the job script resumes from
  the newest complete checkpoint. The bench polls Slurm (every 0.5 s) for the node down,
  the job PENDING again and RUNNING again, and the progress file for training again;
- ``slurm``: through a real b300d with ``[liveness] enabled = false``, drilled with
  ``b300ctl drill RUN --method crash``: the daemon waits for Slurm to mark the node down
  (``SlurmdTimeout`` plus its ping cycle);
- ``active``: the same with ``[liveness]`` on, confirmed over each node's own sshd (the
  drift tests' simulated nodes, host keys checked): the daemon finds the node itself.

Prints each run's figures (seconds from the crash command starting; the 1-minute load
average sampled every 10 s meanwhile; for the daemon's modes, when ``drill.injected``,
``liveness.suspect``, ``liveness.dead`` and ``node.drained`` came) and the medians per
mode. ``--out`` appends each run as a JSON line; ``--keep`` keeps the daemons' logs and
stores in DIR (a new folder).
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
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "drift"))
import drift_nodes as dn  # noqa: E402
from benchlib import (  # noqa: E402
    CLUSTER,
    TRAIN,
    cluster_conf,
    progress,
    restore,
    sh,
    slurm_has_down,
    slurmd_timeout,
    wait,
    work_dir,
)

NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
FIGURES = ("detect_s", "excluded_s", "resubmit_s", "allocation_s", "training_s", "steps_lost")
MODES = ("requeue", "slurm", "active")
TRAIN_ARGS = "--steps 400 --ckpt-every 5 --step-time 0.4"


class LoadSampler:
    """The 1-minute load average, sampled every 10 s in a thread while a drill runs."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(10):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def summary(self) -> dict[str, float]:
        s = self.samples or [os.getloadavg()[0]]
        return {"load_min": min(s), "load_max": max(s), "load_mean": round(statistics.fmean(s), 2)}


def crash_script(work: Path, sim: dn.Sim) -> Path:
    """The same crash in every mode: the node powered off (slurmd gone, the job's
    processes stopped where they are, so no socket closes) and its sshd stopped."""
    crash = work / "crash.sh"
    crash.write_text("#!/bin/bash\nset -eu\n"
                     f"bash {CLUSTER} freeze-node \"$1\"\n"
                     f"kill -TERM \"$(cat {sim.base}/\"$1\"/sshd.pid)\"\n")
    return crash


def ready(run_dir: Path) -> bool:
    """Past step 7 with a complete (``.metadata`` last) checkpoint: the moment to crash."""
    step = progress(run_dir).get("step")
    return (isinstance(step, int) and step >= 7
            and any((p / ".metadata").exists() for p in (run_dir / "ckpt").glob("step_*")))


def start_step(run_dir: Path, attempt: int) -> int | None:
    """The step attempt ``attempt`` started at (the workload's history.jsonl)."""
    try:
        lines = (run_dir / "history.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("attempt") == attempt:
            return int(rec["start_step"])
    return None


def one_requeue(base: Path, sim: dn.Sim, n: int) -> dict[str, Any]:
    """Slurm's own requeue, no daemon: ``sbatch --requeue``; the job script resumes from
    the newest complete checkpoint itself. Seconds from the crash command starting to:
    Slurm showing the node down (detected = excluded: Slurm allocates no down node),
    the job requeued (PENDING again), running again, the progress file past the
    resume step."""
    work = base / f"requeue-{n}"
    run_dir = work / "run"
    ckpt = run_dir / "ckpt"
    ckpt.mkdir(parents=True)
    crash = crash_script(work, sim)
    script = "\n".join([
        "#!/bin/bash",
        f"export B300_CHECKPOINT_DIR={ckpt}",
        "export B300_ATTEMPT=$((${SLURM_RESTART_COUNT:-0} + 1))",
        'resume=""',
        f"for d in $(ls -d {ckpt}/step_* 2>/dev/null | sort -r); do",
        '  if [ -f "$d/.metadata" ]; then resume=$d; break; fi',
        "done",
        'export B300_RESUME_FROM="$resume"',
        f"srun {sys.executable} {TRAIN} {TRAIN_ARGS}", ""])
    job = subprocess.run(["sbatch", "--parsable", "--requeue", "-J", "bench-drill-requeue", "-N2",
                          "--ntasks-per-node=1", "--gpus-per-node=8", f"--output={work / 'out.txt'}"],
                         input=script, capture_output=True, text=True, check=True,
                         timeout=60).stdout.strip().split(";")[0]
    victim = ""
    marks: dict[str, float] = {}
    try:
        wait(lambda: ready(run_dir), 240, "a checkpoint and step 7")
        nodes = sh("squeue", "-h", "-j", job, "-o", "%N").strip()
        victim = sh("scontrol", "show", "hostnames", nodes).split()[1]
        last_step = int(progress(run_dir).get("step", 0))
        t0 = time.time()
        sh("bash", str(crash), victim)
        end = time.monotonic() + 1500
        outcome = "timed out"
        while time.monotonic() < end:
            now = time.time()
            p = progress(run_dir)
            if p.get("attempt", 1) == 1:
                last_step = max(last_step, int(p.get("step", 0)))
            if "detect_s" not in marks and slurm_has_down(victim):
                marks["detect_s"] = marks["excluded_s"] = now - t0
            state = sh("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()
            if "resubmit_s" not in marks and ("PENDING" in state or "REQUEUE" in state):
                marks["resubmit_s"] = now - t0
            if "resubmit_s" in marks and "allocation_s" not in marks and "RUNNING" in state:
                marks["allocation_s"] = now - t0
            resumed = start_step(run_dir, 2)
            if p.get("attempt") == 2 and resumed is not None and int(p.get("step", 0)) > resumed:
                marks["training_s"] = now - t0
                marks["steps_lost"] = last_step - resumed
                marks["resumed_at"] = resumed
                outcome = "trained again"
                break
            if not state and "resubmit_s" not in marks:
                acct = sh("sacct", "-X", "-n", "-P", f"-j{job}", "-oState,ExitCode", check=False).strip()
                outcome = f"not requeued: job ended {acct} {now - t0:.1f} s after the crash"
                break
            time.sleep(0.5)
        return {**{k: round(v, 1) if k.endswith("_s") else v for k, v in marks.items()},
                "outcome": outcome, "node": victim}
    finally:
        sh("scancel", job, check=False)
        if victim:
            restore(victim)
            dn.stop([sim.nodes[victim]])
            dn.start([sim.nodes[victim]])


def breakdown(events: list[dict[str, Any]], node: str) -> dict[str, float]:
    """Where the seconds to "excluded" went, from the daemon's event log: each ``at_*`` is
    seconds from ``drill.started`` (the drill's zero) to the first event of that kind."""
    def ts(e: dict[str, Any]) -> float:
        return datetime.fromisoformat(e["ts"]).timestamp()
    zero = next((ts(e) for e in events if e["kind"] == "drill.started"), None)
    if zero is None:
        return {}
    out: dict[str, float] = {}
    for kind, key in (("drill.injected", "at_injected"), ("liveness.suspect", "at_suspect"),
                      ("liveness.dead", "at_dead"), ("attempt.node_lost", "at_node_lost"),
                      ("node.drained", "at_drained")):
        hit = [ts(e) for e in events if e["kind"] == kind and e.get("node") in (node, None)
               and ts(e) >= zero]
        if hit:
            out[key] = round(min(hit) - zero, 2)
    return out


def one_drill(base: Path, conf: str, mode: str, poll: str, sim: dn.Sim, n: int) -> dict[str, Any]:
    work = base / f"{mode}-{n}"
    run_dir = work / "run"
    (run_dir / "ckpt").mkdir(parents=True)
    state = work / "state"
    crash = crash_script(work, sim)
    nodes = "".join(f'{name} = {{ host = "127.0.0.1", port = {node.port}, partition = "batch" }}\n'
                    for name, node in sim.nodes.items())
    cfg = work / "b300.toml"
    cfg.write_text(
        f'[daemon]\nmode = "act"\nstate_dir = "{state}"\npoll_interval = "{poll}"\nlog_format = "json"\n'
        f'[slurm]\nbackend = "cli"\nconf = "{conf}"\n'
        f"[drift]\nknown_hosts = {json.dumps(str(sim.known_hosts))}\nkey_file = {json.dumps(str(sim.key))}\n"
        f'command_timeout = "5s"\nprobes = ["nccl"]\n[drift.nodes]\n{nodes}'
        f"[liveness]\nenabled = {'true' if mode == 'active' else 'false'}\n"
        "primary = 'connect'\nconfirm = 'ssh'\n"
        f'[drill]\ncrash_command = ["/bin/bash", {json.dumps(str(crash))}, "{{node}}"]\n')
    train = f"srun {sys.executable} {TRAIN} {TRAIN_ARGS}"
    spec = work / "job.toml"
    spec.write_text("\n".join([
        'name = "bench-drill"', "[job]", f"command = {json.dumps(train)}", "nodes = 2", "ntasks_per_node = 1",
        "gpus_per_node = 8", "[checkpoint]", f'dir = "{run_dir / "ckpt"}"', 'layout = "dcp"',
        "[health]", f'progress_file = "{run_dir / "progress.json"}"', 'hang_timeout = "30m"']) + "\n")
    env = {**os.environ, "SLURM_CONF": conf}
    ctl = [sys.executable, "-m", "b300.ctl", "--config", str(cfg), "--json"]
    with open(work / "b300d.log", "wb") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "b300.app.main", "--config", str(cfg)],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
    victim = ""
    try:
        wait(lambda: (state / "b300d.sock").exists(), 60, "b300d")
        run_id = json.loads(sh(*ctl, "submit", str(spec)))["run"]["id"]

        wait(lambda: ready(run_dir), 240, "a checkpoint and step 7")
        victim = json.loads(sh(*ctl, "status", run_id))["attempts"][0]["nodes"][1]
        drill = [*ctl, "drill", run_id, "--node", victim, "--method", "crash", "--timeout", "10m"]
        proc = subprocess.run(drill, capture_output=True, text=True, timeout=800, check=False)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"drill refused ({proc.returncode}): {proc.stderr.strip()}")
        record = json.loads(proc.stdout)
        sh(*ctl, "cancel", run_id, check=False)
        events = json.loads(sh(*ctl, "events", "--limit", "2000", check=False) or "[]")
        return {**dict(record.get("finished") or {"outcome": "not finished"}),
                **breakdown(events, victim)}
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        if victim:
            restore(victim)
            dn.stop([sim.nodes[victim]])
            dn.start([sim.nodes[victim]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help="of requeue,slurm,active (default all)")
    ap.add_argument("--poll", default="1s", help="b300d poll interval (default 1s)")
    ap.add_argument("--out", help="append each drill's figures to this file as a JSON line")
    ap.add_argument("--keep", help="work in this (new) folder and keep it: logs, stores, job output")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= set(MODES) or not 1 <= args.runs <= 20:
        raise SystemExit("--modes: of requeue, slurm, active; --runs: 1 to 20")
    conf = cluster_conf()
    timeout = slurmd_timeout()
    release = sh("sinfo", "-V").strip()
    ssh_base = int(os.environ.get("B300_SSHD_PORT_BASE", "22201")) + 80
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with contextlib.ExitStack() as stack:
        base = work_dir(stack, args.keep, "b300-bench-drill-")
        key = dn.client_key(base)
        auth = base / "authorized_keys"
        auth.write_text(Path(f"{key}.pub").read_text())
        nodes = {n: dn.make_node(base, n, ssh_base + i, dn.Versions(), auth) for i, n in enumerate(NODES)}
        (base / "known_hosts").write_text("".join(n.known_hosts_line() for n in nodes.values()))
        sim = dn.Sim(nodes, key, base / "known_hosts", base)
        dn.start(nodes.values())
        try:
            for n in range(args.runs):
                for mode in modes:
                    started = time.time()
                    with LoadSampler() as load:
                        f = (one_requeue(base, sim, n) if mode == "requeue"
                             else one_drill(base, conf, mode, args.poll, sim, n))
                    f = {**f, **load.summary(), "mode": mode, "run": n + 1, "slurmd_timeout": timeout,
                         "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}
                    results[mode].append(f)
                    print(f"{mode} #{n + 1}: " + " ".join(f"{k}={f.get(k)}" for k in (
                        *FIGURES, "outcome", "load_min", "load_max")), flush=True)
                    if args.out:
                        with open(args.out, "a") as o:
                            o.write(json.dumps(f) + "\n")
        finally:
            dn.stop(nodes.values())
    print(f"\nnode crash (powered off) -> ... (seconds, median of {args.runs}; SlurmdTimeout={timeout}; "
          f"poll {args.poll}; {release})")
    print(f"{'mode':<8}" + "".join(f"{k.removesuffix('_s'):>12}" for k in FIGURES))
    for mode, rows in results.items():
        cells = []
        for k in FIGURES:
            vals = [float(r[k]) for r in rows if isinstance(r.get(k), int | float)]
            cells.append(f"{statistics.median(vals):>12.1f}" if len(vals) == len(rows) else f"{'-':>12}")
        print(f"{mode:<8}" + "".join(cells))
    print(json.dumps({"slurmd_timeout": timeout, "poll": args.poll, "slurm": release, "drills": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
