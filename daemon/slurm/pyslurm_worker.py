"""What runs in the pyslurm worker process (:mod:`b300.slurm.pyslurm_backend` starts it).

Only this child imports pyslurm: :func:`_worker` serves one request at a time from the
pipe (an operation name of :data:`_OPS` and its arguments) and sends back plain data or
the error as one line; :func:`_probe` answers whether pyslurm imports and was built for
the controller's release. Every pyslurm attribute used here is listed in the backend's
docstring and checked by ``tests/unit/test_pyslurm_contract.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .parse import expand_nodes

# sacct's default start when job ids are named is "Epoch 0"; slurmdbd's default
# for a filter without a start is today's midnight, so one is always given.
EARLIEST = int(datetime(2000, 1, 1, tzinfo=UTC).timestamp())


def release(version: str) -> str:
    """``25.11.2`` -> ``25.11``: a Slurm release (pyslurm's version starts with the one it is built for)."""
    return ".".join(version.strip().split(".")[:2])


def _probe(conn: Any, slurm_conf: str | None) -> None:
    if slurm_conf:
        os.environ["SLURM_CONF"] = slurm_conf
    try:
        import pyslurm
    except Exception as exc:
        conn.send((False, f"pyslurm does not import: {exc}".splitlines()[0]))
        return
    conn.send(_release_check(pyslurm))


def _release_check(ps: Any) -> tuple[bool, str]:
    """(True, "") when pyslurm's release is the controller's; else (False, why)."""
    built = release(str(ps.__version__))
    try:
        running = str(ps.slurmctld.Config.load().version or "")
    except Exception as exc:
        return False, f"the Slurm controller's version could not be read: {exc}".splitlines()[0]
    if release(running) != built:
        return False, f"pyslurm {ps.__version__} is built for Slurm {built}, the controller runs {running}"
    return True, ""


def _worker(conn: Any, slurm_conf: str | None) -> None:
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


def _live_job_dict(job: Any) -> dict[str, Any]:
    """A ``pyslurm.Job`` (pyslurm/core/job/job.pyx) as plain data."""
    return {
        "job_id": job.id, "state": job.state, "name": job.name or "",
        "nodes": job.allocated_nodes or "", "reason": job.state_reason or "",
        "start": job.start_time, "end": job.end_time, "restarts": job.requeue_count or 0,
        "comment": job.comment or "",
    }


def _db_job_dict(job: Any) -> dict[str, Any]:
    """A ``pyslurm.db.Job`` (pyslurm/db/job.pyx) as plain data.

    Its ``comment`` is the derived exit string, not the job's comment (sacct
    is not asked for either), so it is left out.
    """
    return {
        "job_id": job.id, "state": job.state, "name": job.name or "",
        "nodes": job.nodelist or "", "reason": job.state_reason or "",
        "exit_code": job.exit_code, "signal": job.exit_code_signal,
        "start": job.start_time, "end": job.end_time, "restarts": job.requeue_count or 0,
    }


def _op_submit(ps: Any, desc: dict[str, Any]) -> int:
    return int(ps.JobSubmitDescription(**desc).submit())


def _op_jobs(ps: Any, ids: list[int]) -> list[dict[str, Any]]:
    wanted = set(ids)
    return [_live_job_dict(j) for j in ps.Jobs.load().values() if j.id in wanted]


def _op_accounting(ps: Any, ids: list[int]) -> list[dict[str, Any]]:
    jobs = ps.db.Jobs.load(ps.db.JobFilter(ids=ids, start_time=EARLIEST))
    return [_db_job_dict(j) for j in jobs.values()]


def _op_by_name(ps: Any, name: str, since: int) -> list[dict[str, Any]]:
    live = [_live_job_dict(j) for j in ps.Jobs.load().values() if j.name == name]
    acct = [_db_job_dict(j)
            for j in ps.db.Jobs.load(ps.db.JobFilter(names=[name], start_time=since)).values()]
    return live + [dict(row, source="sacct") for row in acct]


def _op_cancel(ps: Any, job_id: int, signal: str | None, to: str) -> None:
    job = ps.Job(job_id)
    if signal:
        # pyslurm's steps: "batch" = the batch shell, "all" = every step and the shell
        # (scancel --full), "children" = the steps but not the shell (scancel's default).
        job.send_signal(signal, steps={"batch": "batch", "full": "all"}.get(to, "children"))
    else:
        job.cancel()


def _op_nodes(ps: Any) -> list[dict[str, Any]]:
    return [{"name": n.name, "state": n.state or "", "reason": n.reason or ""}
            for n in ps.Nodes.load().values()]


def _op_partition_nodes(ps: Any, partition: str | None) -> list[str]:
    for p in ps.Partitions.load().values():
        if (p.is_default if partition is None else p.name == partition):
            return list(expand_nodes(str(p.nodes or "")))
    raise ValueError(f"no partition {partition or '(default)'}")


def _op_default_partition(ps: Any) -> str | None:
    return next((str(p.name) for p in ps.Partitions.load().values() if p.is_default), None)


def _op_node_state(ps: Any, node: str, state: str, reason: str) -> None:
    changes = ps.Node(state=state, reason=reason) if reason else ps.Node(state=state)
    ps.Node(node).modify(changes)


def _op_exclude(ps: Any, job_id: int, nodes: list[str]) -> None:
    ps.Job(job_id).modify(ps.JobSubmitDescription(excluded_nodes=nodes))


_OPS: dict[str, Callable[..., Any]] = {
    "exclude": _op_exclude,
    "submit": _op_submit, "jobs": _op_jobs, "accounting": _op_accounting,
    "by_name": _op_by_name, "cancel": _op_cancel, "nodes": _op_nodes,
    "node_state": _op_node_state, "partition_nodes": _op_partition_nodes,
    "default_partition": _op_default_partition,
}
