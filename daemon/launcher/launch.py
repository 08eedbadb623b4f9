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
  until it is gone, then starts the new one.
- A step that ends by itself: exit 0 ends the launcher (training done). A failed step is
  often the survivors of a dead peer, which the daemon is still confirming: the launcher
  holds ``--hold`` seconds for a newer plan, and exits with the step's code if none comes
  (the job ends; recovery then resubmits as today).

Only the standard library is used here: the module runs on the job's first node.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import FrameType

PLAN = "plan.json"
STATUS = "status.json"
STEP_NAME = "b300-step"
RESUME_PLACEHOLDER = "{resume_from}"
#: Signals the launcher passes on to the running step (srun forwards them to the tasks).
FORWARDED = ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGURG", "SIGWINCH", "SIGALRM", "SIGCONT")
_MAX_GENERATIONS = 10_000


class PlanError(ValueError):
    """A plan file that cannot be used (one line naming the problem)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What the step of one generation runs with."""

    job_id: int
    generation: int
    exclude: tuple[str, ...] = ()
    resume_from: str = ""
    reason: str = ""

    def to_json(self) -> str:
        return json.dumps({"job_id": self.job_id, "generation": self.generation,
                           "exclude": list(self.exclude), "resume_from": self.resume_from,
                           "reason": self.reason}, sort_keys=True)


@dataclass(frozen=True, slots=True)
class Status:
    """What the launcher runs now (``state``: starting, running, stopping, ended)."""

    job_id: int
    generation: int
    state: str
    step_id: str = ""
    nodes: str = ""
    started_at: float = 0.0
    exit_code: int | None = None
    batch_host: str = ""   # the node running the launcher: its loss ends the job


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PlanError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except ValueError:
        raise PlanError(f"{path}: not JSON") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: not a JSON object")
    return data


def parse_plan(data: dict[str, object], where: str = "plan") -> Plan:
    """A plan from its JSON object; a PlanError names the bad field."""
    job_id, gen, exclude = data.get("job_id"), data.get("generation"), data.get("exclude", [])
    resume, reason = data.get("resume_from", ""), data.get("reason", "")
    if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id <= 0:
        raise PlanError(f"{where}: job_id must be a positive integer")
    if not isinstance(gen, int) or isinstance(gen, bool) or not 0 <= gen <= _MAX_GENERATIONS:
        raise PlanError(f"{where}: generation must be an integer from 0 to {_MAX_GENERATIONS}")
    if not isinstance(exclude, list) or not all(isinstance(n, str) and n and "," not in n
                                                 for n in exclude):
        raise PlanError(f"{where}: exclude must be a list of node names")
    if not isinstance(resume, str) or not isinstance(reason, str):
        raise PlanError(f"{where}: resume_from and reason must be strings")
    return Plan(job_id, gen, tuple(sorted(set(exclude))), resume, reason)


def read_plan(folder: str | os.PathLike[str], job_id: int) -> Plan | None:
    """The plan on disk for ``job_id``; None when there is none (or it is another job's:
    a folder reused by a requeued job id starts again at generation 0)."""
    data = _read_json(Path(folder) / PLAN)
    if data is None:
        return None
    plan = parse_plan(data, str(Path(folder) / PLAN))
    return plan if plan.job_id == job_id else None


def next_plan(current: Plan | None, job_id: int, lost: Sequence[str], resume_from: str,
              reason: str, *, at_least: int = 0) -> Plan:
    """The plan after ``current`` that also excludes ``lost``: the next generation (and above
    ``at_least``, a generation the daemon already recorded as intended)."""
    base = current.generation if current is not None and current.job_id == job_id else 0
    old = current.exclude if current is not None and current.job_id == job_id else ()
    return Plan(job_id, max(base, at_least) + 1, tuple(sorted({*old, *lost})), resume_from, reason)


class StalePlan(PlanError):
    """The folder holds this generation or a newer one already."""


