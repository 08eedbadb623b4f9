"""The batch script of an elastic run: ``python -m b300.elastic.host`` (issue 33).

It runs on the job's batch host (the allocation's first node) and:

- hosts the c10d rendezvous store (a ``torch.distributed.TCPStore`` on ``--port``) that
  every torchrun agent joins as a client (``--rdzv-conf=is_host=false``), so no agent owns
  the rendezvous and any agent may die. The batch host itself is the one node whose loss
  ends the job: Slurm ends a job whose batch script is gone, ``--no-kill`` or not;
- starts one torchrun agent per node as its own job step (``srun --nodes=1 --ntasks=1
  --nodelist=NODE torchrun --nnodes=MIN:MAX ...``) on the first ``--nodes`` nodes of the
  allocation; the rest are spares;
- starts an agent on each node the daemon adds in ``elastic.json`` (written by the daemon
  only, atomically: ``{"job_id", "generation", "add": [nodes]}``), once per node;
- writes ``elastic-status.json`` (its own: the agents and how each ended) after each change;
- ends when no agent runs: 0 if one ended with 0 (the training is done), else after
  ``--hold`` seconds without a new agent to start, with the last agent's exit code.

Every word it passes on is a list element; no shell runs anything here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..launcher.plan import atomic_write

PLAN = "elastic.json"
STATUS = "elastic-status.json"
STEP_NAME = "b300-agent"


def read_plan(folder: str | Path, job_id: int) -> tuple[int, list[str]]:
    """The generation and the nodes the daemon added for ``job_id`` (0 and none without a
    plan, or with one for another job or that cannot be read)."""
    try:
        data = json.loads((Path(folder) / PLAN).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0, []
    if not isinstance(data, dict) or data.get("job_id") != job_id:
        return 0, []
    gen, add = data.get("generation"), data.get("add")
    if not isinstance(gen, int) or not isinstance(add, list) or not all(isinstance(n, str) for n in add):
        return 0, []
    return gen, add


def write_plan(folder: str | Path, job_id: int, generation: int, add: list[str]) -> None:
    """The daemon's side: the nodes to start an agent on (all of them so far)."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    atomic_write(path / PLAN, json.dumps({"job_id": job_id, "generation": generation,
                                           "add": sorted(set(add))}, sort_keys=True))


def read_status(folder: str | Path) -> dict[str, object] | None:
    try:
        data = json.loads((Path(folder) / STATUS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _slurm(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=True).stdout


def node_addr(node: str) -> str:
    """The address Slurm holds for ``node`` (its NodeAddr), else the name."""
    try:
        out = _slurm("scontrol", "show", "node", node)
    except (OSError, subprocess.SubprocessError):
        return node
    m = re.search(r"\bNodeAddr=(\S+)", out)
    return m.group(1) if m else node


def job_nodes(job_id: str) -> set[str] | None:
    """The nodes Slurm holds in the job now (None when it cannot tell)."""
    try:
        listed = _slurm("squeue", "-h", "-j", job_id, "-o", "%N").strip()
        return set(_slurm("scontrol", "show", "hostnames", listed).split()) if listed else None
    except (OSError, subprocess.SubprocessError):
        return None


def agent_argv(node: str, *, job_id: str, endpoint: str, args: argparse.Namespace) -> list[str]:
    """One torchrun agent on ``node``, as a one-node step of the job."""
    conf = f"is_host=false,join_timeout={args.join_timeout},last_call_timeout={args.last_call}"
    return ["srun", f"--jobid={job_id}", f"--job-name={STEP_NAME}", "--nodes=1", "--ntasks=1",
            f"--nodelist={node}", "--kill-on-bad-exit=0", "--overlap",
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={args.min_nodes}:{args.max_nodes}", f"--nproc-per-node={args.nproc_per_node}",
            f"--max-restarts={args.max_restarts}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job_id}", f"--rdzv-conf={conf}",
            f"--local-addr={node_addr(node)}", *args.script]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="b300.elastic.host")
    p.add_argument("--dir", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--min-nodes", type=int, required=True)
    p.add_argument("--max-nodes", type=int, required=True)
    p.add_argument("--max-restarts", type=int, required=True)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--hold", type=float, default=60.0)
    p.add_argument("--join-timeout", type=int, default=600)
    p.add_argument("--last-call", type=int, default=5)
    p.add_argument("script", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.script[:1] == ["--"]:
        args.script = args.script[1:]
    if not args.script:
        print("b300.elastic.host: no training script given", file=sys.stderr)
        return 2
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        print("b300.elastic.host: not inside a Slurm job (SLURM_JOB_ID)", file=sys.stderr)
        return 2
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    nodes = _slurm("scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")).split()
    batch_host = os.environ.get("SLURMD_NODENAME", nodes[0] if nodes else "")
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    # The rendezvous store: every agent is a client of it (is_host=false).
    addr = node_addr(batch_host)
    store = TCPStore(addr, args.port, is_master=True, wait_for_workers=False)  # noqa: F841
    endpoint = f"{addr}:{args.port}"
    agents: dict[str, subprocess.Popen[bytes]] = {}
    ended: dict[str, int] = {}
    started_at: dict[str, float] = {}

    def start(node: str) -> None:
        # Each rendezvous round's rank 0 publishes its own worker store address: with the
        # shared agent store (torch's default) a rank 0 that stays rank 0 never publishes it
        # again and an agent joining later waits for it forever.
        env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        agents[node] = subprocess.Popen(agent_argv(node, job_id=job_id, endpoint=endpoint, args=args),
                                        env=env)
        started_at[node] = time.time()

    def status() -> None:
        atomic_write(folder / STATUS, json.dumps({
            "job_id": int(job_id), "batch_host": batch_host, "endpoint": endpoint,
            "running": sorted(n for n in agents if n not in ended), "ended": ended,
            "started_at": started_at}, sort_keys=True))

    def stop(signum: int, _frame: object) -> None:
        for proc in agents.values():
            if proc.poll() is None:
                proc.send_signal(signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, stop)

    for node in nodes[:args.nodes]:
        start(node)
    status()
    idle_since: float | None = None
    done_since: float | None = None
    next_check = time.monotonic() + 5
    last_code = 1
    while True:
        changed = False
        _, add = read_plan(folder, int(job_id))
        for node in add:
            if node not in agents:
                start(node)
                changed = True
        for node, proc in agents.items():
            code = proc.poll()
            if code is not None and node not in ended:
                ended[node], last_code, changed = code, code, True
        if time.monotonic() >= next_check:
            # An agent whose node Slurm took out of the job (set DOWN under --no-kill) is
            # gone, though its srun may wait for that node's end of step for ever.
            next_check = time.monotonic() + 5
            in_job = job_nodes(job_id)
            for node in agents:
                if in_job is not None and node not in ended and node not in in_job:
                    ended[node], changed = -1, True
        if changed:
            status()
        running = [n for n in agents if n not in ended]
        if any(c == 0 for c in ended.values()):
            # The training is done; an srun to a node that died may never return.
            done_since = done_since or time.monotonic()
            if not running or time.monotonic() - done_since > args.hold:
                return 0
        elif not running:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > args.hold:
                return last_code or 1
        else:
            idle_since = None
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
