"""Benchmark: node crash -> excluded -> training again, measured by ``b300ctl drill`` itself.

    python tests/bench/bench_drill.py [--runs 3] [--modes slurm,active] [--poll 1s]

On the local cluster that ``SLURM_CONF`` names (its ``SlurmdTimeout`` is read from
``scontrol show config`` and printed), as root: for each mode, ``--runs`` times, a 2-node
PyTorch job (tests/workload/train.py, a DCP checkpoint every 5 steps) is submitted
through a real b300d and, once it has a checkpoint and passed step 7, drilled with
``b300ctl drill RUN --method crash``. The crash is the same in every mode: the node
"powered off" (``localcluster.sh freeze-node``: slurmd killed, the job's processes
stopped where they are, so no socket closes; and the node's sshd stopped). Modes:

- ``slurm``: ``[liveness] enabled = false``: the daemon waits for Slurm to mark the node
  down (``SlurmdTimeout`` plus its ping cycle);
- ``active``: ``[liveness]`` on, confirmed over each node's own sshd (the drift tests'
  simulated nodes, host keys checked): the daemon finds the node itself.

Prints each drill's figures and the medians per mode (seconds from the crash command
starting). Slurm's own requeue, for comparison: ``tests/bench/bench_recovery.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "drift"))
import drift_nodes as dn  # noqa: E402

CLUSTER = REPO / "deploy" / "localcluster.sh"
TRAIN = REPO / "tests" / "workload" / "train.py"
NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
FIGURES = ("detect_s", "excluded_s", "resubmit_s", "allocation_s", "training_s", "steps_lost")


def sh(*argv: str, timeout: float = 120, check: bool = True) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=check).stdout


def wait(pred: Any, timeout: float, what: str, every: float = 0.25) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def slurmd_timeout() -> str:
    for line in sh("scontrol", "show", "config").splitlines():
        if line.startswith("SlurmdTimeout"):
            return line.split("=", 1)[1].strip()
    return "?"


def one_drill(base: Path, conf: str, mode: str, poll: str, sim: dn.Sim, n: int) -> dict[str, Any]:
    work = base / f"{mode}-{n}"
    run_dir = work / "run"
    (run_dir / "ckpt").mkdir(parents=True)
    state = work / "state"
    crash = work / "crash.sh"
    crash.write_text("#!/bin/bash\nset -eu\n"
                     f"bash {CLUSTER} freeze-node \"$1\"\n"
                     f"kill -TERM \"$(cat {sim.base}/\"$1\"/sshd.pid)\"\n")
    nodes = "".join(f'{name} = {{ host = "127.0.0.1", port = {node.port}, partition = "batch" }}\n'
                    for name, node in sim.nodes.items())
    cfg = work / "b300.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{state}"\npoll_interval = "{poll}"\nlog_format = "json"\n'
        f'[slurm]\nbackend = "cli"\nconf = "{conf}"\n'
        f"[drift]\nknown_hosts = {json.dumps(str(sim.known_hosts))}\nkey_file = {json.dumps(str(sim.key))}\n"
        f'command_timeout = "5s"\nprobes = ["nccl"]\n[drift.nodes]\n{nodes}'
        f"[liveness]\nenabled = {'true' if mode == 'active' else 'false'}\n"
        f'[drill]\ncrash_command = ["/bin/bash", {json.dumps(str(crash))}, "{{node}}"]\n')
    train = f"srun {sys.executable} {TRAIN} --steps 400 --ckpt-every 5 --step-time 0.4"
    spec = work / "job.toml"
    spec.write_text("\n".join([
        'name = "bench-drill"', "[job]", f"command = {json.dumps(train)}", "nodes = 2", "ntasks_per_node = 1",
        "gpus_per_node = 8", "[checkpoint]", f'dir = "{run_dir / "ckpt"}"', 'layout = "dcp"',
        "[health]", f'progress_file = "{run_dir / "progress.json"}"', 'hang_timeout = "30m"']) + "\n")
    env = {**os.environ, "SLURM_CONF": conf}
    ctl = [sys.executable, "-m", "b300.ctl", "--config", str(cfg), "--json"]
    with open(work / "b300d.log", "wb") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "b300.daemon_main", "--config", str(cfg)],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
    victim = ""
    try:
        wait(lambda: (state / "b300d.sock").exists(), 60, "b300d")
        run_id = json.loads(sh(*ctl, "submit", str(spec)))["run"]["id"]

        def ready() -> bool:
            try:
                step = int(json.loads((run_dir / "progress.json").read_text())["step"])
            except (OSError, ValueError, KeyError):
                return False
            return step >= 7 and any((p / ".metadata").exists() for p in (run_dir / "ckpt").glob("step_*"))

        wait(ready, 240, "a checkpoint and step 7")
        victim = json.loads(sh(*ctl, "status", run_id))["attempts"][0]["nodes"][1]
        drill = [*ctl, "drill", run_id, "--node", victim, "--method", "crash", "--timeout", "10m"]
        proc = subprocess.run(drill, capture_output=True, text=True, timeout=800, check=False)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"drill refused ({proc.returncode}): {proc.stderr.strip()}")
        record = json.loads(proc.stdout)
        sh(*ctl, "cancel", run_id, check=False)
        return dict(record.get("finished") or {"outcome": "not finished"})
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        if victim:
            sh("bash", str(CLUSTER), "kill-node", victim, check=False)
            sh("bash", str(CLUSTER), "restart-node", victim, check=False)
            sh("scontrol", "update", f"NodeName={victim}", "State=RESUME", check=False)
            dn.stop([sim.nodes[victim]])
            dn.start([sim.nodes[victim]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="slurm,active")
    ap.add_argument("--poll", default="1s", help="b300d poll interval (default 1s)")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"slurm", "active"} or not 1 <= args.runs <= 20:
        raise SystemExit("--modes: slurm and/or active; --runs: 1 to 20")
    conf = os.environ.get("SLURM_CONF") or sh("bash", str(CLUSTER), "env").splitlines()[0].split("=", 1)[1]
    os.environ["SLURM_CONF"] = conf
    timeout = slurmd_timeout()
    ssh_base = int(os.environ.get("B300_SSHD_PORT_BASE", "22201")) + 80
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="b300-bench-drill-") as tmp:
        base = Path(tmp)
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
                    f = one_drill(base, conf, mode, args.poll, sim, n)
                    results[mode].append(f)
                    print(f"{mode} #{n + 1}: " + " ".join(f"{k}={f.get(k)}" for k in (*FIGURES, "outcome")),
                          flush=True)
        finally:
            dn.stop(nodes.values())
    print(f"\nnode crash (powered off) -> ... (seconds, median of {args.runs}; SlurmdTimeout={timeout}; "
          f"poll {args.poll}; {sh('sinfo', '-V').strip()})")
    print(f"{'mode':<8}" + "".join(f"{k.removesuffix('_s'):>12}" for k in FIGURES))
    for mode, rows in results.items():
        cells = []
        for k in FIGURES:
            vals = [float(r[k]) for r in rows if isinstance(r.get(k), int | float)]
            cells.append(f"{statistics.median(vals):>12.1f}" if len(vals) == len(rows) else f"{'-':>12}")
        print(f"{mode:<8}" + "".join(cells))
    print(json.dumps({"slurmd_timeout": timeout, "poll": args.poll, "drills": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
