"""The in-allocation launcher: ``python -m b300.launcher``, the batch script of a run with
``spare_nodes`` (issue 15, the fast path).

The job holds N+K nodes (``sbatch --no-kill``: a failed node is taken out of the job, the
job goes on). The launcher runs the training as a job step on N of them::

    srun --job-name=b300-step --nodes=N --ntasks=N*T --ntasks-per-node=T \\
         --exclude=<plan's nodes> --kill-on-bad-exit=1 bash -c <command>

and is steered by the daemon through two small JSON files in its launch directory
(``<job_log_dir>/launch/<job name>/``, a folder both the job and the daemon reach):

- ``plan.json``, written by the daemon only, atomically (temporary file, fsync, rename),
  with a generation number: which nodes to exclude and the checkpoint to resume from.
  Generation 0 is implicit (no file): no exclusions, the attempt's own ``B300_RESUME_FROM``.
- ``status.json``, written by the launcher only: the generation whose step runs, its step
  id and nodes.

Rules (the fencing that keeps one training step at a time):

- Only the launcher starts steps, and only ever one: before it starts the step of a
  generation it waits until Slurm lists no ``b300-step`` step of the job, with one
  exception: a step whose srun has returned by itself (every task exited or its node
  failed) and that Slurm still lists only because a node the new plan excludes never
  reported its end (Slurm 22.05 keeps such a step RUNNING when a task on a healthy node
  exited before the dead node was set DOWN; ``scancel`` does not clear it, and it holds
  its CPUs on the healthy nodes, so the new step is started with ``--overlap``).
- A plan is taken only if it is for this job (``job_id``) and its generation is higher
  than the one running; the daemon never writes a generation that is not higher than the
  one on disk (:func:`write_plan` refuses).
- A newer plan while a step runs: the launcher ends that step (``scancel JOB.STEP``), waits
  until it is gone, then starts the new one. Its srun is given up to 60 s to return, but
  is killed as soon as Slurm no longer lists the step (an srun whose step included a
  powered-off node waits for that node long after Slurm ended the step).
- A step that ends by itself: exit 0 ends the launcher (training done). A failed step is
  often the survivors of a dead peer, which the daemon is still confirming: the launcher
  holds ``--hold`` seconds for a newer plan, and exits with the step's code if none comes
  (the job ends; recovery then resubmits as today).

The plan and status files are :mod:`b300.launcher.plan`, the steps in Slurm
:mod:`b300.launcher.steps`; their names are re-exported here. Only the standard library is
used here: the module runs on the job's first node.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from types import FrameType

from .plan import (
    PLAN,
    STATUS,
    Plan,
    PlanError,
    StalePlan,
    Status,
    next_plan,
    parse_plan,
    read_plan,
    read_status,
    write_plan,
    write_status,
)
from .steps import (
    RESUME_PLACEHOLDER,
    STEP_NAME,
    AfterCancel,
    after_cancel,
    hostnames,
    list_steps,
    parse_steps,
    say,
    stale_step,
    step_argv,
)

__all__ = ["FORWARDED", "PLAN", "RESUME_PLACEHOLDER", "STATUS", "STEP_NAME", "Action", "AfterCancel",
           "Launcher", "Plan", "PlanError", "StalePlan", "Status", "after_cancel", "decide", "main",
           "next_plan", "parse_plan", "parse_steps", "read_plan", "read_status", "stale_step",
           "step_argv", "write_plan", "write_status"]

#: Signals the launcher passes on to the running step (srun forwards them to the tasks).
FORWARDED = ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGURG", "SIGWINCH", "SIGALRM", "SIGCONT")
_MAX_GENERATIONS = 10_000
#: Seconds a cancelled step's srun is waited for while Slurm still lists the step.
SRUN_WAIT_S = 60.0

# -- the launcher's decisions (pure) --------------------------------------------------


class Action(Enum):
    WAIT = "wait"      # the step runs, or a failed step holds for a plan
    STOP = "stop"      # a newer plan: end the running step first
    START = "start"    # the step is gone and a newer plan is there: start it
    EXIT = "exit"      # done (exit 0), or failed with no newer plan within the hold


def decide(running: int, step_rc: int | None, newest: int, ended_for_s: float,
           hold_s: float) -> Action:
    """What to do now. ``running``: the generation of the current step; ``step_rc``: its
    exit code once srun has returned (None while it runs); ``newest``: the newest valid
    plan's generation for this job; ``ended_for_s``: how long ago the step ended."""
    if step_rc is None:
        return Action.STOP if newest > running else Action.WAIT
    if step_rc == 0:
        return Action.EXIT  # the training finished: a plan written meanwhile has nothing to do
    if newest > running:
        return Action.START
    return Action.EXIT if ended_for_s >= hold_s else Action.WAIT


