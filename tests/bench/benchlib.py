"""Helpers the local-cluster benches share (bench_drill, bench_recovery, bench_trigger).

Imported as ``benchlib``: a bench run as ``python tests/bench/X.py`` has this folder
first on ``sys.path``. Everything here is a thin, bounded wrapper over the local
cluster's commands (``deploy/localcluster.sh``, ``sinfo``, ``scontrol``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "deploy" / "localcluster.sh"
TRAIN = REPO / "tests" / "workload" / "train.py"


def sh(*argv: str, timeout: float = 120, check: bool = True) -> str:
    """Run a command, return its stdout (raises on a non-zero exit when ``check``)."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=check).stdout


def wait(pred: Any, timeout: float, what: str, every: float = 0.25) -> Any:
    """Poll ``pred`` until it returns something true, at most ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def cluster_conf() -> str:
    """The cluster's slurm.conf: ``SLURM_CONF``, else the one ``localcluster.sh env`` names."""
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        line = next(ln for ln in sh("bash", str(CLUSTER), "env").splitlines() if "SLURM_CONF=" in ln)
        conf = line.split("=", 1)[1].strip()
    os.environ["SLURM_CONF"] = conf
    return conf


def slurmd_timeout() -> str:
    for line in sh("scontrol", "show", "config").splitlines():
        if line.startswith("SlurmdTimeout"):
            return line.split("=", 1)[1].strip()
    return "?"


def progress(run_dir: Path) -> dict[str, Any]:
    """The workload's ``progress.json`` (tests/workload/train.py), or {} before it exists."""
    try:
        return dict(json.loads((run_dir / "progress.json").read_text()))
    except (OSError, ValueError):
        return {}


def node_down_at(node: str) -> float | None:
    """When slurmctld marked ``node`` down (the timestamp of its reason, 1 s resolution)."""
    out = sh("sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T|%H")
    state, ts = out.strip().splitlines()[0].split("|")
    if "down" not in state and "drain" not in state and "fail" not in state:
        return None
    try:
        return datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return None


def slurm_has_down(node: str) -> bool:
    """Slurm shows ``node`` down, failed or drained, or with a reason set. The state alone
    can miss it: DOWN and a requeue come in the same millisecond, and the node may show as
    completing right after; the reason ("Not responding") stays until the node is resumed."""
    out = sh("sinfo", "-h", "-N", f"--nodes={node}", "-o", "%T|%E", check=False)
    st, _, reason = out.strip().partition("|")
    return any(w in st for w in ("down", "fail", "drain")) or reason.strip() not in ("", "none")


def node_state(node: str) -> str:
    return sh("sinfo", "-h", "-N", f"--nodes={node}", "-o", "%T", check=False).strip()


def restore(node: str, timeout: float = 60) -> None:
    """Bring a killed or frozen node back: processes killed, slurmd restarted, resumed, idle."""
    sh("bash", str(CLUSTER), "kill-node", node, check=False)
    sh("bash", str(CLUSTER), "restart-node", node, check=False)
    sh("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    wait(lambda: any(s in node_state(node) for s in ("idle", "mix")), timeout, f"{node} idle", 0.5)


OTHER_USER = "nobody"


def other_user(*args: str) -> str:
    """``sbatch`` as another user (the cluster's other tenant: tests/live/test_spares_live.py),
    ``--exclusive``; the job id."""
    env = {"SLURM_CONF": os.environ["SLURM_CONF"], "PATH": os.environ["PATH"]}
    out = subprocess.run(["runuser", "-u", OTHER_USER, "--", "sbatch", "--parsable", "--output=/dev/null",
                          "--exclusive", *args], capture_output=True, text=True, timeout=60, check=True,
                         env=env, cwd="/tmp")
    return out.stdout.strip().split(";")[0]


def all_nodes() -> list[str]:
    return sorted(set(sh("sinfo", "--noheader", "--Node", "--format=%N").split()))


def job_state(job: str) -> str:
    """squeue's state of ``job`` ("" once it left the queue)."""
    return sh("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()


class Busy:
    """Another user's jobs: one running on ``nodes`` (every node the bench does not use)
    and one more waiting for 2 nodes, so the queue is not empty. Both end when
    :meth:`release` cancels them (the bench does so a fixed time after its crash)."""

    def __init__(self, nodes: list[str]) -> None:
        self.jobs: list[str] = []
        if nodes:
            self.jobs.append(other_user(f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}",
                                        "--time=30", "--wrap", "sleep 1800"))
            wait(lambda: job_state(self.jobs[0]) == "RUNNING", 60, "the other user's job")
        self.jobs.append(other_user("--nodes=2", "--time=30", "--wrap", "sleep 1800"))
        self.released: float | None = None

    def states(self) -> list[str]:
        return [job_state(j) for j in self.jobs]

    def release(self) -> None:
        if self.released is None:
            sh("scancel", *self.jobs, check=False)
            self.released = time.time()


def history(run_dir: Path) -> list[dict[str, Any]]:
    """The workload's ``history.jsonl``: one line per attempt/generation that started training."""
    try:
        lines = (run_dir / "history.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(dict(json.loads(line)))
        except ValueError:
            continue
    return out


def queue_empty(timeout: float = 120) -> None:
    """Wait (bounded) until no job is left in the queue (pending, running or completing)."""
    wait(lambda: not sh("squeue", "-h", "-o", "%i", check=False).strip(), timeout, "an empty queue", 0.5)


def work_dir(stack: contextlib.ExitStack, keep: str | None, prefix: str) -> Path:
    """``--keep DIR`` (made new, kept afterwards), else a temporary folder ``stack`` removes."""
    if keep:
        base = Path(keep)
        base.mkdir(parents=True)
        return base
    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
