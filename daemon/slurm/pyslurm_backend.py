"""The Slurm client over pyslurm, run in a worker process.

Why a worker process: ``import pyslurm`` calls ``slurm_init()``, and libslurm
calls ``fatal()`` (exiting the whole process) on an unreadable slurm.conf; no
pyslurm call releases the GIL either. So pyslurm never runs in the daemon's
process: a child does each request and sends back plain dicts, and a child
that dies or hangs costs one transient :class:`SlurmError`, not the daemon.

Checked against pyslurm 25.11.2 (the Cython sources of its sdist; see
``tests/unit/test_pyslurm_contract.py``). Every attribute, keyword and
constant used below exists on the pyslurm class it is used on:

- ``pyslurm.Job`` (pyslurm/core/job/job.pyx): ``id``, ``name``, ``state``,
  ``state_reason``, ``allocated_nodes``, ``start_time``, ``end_time``,
  ``requeue_count``, ``comment``, ``send_signal(signal, steps=)``,
  ``cancel()``, ``modify(JobSubmitDescription)``.
- ``pyslurm.db.Job`` (pyslurm/db/job.pyx): ``nodelist`` (not
  ``allocated_nodes``), ``exit_code``, ``exit_code_signal``.
- ``pyslurm.JobSubmitDescription`` (pyslurm/core/job/submission.pxd):
  ``gres_per_node`` and ``partitions`` (there is no ``gpus_per_node`` or
  ``partition``), ``ntasks``, ``environment``.
- ``pyslurm.Node`` (pyslurm/core/node.pyx): ``state`` is
  ``slurm_node_state_string_complete()``, e.g. ``IDLE+DRAIN``; it is turned
  into sinfo's form (``DRAINED``) by :func:`node_state`.

pyslurm on PyPI builds only against Slurm 25.11, so this path cannot run
against the local test cluster (Slurm 22.05/24.11). ``auto`` picks it only
when the controller runs the Slurm release pyslurm was built for.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal as _signal
import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from ..errors import SlurmError
from ..model import JobObservation, NodeAddress, NodeObservation, SubmitRequest

if TYPE_CHECKING:
    from ..interfaces import SlurmClient
from .parse import check_node_name, expand_nodes, is_transient, normalise_reason, parse_state
from .pyslurm_worker import EARLIEST, _probe, _release_check, _worker, release

__all__ = [
    "PyslurmClient", "_release_check", "job_environment", "node_state", "observation_from_dict",
    "pyslurm_available", "release", "signal_name", "submit_description",
]

log = structlog.get_logger(__name__)


def pyslurm_available(slurm_conf: str | None = None, timeout: float = 20.0) -> str | None:
    """``None`` when pyslurm imports in a child process and was built for the
    Slurm release the controller runs, else why not (one line)."""
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


def observation_from_dict(d: Mapping[str, Any], source: str) -> JobObservation:
    """A pyslurm job record (as plain data) into an observation; pure.

    Raises ValueError for a state or node list it cannot read (the caller
    skips that row, as the cli backend skips such a line).
    """

    def ts(v: Any) -> datetime | None:
        return datetime.fromtimestamp(int(v), UTC) if v else None

    reason = str(d.get("reason") or "").strip()
    return JobObservation(
        job_id=int(d["job_id"]), state=parse_state(str(d["state"])), name=str(d.get("name") or ""),
        nodes=expand_nodes(str(d.get("nodes") or "")),
        reason="" if reason == "None" else reason,
        exit_code=d.get("exit_code") if source == "sacct" else None,
        signal=d.get("signal") if source == "sacct" else None,
        start=ts(d.get("start")), end=ts(d.get("end")), restarts=int(d.get("restarts") or 0),
        comment=str(d.get("comment") or ""), source=source,
    )


# Flags of slurm_node_state_string_complete() and the sinfo suffix each stands for.
_NODE_FLAG_SUFFIX = {
    "NOT_RESPONDING": "*", "POWERED_DOWN": "~", "POWERING_UP": "#", "POWERING_DOWN": "%",
    "POWER_DOWN": "!", "REBOOT_REQUESTED": "@", "REBOOT_ISSUED": "^", "PLANNED": "-",
    "MAINTENANCE": "$",
}


def node_state(raw: str) -> tuple[str, tuple[str, ...]]:
    """pyslurm's ``Node.state`` (``IDLE+DRAIN``) as sinfo's ``%T`` reports it: (``DRAINED``, flags).

    Follows Slurm's node_state_string(): DRAIN on a node with jobs (ALLOCATED,
    MIXED, or COMPLETING) is DRAINING, else DRAINED; FAIL likewise FAILING or
    FAIL; COMPLETING otherwise shows as COMPLETING. NOT_RESPONDING and the
    power and reboot flags become sinfo's suffixes (``*``, ``~``, ...).
    """
    parts = [p for p in raw.strip().upper().split("+") if p]
    if not parts:
        return "UNKNOWN", ()
    base, flags = parts[0], set(parts[1:])
    busy = base in ("ALLOCATED", "MIXED") or "COMPLETING" in flags
    if "DRAIN" in flags:
        state = "DRAINING" if busy else "DRAINED"
    elif "FAIL" in flags:
        state = "FAILING" if busy else "FAIL"
    elif "COMPLETING" in flags and base in ("IDLE", "ALLOCATED"):
        state = "COMPLETING"
    else:
        state = base
    suffixes = tuple(_NODE_FLAG_SUFFIX[f] for f in sorted(flags) if f in _NODE_FLAG_SUFFIX)
    return state, suffixes


def signal_name(signal: str) -> str:
    """``USR1``, ``SIGUSR1`` or ``10`` -> ``SIGUSR1``, the form pyslurm accepts."""
    text = signal.strip().upper()
    if text.isdigit():
        try:
            return _signal.Signals(int(text)).name
        except ValueError:
            pass
    else:
        name = text if text.startswith("SIG") else f"SIG{text}"
        if name in _signal.Signals.__members__:
            return name
    raise SlurmError(f"bad signal name {signal!r}", transient=False)


def job_environment(base: Mapping[str, str], *, submit_dir: str, submit_host: str,
                    nice: int) -> dict[str, str]:
    """The environment sbatch would give a job submitted from ``base``; pure.

    sbatch exports its whole environment and adds SLURM_SUBMIT_DIR (its
    working directory), SLURM_SUBMIT_HOST and SLURM_PRIO_PROCESS; pyslurm
    sends only what it is given (an empty environment fails the submission).
    """
    env = dict(base)
    env["SLURM_SUBMIT_DIR"] = submit_dir
    env["SLURM_SUBMIT_HOST"] = submit_host
    env.setdefault("SLURM_PRIO_PROCESS", str(nice))
    return env


def submit_description(request: SubmitRequest, environment: Mapping[str, str]) -> dict[str, Any]:
    """The keyword arguments of ``pyslurm.JobSubmitDescription`` for a request; pure.

    Unset values are left out (pyslurm then applies its defaults, which are
    sbatch's). ``ntasks`` is always given: pyslurm's default is 1, sbatch's
    is one per node (or ``ntasks_per_node`` per node).
    """
    desc: dict[str, Any] = {
        "name": request.job_name, "comment": request.comment, "script": request.script,
        "nodes": request.nodes,
        "ntasks": request.nodes * (request.ntasks_per_node or 1),
        "ntasks_per_node": request.ntasks_per_node,
        "gres_per_node": {"gpu": request.gpus_per_node} if request.gpus_per_node else None,
        "partitions": request.partition, "time_limit": request.time_limit,
        "account": request.account, "qos": request.qos,
        "standard_output": request.output, "working_directory": request.workdir,
        "excluded_nodes": [check_node_name(n) for n in request.excluded_nodes] or None,
        "is_requeueable": request.requeue, "environment": dict(environment),
        "kill_on_node_fail": False if request.no_kill else None,
        "reservations": request.reservation,
    }
    return {k: v for k, v in desc.items() if v is not None and v != ""}


class PyslurmClient:
    """:class:`b300.interfaces.SlurmClient` over pyslurm in an isolated worker.

    ``fallback`` does what pyslurm cannot express: clearing a job's excluded
    node list (pyslurm turns an empty list into NULL, which slurmctld reads as
    "no change"; pyslurm/utils/cstr.pyx ``fmalloc``), and the node-down trigger.
    """

    name = "pyslurm"

    def __init__(self, *, slurm_conf: str | None = None, timeout: float = 30.0,
                 fallback: SlurmClient | None = None) -> None:
        self._conf = slurm_conf
        self._timeout = timeout
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self._fallback = fallback
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
            raise SlurmError(f"pyslurm {op} failed: {value}", transient=is_transient(value))
        return value

    def _restart(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(1)
        self._proc = None

    def close(self) -> None:
        self._restart()

    def call_counts(self) -> dict[str, int]:
        return dict(self.calls)

    def version(self) -> str:
        """The release, from the command-line tools (``fallback``): the one libslurm was built
        for is the one pyslurm's build insisted on, and slurmctld's is what matters."""
        return str(self._cli("the Slurm release").version())

    def _observations(self, rows: Sequence[Mapping[str, Any]], source: str,
                      op: str) -> list[JobObservation]:
        out: list[JobObservation] = []
        bad: list[str] = []
        for row in rows:
            try:
                out.append(observation_from_dict(row, str(row.get("source") or source)))
            except (ValueError, KeyError, TypeError):
                bad.append(repr(dict(row)))
        if bad:
            log.warning("slurm.unparsed_lines", tool=f"pyslurm {op}", count=len(bad),
                        first=bad[0][:200])
        return out

    def submit(self, request: SubmitRequest) -> int:
        env = job_environment(os.environ, submit_dir=os.getcwd(),
                              submit_host=socket.gethostname(), nice=os.getpriority(os.PRIO_PROCESS, 0))
        if self._conf:
            env["SLURM_CONF"] = self._conf
        return int(self._request("submit", submit_description(request, env)))

    def jobs(self, job_ids: Sequence[int]) -> dict[int, JobObservation]:
        rows = self._request("jobs", [int(j) for j in job_ids]) if job_ids else []
        return {o.job_id: o for o in self._observations(rows, "squeue", "jobs")}

    def accounting(self, job_ids: Sequence[int]) -> dict[int, JobObservation]:
        ids = sorted({int(j) for j in job_ids})
        rows = self._request("accounting", ids) if ids else []
        return {o.job_id: o for o in self._observations(rows, "sacct", "accounting")}

    def find_by_name(self, job_name: str, since: datetime | None = None) -> list[JobObservation]:
        start = int(since.timestamp()) if since else EARLIEST
        found: dict[int, JobObservation] = {}
        for obs in self._observations(self._request("by_name", job_name, start), "squeue", "by_name"):
            found.setdefault(obs.job_id, obs)
        return [o for o in sorted(found.values(), key=lambda o: o.job_id) if o.name == job_name]

    def cancel(self, job_id: int, *, signal: str | None = None, batch_only: bool = False,
               full: bool = False) -> None:
        self._request("cancel", int(job_id), signal_name(signal) if signal else None,
                      "batch" if batch_only else "full" if full else "")

    def nodes(self) -> list[NodeObservation]:
        seen: dict[str, NodeObservation] = {}
        for r in self._request("nodes"):
            state, flags = node_state(str(r["state"]))
            reason = str(r["reason"] or "").strip()
            seen.setdefault(r["name"], NodeObservation(
                name=r["name"], state=state, reason="" if reason == "None" else reason, flags=flags))
        return [seen[n] for n in sorted(seen)]

    def partition_nodes(self, partition: str | None) -> list[str]:
        return [str(n) for n in self._request("partition_nodes", partition)]

    def default_partition(self) -> str | None:
        found = self._request("default_partition")
        return str(found) if found else None

    def node_addresses(self, nodes: Sequence[str]) -> dict[str, NodeAddress]:
        # pyslurm's Node has an address but not the slurmd port: the command-line tools say both.
        if self._fallback is not None:
            found: dict[str, NodeAddress] = self._fallback.node_addresses(nodes)
            return found
        raise SlurmError("the pyslurm backend needs the Slurm command-line tools for node addresses",
                         transient=False)

    def drain_node(self, node: str, reason: str) -> None:
        self._request("node_state", check_node_name(node), "DRAIN", normalise_reason(reason))

    def down_node(self, node: str, reason: str) -> None:
        self._request("node_state", check_node_name(node), "DOWN", normalise_reason(reason))

    def resume_node(self, node: str) -> None:
        self._request("node_state", check_node_name(node), "RESUME", "")

    def reboot_node(self, node: str, reason: str) -> None:
        # pyslurm has no reboot call with a next state; the command-line tools have.
        self._cli("reboots").reboot_node(check_node_name(node), reason)

    def exclude_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        names = [check_node_name(n) for n in nodes]
        if names:
            self._request("exclude", int(job_id), names)
        elif self._fallback is not None:
            self._fallback.exclude_nodes(job_id, [])
        else:
            raise SlurmError("pyslurm cannot clear an excluded node list", transient=False)

    # The spare pools' reservations: through the command-line tools (``fallback``).

    def _cli(self, what: str) -> Any:
        if self._fallback is None:
            raise SlurmError(f"the pyslurm backend needs the Slurm command-line tools for {what}",
                             transient=False)
        return self._fallback

    def reservation_list(self) -> str:
        return str(self._cli("reservations").reservation_list())

    def create_reservation(self, name: str, nodes: Sequence[str], *, users: str,
                           partition: str) -> None:
        self._cli("reservations").create_reservation(name, nodes, users=users, partition=partition)

    def update_reservation(self, name: str, nodes: Sequence[str]) -> None:
        self._cli("reservations").update_reservation(name, nodes)

    def add_reservation_flag(self, name: str, flag: str) -> None:
        self._cli("reservations").add_reservation_flag(name, flag)

    def delete_reservation(self, name: str) -> None:
        self._cli("reservations").delete_reservation(name)

    def ensure_node_down_trigger(self, program: str) -> bool:
        # pyslurm has no trigger API; the command-line tools have.
        if self._fallback is not None:
            return bool(self._fallback.ensure_node_down_trigger(program))
        return False
