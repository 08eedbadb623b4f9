"""The Slurm client over pyslurm, run in a worker process.

Why a worker process: ``import pyslurm`` calls ``slurm_init()``, and libslurm
calls ``fatal()`` (exiting the whole process) on an unreadable slurm.conf; no
pyslurm call releases the GIL either. So pyslurm never runs in the daemon's
process: a child does each request and sends back plain dicts, and a child
that dies or hangs costs one transient :class:`SlurmError`, not the daemon.

pyslurm on PyPI builds only against Slurm 25.11, so this path cannot be run
against the local test cluster (Slurm 22.05/24.11); its conversion functions
are tested on plain data, and ``auto`` falls back to the command-line client
whenever pyslurm does not import.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from ..errors import SlurmError
from ..model import JobObservation, NodeObservation, SubmitRequest
from .parse import expand_nodes, parse_state


def pyslurm_available(slurm_conf: str | None = None, timeout: float = 20.0) -> str | None:
    """``None`` when pyslurm imports in a child process, else why not (one line)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_probe, args=(child, slurm_conf), daemon=True)
    proc.start()
    try:
        if not parent.poll(timeout):
            return "pyslurm import timed out"
        ok, msg = parent.recv()
        return None if ok else str(msg)
    except EOFError:
        return f"pyslurm import killed its process (exit {proc.exitcode})"
    finally:
        proc.join(1)
        if proc.is_alive():
            proc.kill()


def _probe(conn: Any, slurm_conf: str | None) -> None:
    if slurm_conf:
        os.environ["SLURM_CONF"] = slurm_conf
    try:
        import pyslurm  # noqa: F401
    except Exception as exc:
        conn.send((False, f"pyslurm does not import: {exc}".splitlines()[0]))
        return
    conn.send((True, ""))


def _worker(conn: Any, slurm_conf: str | None) -> None:  # pragma: no cover - needs Slurm 25.11
    if slurm_conf:
        os.environ["SLURM_CONF"] = slurm_conf
    import pyslurm

    while True:
        try:
            op, args = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, _OPS[op](pyslurm, *args)))
        except Exception as exc:
            conn.send((False, f"{type(exc).__name__}: {exc}"))


def _job_dict(job: Any) -> dict[str, Any]:  # pragma: no cover - needs Slurm 25.11
    return {
        "job_id": job.id, "state": job.state, "name": job.name or "",
        "nodes": job.allocated_nodes or "", "reason": job.state_reason or "",
        "exit_code": getattr(job, "exit_code", None), "signal": getattr(job, "exit_code_signal", None),
        "start": job.start_time, "end": job.end_time, "restarts": getattr(job, "requeue_count", 0) or 0,
        "comment": job.comment or "",
    }


def _op_submit(ps: Any, req: dict[str, Any]) -> int:  # pragma: no cover - needs Slurm 25.11
    desc = ps.JobSubmitDescription(**{k: v for k, v in req.items() if v not in (None, "", [])})
    return int(desc.submit())


def _op_jobs(ps: Any, ids: list[int]) -> list[dict[str, Any]]:  # pragma: no cover
    wanted = set(ids)
    return [_job_dict(j) for j in ps.Jobs.load().values() if j.id in wanted]


def _op_accounting(ps: Any, ids: list[int]) -> list[dict[str, Any]]:  # pragma: no cover
    jobs = ps.db.Jobs.load(ps.db.JobFilter(ids=ids))
    return [_job_dict(j) for j in jobs.values()]


def _op_by_name(ps: Any, name: str) -> list[dict[str, Any]]:  # pragma: no cover
    live = [_job_dict(j) for j in ps.Jobs.load().values() if j.name == name]
    acct = [_job_dict(j) for j in ps.db.Jobs.load(ps.db.JobFilter(names=[name])).values()]
    return live + acct


def _op_cancel(ps: Any, job_id: int, signal: str | None, batch: bool) -> None:  # pragma: no cover
    job = ps.Job(job_id)
    if signal:
        job.send_signal(signal, steps="batch" if batch else "children")
    else:
        job.cancel()


def _op_nodes(ps: Any) -> list[dict[str, Any]]:  # pragma: no cover
    return [{"name": n.name, "state": n.state, "reason": n.reason or ""}
            for n in ps.Nodes.load().values()]


def _op_node_state(ps: Any, node: str, state: str, reason: str) -> None:  # pragma: no cover
    ps.Node(node).modify(ps.Node(state=state, reason=reason or None))


def _op_exclude(ps: Any, job_id: int, nodes: list[str]) -> None:  # pragma: no cover
    ps.Job(job_id).modify(ps.JobSubmitDescription(excluded_nodes=nodes))


