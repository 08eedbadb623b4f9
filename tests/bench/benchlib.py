"""Helpers the local-cluster benches share (bench_drill, bench_recovery, bench_trigger).

Imported as ``benchlib``: a bench run as ``python tests/bench/X.py`` has this folder
first on ``sys.path``. Everything here is a thin, bounded wrapper over the local
cluster's commands (``deploy/localcluster.sh``, ``sinfo``, ``scontrol``).
"""

from __future__ import annotations

import json
import os
import subprocess
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


def node_state(node: str) -> str:
    return sh("sinfo", "-h", "-N", f"--nodes={node}", "-o", "%T", check=False).strip()


def restore(node: str, timeout: float = 60) -> None:
    """Bring a killed or frozen node back: processes killed, slurmd restarted, resumed, idle."""
    sh("bash", str(CLUSTER), "kill-node", node, check=False)
    sh("bash", str(CLUSTER), "restart-node", node, check=False)
    sh("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    wait(lambda: any(s in node_state(node) for s in ("idle", "mix")), timeout, f"{node} idle", 0.5)
