"""One view of the cluster per poll cycle, gathered once and handed to everything that decides.

Like submitit's info watcher: the cycle asks Slurm for what it needs in a fixed
number of batched calls, whatever the number of tracked jobs (one ``sinfo`` for
the nodes, one ``squeue`` for every tracked job, one ``sacct`` only for the jobs
that ended or left the controller), and every later step of the cycle (tracking,
requeue handling, hang checks, recovery) reads the same :class:`ClusterView`
instead of asking Slurm or re-reading the store again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from ..errors import SlurmError
from ..interfaces import SlurmClient, Store
from ..model import JobObservation, NodeRecord


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What Slurm said in one cycle.

    ``nodes`` are the store's node records after this cycle's ``sinfo`` was recorded
    (so a state Slurm changed a moment ago counts); ``live`` the controller's view of
    the tracked jobs (a job it no longer knows is absent, which does not mean failed);
    ``accounted`` slurmdbd's view of the tracked jobs that ended or left the controller.
    ``nodes_error``/``accounting_error`` say why a part is missing (an outage is
    unknown, never a failure).
    """

    taken_at: datetime
    nodes: Mapping[str, NodeRecord] = field(default_factory=dict)
    live: Mapping[int, JobObservation] = field(default_factory=dict)
    accounted: Mapping[int, JobObservation] = field(default_factory=dict)
    asked_accounting: bool = False
    nodes_error: str | None = None
    accounting_error: str | None = None

    @property
    def errors(self) -> list[str]:
        return [e for e in (self.nodes_error and f"sinfo: {self.nodes_error}",
                            self.accounting_error and f"sacct: {self.accounting_error}") if e]


class ClusterObserver:
    """Gathers a :class:`ClusterView` (the only Slurm reads of a poll cycle).

    ``track_nodes=False`` skips ``sinfo`` (the tracking benchmark measures jobs alone).
    """

    def __init__(self, slurm: SlurmClient, store: Store, *, track_nodes: bool = True) -> None:
        self._slurm = slurm
        self._store = store
        self._track_nodes = track_nodes

    def gather(self, job_ids: Sequence[int], now: datetime) -> ClusterView:
        """The view of ``job_ids`` and the nodes now.

        Raises SlurmError when the controller cannot be asked about the jobs at all
        (the cycle then backs off); a failing ``sinfo`` or ``sacct`` only leaves its
        part of the view empty, with the reason.
        """
        nodes_error = None
        if self._track_nodes:
            try:
                # Recorded first: recovery judges an ended job by its nodes' state now.
                self._store.sync_nodes(self._slurm.nodes(), now)
            except SlurmError as exc:
                nodes_error = str(exc)
        nodes = {n.name: n for n in self._store.list_nodes()}
        if not job_ids:
            return ClusterView(now, nodes, nodes_error=nodes_error)
        live = self._slurm.jobs(list(job_ids))
        ended = [j for j in job_ids if j not in live or live[j].state.is_terminal]
        accounted: dict[int, JobObservation] = {}
        accounting_error = None
        if ended:
            try:
                accounted = self._slurm.accounting(ended)
            except SlurmError as exc:
                # slurmdbd down: what it would have said stays unknown this cycle.
                accounting_error = str(exc)
        return ClusterView(now, nodes, live, accounted, asked_accounting=bool(ended),
                           nodes_error=nodes_error, accounting_error=accounting_error)