def write_plan(folder: str | os.PathLike[str], plan: Plan) -> None:
    """Write ``plan`` atomically; refused (:class:`StalePlan`) unless its generation is higher
    than the one on disk for the same job, so a stale writer can never step a plan back."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    current = read_plan(path, plan.job_id)
    if current is not None and current.generation >= plan.generation:
        raise StalePlan(f"{path / PLAN}: generation {current.generation} is on disk; "
                        f"not writing generation {plan.generation}")
    _atomic_write(path / PLAN, plan.to_json() + "\n")


def read_status(folder: str | os.PathLike[str], job_id: int) -> Status | None:
    """The launcher's status for ``job_id`` (None: none yet, or another job's)."""
    data = _read_json(Path(folder) / STATUS)
    if data is None:
        return None
    try:
        status = Status(job_id=int(data["job_id"]), generation=int(data["generation"]),  # type: ignore[call-overload]
                        state=str(data["state"]), step_id=str(data.get("step_id", "")),
                        nodes=str(data.get("nodes", "")),
                        started_at=float(data.get("started_at", 0.0)),  # type: ignore[arg-type]
                        exit_code=None if data.get("exit_code") is None
                        else int(data["exit_code"]),  # type: ignore[call-overload]
                        batch_host=str(data.get("batch_host", "")))
    except (KeyError, TypeError, ValueError):
        raise PlanError(f"{Path(folder) / STATUS}: not a launcher status") from None
    return status if status.job_id == job_id else None


def write_status(folder: str | os.PathLike[str], status: Status) -> None:
    _atomic_write(Path(folder) / STATUS, json.dumps({
        "job_id": status.job_id, "generation": status.generation, "state": status.state,
        "step_id": status.step_id, "nodes": status.nodes, "started_at": status.started_at,
        "exit_code": status.exit_code, "batch_host": status.batch_host or
        os.environ.get("SLURMD_NODENAME", "")}, sort_keys=True) + "\n")


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


# -- the loop ------------------------------------------------------------------------


def _say(message: str) -> None:
    print(f"b300.launcher: {message}", file=sys.stderr, flush=True)


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

    # Slurm's view of the job's steps.
    def steps(self) -> list[tuple[str, str]] | None:
        try:
            out = subprocess.run(["squeue", "--steps", "--noheader", f"--jobs={self.job_id}",
                                  "--format=%i|%j|%N"], capture_output=True, text=True,
                                 timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _say(f"squeue failed: {exc}")
            return None
        if out.returncode != 0:
            _say(f"squeue failed (exit {out.returncode}): {' '.join(out.stderr.split())[:200]}")
            return None
        return parse_steps(out.stdout, self.job_id)

    def hostnames(self, nodelist: str) -> list[str]:
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                 text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return []
        return out.stdout.split() if out.returncode == 0 else []

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
                _say(f"step(s) {', '.join(s for s, _ in steps)} still listed only for node(s) "
                     f"{','.join(exclude)} that never reported (srun returned): not waiting")
                return {s for s, _ in steps}
            time.sleep(self.poll_s)
        return None

    def newest(self, current: Plan) -> Plan:
        try:
            plan = read_plan(self.folder, self.job_id)
        except PlanError as exc:
            _say(f"ignoring the plan: {exc}")
            return current
        return plan if plan is not None and plan.generation > current.generation else current

    def start(self, plan: Plan, stale: set[str]) -> tuple[str, str]:
        env = {**os.environ, "B300_RESUME_FROM": plan.resume_from,
               "B300_STEP_GENERATION": str(plan.generation)}
        argv = step_argv(plan, nodes=self.nodes, tasks_per_node=self.tasks_per_node,
                         command=self.command, overlap=bool(stale))
        write_status(self.folder, Status(self.job_id, plan.generation, "starting"))
        _say(f"generation {plan.generation}: starting the step (exclude "
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

    def stop(self, step_id: str) -> tuple[int, bool]:
        """End the running step and wait for srun: its exit code, and whether srun returned
        by itself (False: it had to be killed, which proves nothing about the step)."""
        assert self.proc is not None
        if step_id:
            subprocess.run(["scancel", "--quiet", step_id], capture_output=True, timeout=30,
                           check=False)
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60), True
        except subprocess.TimeoutExpired:
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
                _say(f"a b300 step of job {self.job_id} is still listed after "
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
                    _say(f"generation {plan.generation}: the step ended (exit {code})")
                    return code
                if action is Action.STOP:
                    write_status(self.folder, Status(self.job_id, plan.generation, "stopping",
                                                     step_id=step_id))
                    _say(f"generation {newer.generation} planned: ending step {step_id or '?'}")
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
        _say("--nodes and --ntasks-per-node must be at least 1, --hold not negative")
        return 2
    try:
        job_id = int(os.environ["SLURM_JOB_ID"])
    except (KeyError, ValueError):
        _say("SLURM_JOB_ID is not set: run me as a Slurm batch script")
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
