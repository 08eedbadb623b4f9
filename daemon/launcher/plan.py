"""The launcher's two files in its launch folder (``<job_log_dir>/launch/<job name>/``),
shared by the job's launcher and the daemon:

- ``plan.json``, written by the daemon only, atomically (temporary file, fsync, rename),
  with a generation number: which nodes to exclude and the checkpoint to resume from.
  :func:`write_plan` refuses a generation that is not higher than the one on disk;
- ``status.json``, written by the launcher only: the generation whose step runs, its step
  id and nodes.

Only the standard library is used here: the module runs on the job's first node.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PLAN = "plan.json"
STATUS = "status.json"
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


def atomic_write(path: Path, text: str) -> None:
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
    atomic_write(path / PLAN, plan.to_json() + "\n")


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
    atomic_write(Path(folder) / STATUS, json.dumps({
        "job_id": status.job_id, "generation": status.generation, "state": status.state,
        "step_id": status.step_id, "nodes": status.nodes, "started_at": status.started_at,
        "exit_code": status.exit_code, "batch_host": status.batch_host or
        os.environ.get("SLURMD_NODENAME", "")}, sort_keys=True) + "\n")
