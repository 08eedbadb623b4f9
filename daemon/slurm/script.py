"""Render the batch script and sbatch request for one attempt of a run (pure)."""

from __future__ import annotations

import os
import re
import shlex
import sys

from ..model import SubmitRequest
from ..spec import JobSpec

RESUME_PLACEHOLDER = "{resume_from}"


def attempt_tag(run_id: str, number: int) -> str:
    """The Slurm job name of an attempt: unique, and how a crash finds it again."""
    return f"b300-{run_id}-a{number}"


#: Seconds a failed step of a spare run waits for the daemon's next plan (b300.launcher
#: ``--hold``): longer than the liveness checks need to confirm the peer that killed it dead.
LAUNCHER_HOLD_S = 60


def launch_dir(log_dir: str, run_id: str, attempt: int) -> str:
    """The folder an attempt's launcher and the daemon share (plan.json, status.json)."""
    return os.path.join(log_dir, "launch", attempt_tag(run_id, attempt))


def render_script(
    spec: JobSpec, *, run_id: str, attempt: int, resume_from: str | None,
    launch_folder: str | None = None,
) -> str:
    """The batch script for one attempt.

    The spec's command is the job's own shell code and runs inside the job
    as the user wrote it; everything the daemon puts into the script is a
    quoted word, so no value from a spec or from Slurm becomes code.
    ``{resume_from}`` in the command becomes the quoted checkpoint path
    (an empty word when starting fresh); ``$B300_RESUME_FROM`` carries the
    same path; ``$B300_PROGRESS_FILE`` the spec's ``[health] progress_file``.
    """
    resume = resume_from or ""
    lines = [
        "#!/bin/bash",
        f"# b300-orchestrator: run {run_id}, attempt {attempt}",
        f"export B300_RUN_ID={shlex.quote(run_id)}",
        f"export B300_ATTEMPT={attempt}",
        f"export B300_RESUME_FROM={shlex.quote(resume)}",
    ]
    if spec.checkpoint.dir:
        lines.append(f"export B300_CHECKPOINT_DIR={shlex.quote(spec.checkpoint.dir)}")
    if spec.health.progress_file:
        # For b300.training.progress.ProgressWriter.from_env (``{host}``/``{rank}`` kept).
        lines.append(f"export B300_PROGRESS_FILE={shlex.quote(spec.health.progress_file)}")
    lines += [f"export {key}={shlex.quote(value)}" for key, value in spec.environment]
    if spec.elastic is not None:
        if launch_folder is None:
            raise ValueError("an elastic run needs the daemon's job_log_dir")
        from ..spec import elastic_argv

        # b300.elastic.host: the rendezvous store on this (the batch) host, one torchrun
        # agent per node as its own step, an agent on each spare the daemon adds.
        e = spec.elastic
        argv = [sys.executable, "-m", "b300.elastic.host", "--dir", launch_folder,
                "--nodes", str(spec.nodes), "--min-nodes", str(e.min_nodes),
                "--max-nodes", str(e.max_nodes), "--max-restarts", str(e.max_restarts),
                "--nproc-per-node", str(e.nproc_per_node), "--port", str(e.port),
                "--hold", str(LAUNCHER_HOLD_S), "--", *elastic_argv(spec)]
        lines += ["", "exec " + " ".join(shlex.quote(a) for a in argv), ""]
        return "\n".join(lines)
    if spec.spare_nodes:
        if launch_folder is None:
            raise ValueError("a run with spare_nodes needs the daemon's job_log_dir")
        # The launcher (b300.launcher) runs the command as a step on spec.nodes of the
        # allocation's nodes and relaunches it when the daemon plans so.
        argv = [sys.executable, "-m", "b300.launcher", "--dir", launch_folder,
                "--nodes", str(spec.nodes), "--ntasks-per-node", str(spec.ntasks_per_node or 1),
                "--hold", str(LAUNCHER_HOLD_S), "--command", spec.command]
        lines += ["", "exec " + " ".join(shlex.quote(a) for a in argv), ""]
        return "\n".join(lines)
    command = spec.command.replace(RESUME_PLACEHOLDER, shlex.quote(resume))
    lines += ["", command.rstrip("\n"), ""]
    return "\n".join(lines)