_OPS: dict[str, Callable[..., Any]] = {
    "exclude": _op_exclude,
    "submit": _op_submit, "jobs": _op_jobs, "accounting": _op_accounting,
    "by_name": _op_by_name, "cancel": _op_cancel, "nodes": _op_nodes,
    "node_state": _op_node_state,
}


def observation_from_dict(d: dict[str, Any], source: str) -> JobObservation:
    """A pyslurm job record (as plain data) into an observation; pure."""

    def ts(v: Any) -> datetime | None:
        return datetime.fromtimestamp(int(v), UTC) if v else None

    return JobObservation(
        job_id=int(d["job_id"]), state=parse_state(str(d["state"])), name=str(d.get("name") or ""),
        nodes=expand_nodes(str(d.get("nodes") or "")), reason=str(d.get("reason") or ""),
        exit_code=d.get("exit_code") if source == "sacct" else None,
        signal=d.get("signal") if source == "sacct" else None,
        start=ts(d.get("start")), end=ts(d.get("end")), restarts=int(d.get("restarts") or 0),
        comment=str(d.get("comment") or ""), source=source,
    )


def submit_description(request: SubmitRequest) -> dict[str, Any]:
    """The keyword arguments of ``pyslurm.JobSubmitDescription`` for a request; pure."""
    return {
        "name": request.job_name, "comment": request.comment, "script": request.script,
        "nodes": request.nodes, "gpus_per_node": request.gpus_per_node or None,
        "ntasks_per_node": request.ntasks_per_node, "partition": request.partition,
        "time_limit": request.time_limit, "account": request.account, "qos": request.qos,
        "standard_output": request.output, "working_directory": request.workdir,
        "excluded_nodes": list(request.excluded_nodes), "is_requeueable": request.requeue,
    }


class PyslurmClient:
    """:class:`b300.interfaces.SlurmClient` over pyslurm in an isolated worker."""

    name = "pyslurm"

    def __init__(self, *, slurm_conf: str | None = None, timeout: float = 30.0) -> None:
        self._conf = slurm_conf
        self._timeout = timeout
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self.calls: dict[str, int] = {}

    def _request(self, op: str, *args: Any) -> Any:
        self.calls[op] = self.calls.get(op, 0) + 1
        if self._proc is None or not self._proc.is_alive():
            parent, child = self._ctx.Pipe()
            self._proc = self._ctx.Process(target=_worker, args=(child, self._conf), daemon=True)
            self._proc.start()
            self._conn = parent
        try:
            self._conn.send((op, args))
            if not self._conn.poll(self._timeout):
                self._restart()
                raise SlurmError(f"pyslurm {op} timed out after {self._timeout:.0f} s")
            ok, value = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            self._restart()
            raise SlurmError(f"pyslurm worker died during {op}") from None
        if not ok:
            transient = "contact" in value.lower() or "timed out" in value.lower()
            raise SlurmError(f"pyslurm {op} failed: {value}", transient=transient)
        return value

    def _restart(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(1)
        self._proc = None

    def close(self) -> None:
        self._restart()

    def submit(self, request: SubmitRequest) -> int:
        return int(self._request("submit", submit_description(request)))

    def jobs(self, job_ids: Sequence[int]) -> dict[int, JobObservation]:
        rows = self._request("jobs", list(job_ids)) if job_ids else []
        return {o.job_id: o for o in (observation_from_dict(r, "squeue") for r in rows)}

    def accounting(self, job_ids: Sequence[int]) -> dict[int, JobObservation]:
        rows = self._request("accounting", list(job_ids)) if job_ids else []
        return {o.job_id: o for o in (observation_from_dict(r, "sacct") for r in rows)}

    def find_by_name(self, job_name: str, since: datetime | None = None) -> list[JobObservation]:
        found: dict[int, JobObservation] = {}
        for row in self._request("by_name", job_name):
            obs = observation_from_dict(row, "squeue")
            found.setdefault(obs.job_id, obs)
        return sorted(found.values(), key=lambda o: o.job_id)

    def cancel(self, job_id: int, *, signal: str | None = None, batch_only: bool = False) -> None:
        self._request("cancel", int(job_id), signal, batch_only)

    def nodes(self) -> list[NodeObservation]:
        return [NodeObservation(name=r["name"], state=str(r["state"]).upper(), reason=r["reason"])
                for r in self._request("nodes")]

    def drain_node(self, node: str, reason: str) -> None:
        self._request("node_state", node, "DRAIN", reason)

    def resume_node(self, node: str) -> None:
        self._request("node_state", node, "RESUME", "")

    def exclude_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        self._request("exclude", int(job_id), list(nodes))

    def ensure_node_down_trigger(self, program: str) -> bool:
        # pyslurm has no trigger API; the poll cycle remains the safety net.
        return False
