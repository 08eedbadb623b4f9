"""The launcher's training steps in Slurm: the srun command line of a plan's step, what
Slurm lists of the job's steps, and when to stop waiting for an srun after ``scancel``.

Slurm is asked with argument lists (``squeue --steps``, ``scontrol show hostnames``),
never through a shell; every call has a timeout. Only the standard library is used here:
the module runs on the job's first node.
"""

from __future__ import annotations

import enum
import shlex
import subprocess
import sys
from collections.abc import Sequence

from .plan import Plan

STEP_NAME = "b300-step"
RESUME_PLACEHOLDER = "{resume_from}"
#: Seconds an srun may take to return by itself after Slurm stopped listing its step.
SRUN_GRACE_S = 2.0
_SLURM_TIMEOUT_S = 30


def say(message: str) -> None:
    print(f"b300.launcher: {message}", file=sys.stderr, flush=True)


def step_argv(plan: Plan, *, nodes: int, tasks_per_node: int, command: str,
              overlap: bool = False) -> list[str]:
    """The srun command line of a plan's step (the command's ``{resume_from}`` becomes the
    plan's checkpoint, quoted). ``overlap``: stale steps (:func:`stale_step`) still hold
    the nodes' CPUs in Slurm's books."""
    argv = ["srun", f"--job-name={STEP_NAME}", f"--nodes={nodes}",
            f"--ntasks={nodes * tasks_per_node}", f"--ntasks-per-node={tasks_per_node}",
            "--kill-on-bad-exit=1"]
    if overlap:
        argv.append("--overlap")
    if plan.exclude:
        argv.append(f"--exclude={','.join(plan.exclude)}")
    return [*argv, "bash", "-c", command.replace(RESUME_PLACEHOLDER, shlex.quote(plan.resume_from))]


def stale_step(step_nodes: Sequence[str], exclude: Sequence[str], srun_returned: bool) -> bool:
    """A listed step that holds nothing: its srun returned by itself and it lists a node the
    plan excludes (a dead node that never reported the step's end)."""
    return srun_returned and bool(set(step_nodes) & set(exclude))


def parse_steps(squeue_out: str, job_id: int) -> list[tuple[str, str]]:
    """(step id, nodes) of the job's b300 steps in ``squeue --steps --format=%i|%j|%N``."""
    out = []
    for line in squeue_out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[1] == STEP_NAME and parts[0].startswith(f"{job_id}."):
            out.append((parts[0], parts[2]))
    return out


def list_steps(job_id: int) -> list[tuple[str, str]] | None:
    """The job's b300 steps as Slurm lists them now; None when squeue could not tell."""
    try:
        out = subprocess.run(["squeue", "--steps", "--noheader", f"--jobs={job_id}",
                              "--format=%i|%j|%N"], capture_output=True, text=True,
                             timeout=_SLURM_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(f"squeue failed: {exc}")
        return None
    if out.returncode != 0:
        say(f"squeue failed (exit {out.returncode}): {' '.join(out.stderr.split())[:200]}")
        return None
    return parse_steps(out.stdout, job_id)


def hostnames(nodelist: str) -> list[str]:
    """The node names of a Slurm node list (none when scontrol cannot expand it)."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=_SLURM_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return out.stdout.split() if out.returncode == 0 else []


class AfterCancel(enum.Enum):
    """What to do with the srun of a step the launcher cancelled."""

    RETURNED = "returned"   # srun returned by itself
    WAIT = "wait"
    GONE = "gone"           # Slurm no longer lists the step: kill srun now
    TIMEOUT = "timeout"     # the wait is over: kill srun (the step may still be listed)


def after_cancel(srun_returned: bool, gone_for_s: float | None, waited_s: float, *,
                 timeout_s: float, grace_s: float = SRUN_GRACE_S) -> AfterCancel:
    """The next move while waiting for a cancelled step's srun (pure).

    ``gone_for_s``: for how long Slurm has not listed the step (None: it is listed, or
    squeue could not tell). An srun whose step Slurm ended may still wait for a node that
    never answers (powered off): once the step is gone for ``grace_s`` it is killed at
    once instead of after ``timeout_s``."""
    if srun_returned:
        return AfterCancel.RETURNED
    if gone_for_s is not None and gone_for_s >= grace_s:
        return AfterCancel.GONE
    if waited_s >= timeout_s:
        return AfterCancel.TIMEOUT
    return AfterCancel.WAIT