def output_pattern(spec: JobSpec, log_dir: str | None) -> str | None:
    """The job's ``--output`` pattern: the spec's own, else ``<log_dir>/%x-%j.out``
    (where the daemon reads the log back), else Slurm's default (``None``)."""
    return spec.output or (f"{log_dir.rstrip('/')}/%x-%j.out" if log_dir else None)


_NO_ARRAY = 4294967294  # what Slurm writes for %a of a job that is not an array task
_PATTERN_RE = re.compile(r"%(\d*)(.)", re.DOTALL)
_MAX_WIDTH = 10


def expand_output_pattern(
    pattern: str, *, job_id: int, job_name: str, user: str, batch_host: str,
    array_job_id: int | None = None, array_task_id: int | None = None,
) -> str:
    """The file Slurm writes a batch job's output to, for an ``--output`` pattern.

    As slurmstepd expands it for the batch step (checked on Slurm 22.05.8, see
    ``tests/live/test_output_pattern_live.py``): ``%%`` is ``%``; ``%j``, ``%J``
    (the batch step has no step number), ``%A`` (the job id when not an array),
    ``%a`` (4294967294 when not an array), ``%n`` and ``%t`` (0: the batch script
    runs on the first node, task 0) are numbers that a width zero-pads
    (``%5j``: ``00042``, at most 10 digits); ``%s`` is ``batch``, ``%u`` the user,
    ``%x`` the job name and ``%N`` the short host name of the batch node (ignoring
    any width). Other letters stay as written. A backslash anywhere turns all
    expansion off, and the backslashes are dropped.
    """
    if "\\" in pattern:
        return pattern.replace("\\", "")
    numbers = {"j": job_id, "J": job_id, "n": 0, "t": 0,
               "A": job_id if array_job_id is None else array_job_id,
               "a": _NO_ARRAY if array_task_id is None else array_task_id}
    words = {"s": "batch", "u": user, "x": job_name, "N": batch_host.split(".")[0]}

    def one(match: re.Match[str]) -> str:
        width, letter = match.group(1), match.group(2)
        if letter in numbers:
            return f"{numbers[letter]:0{min(int(width or 0), _MAX_WIDTH)}d}"
        if letter in words:
            return words[letter]
        if letter == "%" and not width:
            return "%"
        return f"{width}{letter}" if width else match.group(0)

    return _PATTERN_RE.sub(one, pattern)


def build_request(
    spec: JobSpec,
    *,
    run_id: str,
    attempt: int,
    resume_from: str | None = None,
    excluded_nodes: tuple[str, ...] = (),
    log_dir: str | None = None,
    reservation: str | None = None,
) -> SubmitRequest:
    """Everything sbatch needs for this attempt.

    Without an ``output`` in the spec, the job's log goes to
    ``<log_dir>/<job name>-<job id>.out``, where the daemon can read it.
    """
    output = output_pattern(spec, log_dir)
    return SubmitRequest(
        job_name=attempt_tag(run_id, attempt),
        comment=f"b300 run={run_id} attempt={attempt} name={spec.name}",
        script=render_script(spec, run_id=run_id, attempt=attempt, resume_from=resume_from,
                             launch_folder=launch_dir(log_dir, run_id, attempt)
                             if (spec.spare_nodes or spec.elastic) and log_dir else None),
        nodes=spec.nodes + spec.spare_nodes,
        gpus_per_node=spec.gpus_per_node,
        partition=spec.partition,
        time_limit=spec.time_limit,
        account=spec.account,
        qos=spec.qos,
        excluded_nodes=tuple(sorted(excluded_nodes)),
        output=output,
        workdir=spec.workdir,
        ntasks_per_node=spec.ntasks_per_node,
        requeue=spec.requeue,
        no_kill=spec.spare_nodes > 0 or spec.elastic is not None,
        reservation=reservation,
    )