# -- the loop ------------------------------------------------------------------------


class Launcher:
    """One job's launcher (one per batch script)."""

    def __init__(self, folder: Path, job_id: int, *, nodes: int, tasks_per_node: int, command: str,
                 hold_s: float, poll_s: float = 0.5, gone_timeout_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.folder, self.job_id = folder, job_id
        self.nodes, self.tasks_per_node, self.command = nodes, tasks_per_node, command
        self.hold_s, self.poll_s, self.gone_timeout_s = hold_s, poll_s, gone_timeout_s
        self.clock = clock
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.terminating = False

    # Slurm's view of the job's steps (b300.launcher.steps).
    def steps(self) -> list[tuple[str, str]] | None:
        return list_steps(self.job_id)

    def hostnames(self, nodelist: str) -> list[str]:
        return hostnames(nodelist)

    def wait_no_steps(self, exclude: Sequence[str] = (), srun_returned: bool = False
                      ) -> set[str] | None:
        """The stale steps (:func:`stale_step`) once Slurm lists no other b300 step of this
        job (an empty set: none listed at all); None after gone_timeout_s."""
        deadline = self.clock() + self.gone_timeout_s
        while self.clock() < deadline:
            steps = self.steps()
            if steps == []:
                return set()
            if steps and all(stale_step(self.hostnames(nodes), exclude, srun_returned)
                             for _, nodes in steps):
                say(f"step(s) {', '.join(s for s, _ in steps)} still listed only for node(s) "
                     f"{','.join(exclude)} that never reported (srun returned): not waiting")
                return {s for s, _ in steps}
            time.sleep(self.poll_s)
        return None

    def newest(self, current: Plan) -> Plan:
        try:
            plan = read_plan(self.folder, self.job_id)
        except PlanError as exc:
            say(f"ignoring the plan: {exc}")
            return current
        return plan if plan is not None and plan.generation > current.generation else current

    def start(self, plan: Plan, stale: set[str]) -> tuple[str, str]:
        env = {**os.environ, "B300_RESUME_FROM": plan.resume_from,
               "B300_STEP_GENERATION": str(plan.generation)}
        argv = step_argv(plan, nodes=self.nodes, tasks_per_node=self.tasks_per_node,
                         command=self.command, overlap=bool(stale))
        write_status(self.folder, Status(self.job_id, plan.generation, "starting"))
        say(f"generation {plan.generation}: starting the step (exclude "
             f"{','.join(plan.exclude) or 'none'}, resume {plan.resume_from or 'none'})")
        self.proc = subprocess.Popen(argv, env=env)
        step = ("", "")
        deadline = self.clock() + 60
        while self.clock() < deadline and self.proc.poll() is None:
            steps = [s for s in self.steps() or [] if s[0] not in stale]
            if steps:
                step = steps[-1]
                break
            time.sleep(self.poll_s)
        self.started_at = time.time()   # Slurm lists the step (or srun already returned)
        write_status(self.folder, Status(self.job_id, plan.generation, "running", step_id=step[0],
                                         nodes=step[1], started_at=self.started_at))
        return step

    def cancel(self, step_id: str) -> None:
        subprocess.run(["scancel", "--quiet", step_id], capture_output=True, timeout=30, check=False)

    def stop(self, step_id: str) -> tuple[int, bool]:
        """End the running step and wait for srun: its exit code, and whether srun returned
        by itself (False: it had to be killed, which proves nothing about the step).

        srun is waited for up to :data:`SRUN_WAIT_S`, but killed as soon as Slurm has not
        listed the step for :data:`~b300.launcher.steps.SRUN_GRACE_S`: an srun whose step
        held a powered-off node waits for that node long after Slurm ended the step."""
        assert self.proc is not None
        if step_id:
            self.cancel(step_id)
        else:
            self.proc.send_signal(signal.SIGTERM)
        began = self.clock()
        gone_since: float | None = None
        next_ask = began
        move = AfterCancel.WAIT
        # Bounded: the clock passes SRUN_WAIT_S (each squeue has its own timeout), and the
        # count of rounds is capped besides.
        for _ in range(int(SRUN_WAIT_S / max(self.poll_s, 0.01)) + 100):
            now = self.clock()
            if step_id and now >= next_ask and self.proc.poll() is None:
                next_ask = now + max(self.poll_s, 1.0)   # squeue at most once a second
                listed = self.steps()
                if listed is None:
                    pass                                  # squeue could not tell: no change
                elif any(s == step_id for s, _ in listed):
                    gone_since = None
                elif gone_since is None:
                    gone_since = now
                now = self.clock()
            move = after_cancel(self.proc.poll() is not None,
                                None if gone_since is None else now - gone_since,
                                now - began, timeout_s=SRUN_WAIT_S)
            if move is not AfterCancel.WAIT:
                break
            time.sleep(self.poll_s)
        if move is AfterCancel.RETURNED:
            return self.proc.wait(timeout=30), True
        if move is AfterCancel.GONE:
            say(f"step {step_id} is no longer listed by Slurm ({self.clock() - began:.1f} s after "
                "scancel) but srun still waits (for a node that does not answer): ending srun")
        else:
            say(f"srun of step {step_id or '?'} still runs {self.clock() - began:.0f} s after the "
                "cancel: ending srun")
        self.proc.kill()  # srun only; wait_no_steps() still waits for the step itself
        return self.proc.wait(timeout=30), False

    def forward(self, signum: int, _frame: FrameType | None) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.terminating = True

    def run(self, first: Plan) -> int:
        plan = self.newest(first)   # a batch script restarted in the same job takes the plan
        srun_returned = False
        for _ in range(_MAX_GENERATIONS):
            stale = self.wait_no_steps(plan.exclude, srun_returned)
            if stale is None:
                say(f"a b300 step of job {self.job_id} is still listed after "
                     f"{self.gone_timeout_s:.0f} s: not starting another")
                return 1
            if self.terminating:
                return 143
            step_id, _nodes = self.start(plan, stale)
            ended_at: float | None = None
            rc: int | None = None
            while True:
                if rc is None and self.proc is not None:
                    rc = self.proc.poll()
                    if rc is not None:
                        ended_at = self.clock()
                if self.terminating:
                    if rc is None and self.proc is not None:
                        try:
                            rc = self.proc.wait(timeout=60)
                        except subprocess.TimeoutExpired:
                            rc = 143
                    return rc if rc else 143
                newer = self.newest(plan)
                action = decide(plan.generation, rc, newer.generation,
                                0.0 if ended_at is None else self.clock() - ended_at, self.hold_s)
                if action is Action.WAIT:
                    time.sleep(self.poll_s)
                    continue
                if action is Action.EXIT:
                    code = rc if rc is not None else 1
                    write_status(self.folder, Status(self.job_id, plan.generation, "ended",
                                                     step_id=step_id, exit_code=code,
                                                     started_at=self.started_at))
                    say(f"generation {plan.generation}: the step ended (exit {code})")
                    return code
                if action is Action.STOP:
                    write_status(self.folder, Status(self.job_id, plan.generation, "stopping",
                                                     step_id=step_id))
                    say(f"generation {newer.generation} planned: ending step {step_id or '?'}")
                    rc, srun_returned = self.stop(step_id)
                    ended_at = self.clock()
                else:
                    srun_returned = True   # START: srun returned by itself
                plan = newer
                break
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m b300.launcher",
                                 description="Run a run's training step inside its allocation.")
    ap.add_argument("--dir", required=True, help="the launch folder (plan.json, status.json)")
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--ntasks-per-node", type=int, default=1)
    ap.add_argument("--hold", type=float, default=60.0,
                    help="seconds a failed step waits for a newer plan")
    ap.add_argument("--command", required=True, help="what each task runs (bash -c)")
    args = ap.parse_args(argv)
    if args.nodes < 1 or args.ntasks_per_node < 1 or args.hold < 0:
        say("--nodes and --ntasks-per-node must be at least 1, --hold not negative")
        return 2
    try:
        job_id = int(os.environ["SLURM_JOB_ID"])
    except (KeyError, ValueError):
        say("SLURM_JOB_ID is not set: run me as a Slurm batch script")
        return 2
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    launcher = Launcher(folder, job_id, nodes=args.nodes, tasks_per_node=args.ntasks_per_node,
                        command=args.command, hold_s=args.hold)
    for name in (*FORWARDED, "SIGTERM", "SIGINT"):
        signal.signal(getattr(signal, name), launcher.forward)
    return launcher.run(Plan(job_id, 0, (), os.environ.get("B300_RESUME_FROM", ""), "first step"))


if __name__ == "__main__":
    sys.exit(main())
