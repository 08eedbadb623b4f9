"""Fencing at the point of action.

Every action of the daemon that changes the world (sbatch, scancel, drain,
resume, a pending job's exclusions, the node-down trigger, checkpoint deletes,
mail and webhooks) calls :meth:`Fence.check` first, inside the daemon's action
lock and right before the action. The check proves that this daemon still
holds the lease under the epoch it became active with (see
:meth:`b300.ha.lease.DbLease.prove`); if it cannot, :class:`b300.ha.lease.FencedError`
is raised, the action is not taken, and the daemon stops acting.

:class:`FencedSlurm` puts the check in front of every changing call of a
:class:`b300.interfaces.SlurmClient`, so no code path can reach Slurm around it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime

import structlog

from ..interfaces import SlurmClient
from ..model import JobObservation, NodeAddress, NodeObservation, SubmitRequest
from .lease import DbLease, FencedError

log = structlog.get_logger(__name__)


class Fence:
    """Proves the lease before an action; ``on_fenced`` is told once when it cannot.

    Without a lease (a daemon built for a single host without HA) every check
    passes.
    """

    def __init__(self, lease: DbLease | None, on_fenced: Callable[[str], None] = lambda _w: None):
        self._lease = lease
        self._on_fenced = on_fenced
        self._told = threading.Event()

    @property
    def epoch(self) -> int | None:
        return self._lease.epoch if self._lease is not None else None

    def check(self, action: str) -> None:
        """Raise FencedError unless the lease is proven held right now."""
        if self._lease is None:
            return
        try:
            self._lease.prove(action)
        except FencedError as exc:
            log.error("fence.refused", action=action, epoch=self._lease.epoch, why=str(exc))
            if not self._told.is_set():
                self._told.set()
                self._on_fenced(str(exc))
            raise
        log.info("fence.ok", action=action, epoch=self._lease.epoch)


class FencedSlurm:
    """A SlurmClient whose changing calls each pass :meth:`Fence.check` first."""

    def __init__(self, inner: SlurmClient, fence: Fence) -> None:
        self._inner = inner
        self._fence = fence
        self.name = inner.name

    # -- reads go straight through ----------------------------------------

    def jobs(self, job_ids: Sequence[int]) -> dict[int, JobObservation]:
        return self._inner.jobs(job_ids)

    def accounting(self, job_ids: Sequence[int]) -> dict[int, JobObservation]:
        return self._inner.accounting(job_ids)

    def find_by_name(self, job_name: str, since: datetime | None = None) -> list[JobObservation]:
        return self._inner.find_by_name(job_name, since)

    def nodes(self) -> list[NodeObservation]:
        return self._inner.nodes()

    def partition_nodes(self, partition: str | None) -> list[str]:
        return self._inner.partition_nodes(partition)

    def default_partition(self) -> str | None:
        return self._inner.default_partition()

    def node_addresses(self, nodes: Sequence[str]) -> dict[str, NodeAddress]:
        return self._inner.node_addresses(nodes)

    def reservation_list(self) -> str:
        return self._inner.reservation_list()

    def version(self) -> str:
        return self._inner.version()

    def call_counts(self) -> dict[str, int]:
        return self._inner.call_counts()

    # -- changes are fenced -----------------------------------------------

    def submit(self, request: SubmitRequest) -> int:
        self._fence.check(f"sbatch {request.job_name}")
        return self._inner.submit(request)

    def cancel(self, job_id: int, *, signal: str | None = None, batch_only: bool = False,
               full: bool = False) -> None:
        self._fence.check(f"scancel {job_id}" + (f" --signal={signal}" if signal else ""))
        self._inner.cancel(job_id, signal=signal, batch_only=batch_only, full=full)

    def drain_node(self, node: str, reason: str) -> None:
        self._fence.check(f"drain {node}")
        self._inner.drain_node(node, reason)

    def down_node(self, node: str, reason: str) -> None:
        self._fence.check(f"down {node}")
        self._inner.down_node(node, reason)

    def resume_node(self, node: str) -> None:
        self._fence.check(f"resume {node}")
        self._inner.resume_node(node)

    def reboot_node(self, node: str, reason: str) -> None:
        self._fence.check(f"reboot {node}")
        self._inner.reboot_node(node, reason)

    def exclude_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        self._fence.check(f"exclude nodes of job {job_id}")
        self._inner.exclude_nodes(job_id, nodes)

    def create_reservation(self, name: str, nodes: Sequence[str], *, users: str,
                           partition: str) -> None:
        self._fence.check(f"create reservation {name}")
        self._inner.create_reservation(name, nodes, users=users, partition=partition)

    def update_reservation(self, name: str, nodes: Sequence[str]) -> None:
        self._fence.check(f"update reservation {name}")
        self._inner.update_reservation(name, nodes)

    def add_reservation_flag(self, name: str, flag: str) -> None:
        self._fence.check(f"update reservation {name}")
        self._inner.add_reservation_flag(name, flag)

    def delete_reservation(self, name: str) -> None:
        self._fence.check(f"delete reservation {name}")
        self._inner.delete_reservation(name)

    def ensure_node_down_trigger(self, program: str) -> bool:
        self._fence.check("strigger --set")
        return self._inner.ensure_node_down_trigger(program)

    def close(self) -> None:
        self._inner.close()
