"""The daemon's seams, stated once.

Each protocol's docstring is its contract: what it promises and what it raises.
Implementations live elsewhere (``b300.slurm.*``, ``b300.store.*``, ``plugins``)
and are chosen at start-up; nothing here holds state. The store's seam is written in
:mod:`b300.store_contract` and re-exported here: import every seam from this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .model import (
    CheckpointInfo,
    JobObservation,
    NodeAddress,
    NodeObservation,
    SubmitRequest,
)
from .store_contract import (
    AttemptUpdate,
    CheckpointRepository,
    DriftRepository,
    NewEvent,
    Store,
)

if TYPE_CHECKING:
    from .drift.scan_records import NodeRun

__all__ = [
    "AttemptUpdate",
    "CheckpointLayout",
    "CheckpointRepository",
    "DriftProbe",
    "DriftRepository",
    "NewEvent",
    "NodeCommandRunner",
    "RemoteFile",
    "RemoteHasher",
    "ReplicaLister",
    "ReplicationTarget",
    "SentDigests",
    "SlurmClient",
    "Store",
]


@runtime_checkable
class SlurmClient(Protocol):
    """Talks to one Slurm cluster.

    Every method is one batched request to Slurm (never one per job) and is
    safe to call from one thread at a time. Failures raise
    :class:`b300.errors.SlurmError`; ``transient=True`` when the controller or
    database could not be reached or timed out (the caller must treat what it
    did not learn as *unknown*, never as a failure of the jobs), ``False``
    when Slurm refused the request itself.
    """

    name: str

    def submit(self, request: SubmitRequest) -> int:
        """Submit one batch job and return its Slurm job id."""
        ...

    def jobs(self, job_ids: Sequence[int]) -> dict[int, JobObservation]:
        """The controller's view (squeue) of these jobs, in one request.

        Jobs the controller no longer knows (ended longer than MinJobAge
        ago) are absent from the result; absent does not mean failed.
        """
        ...

    def accounting(self, job_ids: Sequence[int]) -> dict[int, JobObservation]:
        """The accounting database's view (sacct) of these jobs, in one request.

        Only the allocation line of each job is returned (no steps); ended
        jobs carry ``exit_code`` and ``signal``. Jobs slurmdbd has not
        recorded yet are absent.
        """
        ...

    def find_by_name(self, job_name: str, since: datetime | None = None) -> list[JobObservation]:
        """Every job (queued, running or ended) with exactly this job name.

        Used after a crash to learn whether an intended submission reached
        Slurm. Looks at both the controller and accounting (jobs that
        started after ``since``, when given).
        """
        ...

    def cancel(self, job_id: int, *, signal: str | None = None, batch_only: bool = False,
               full: bool = False) -> None:
        """Cancel a job, or only send it ``signal`` when one is given.

        Where a signal goes: by default to every step but not the batch shell;
        ``batch_only`` to the batch shell alone (``scancel --batch``); ``full`` to the
        batch shell, its children and every step (``scancel --full``)."""
        ...

    def nodes(self) -> list[NodeObservation]:
        """Every node of the cluster with its state and reason (one sinfo call)."""
        ...

    def partition_nodes(self, partition: str | None) -> list[str]:
        """Every node of ``partition`` (``None``: the default partition), whatever its
        state (one sinfo call)."""
        ...

    def default_partition(self) -> str | None:
        """The name of the cluster's default partition (``Default=YES``), None if it has none
        (one sinfo call)."""
        ...

    def node_addresses(self, nodes: Sequence[str]) -> dict[str, NodeAddress]:
        """Where the slurmd of each of ``nodes`` listens (one ``scontrol show node``); a node
        without a usable address is absent (it is not checked, never guessed at)."""
        ...

    def drain_node(self, node: str, reason: str) -> None:
        """Set ``node`` to DRAIN with ``reason`` (shown by ``sinfo -R``)."""
        ...

    def down_node(self, node: str, reason: str) -> None:
        """Set ``node`` DOWN now with ``reason``: Slurm ends the jobs on it at once (NODE_FAIL,
        or a requeue) instead of leaving a cancelled job COMPLETING on a node that will never
        answer. A drain set before stays (DOWN+DRAIN: drained after the node returns)."""
        ...

    def resume_node(self, node: str) -> None:
        """Return a drained or down node to service."""
        ...

    def reboot_node(self, node: str, reason: str) -> None:
        """Reboot ``node`` as soon as it is idle, with ``reason`` (``scontrol reboot ASAP
        nextstate=DOWN``): drained until it reboots (no job starts there), DOWN after it
        (the reason ends "reboot complete"; "reboot timed out" when it did not come back in
        ResumeTimeout): only the caller returns it. SlurmError(transient=False) when Slurm
        refuses (no RebootProgram in slurm.conf)."""
        ...

    def exclude_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        """Keep a pending job off ``nodes`` (its excluded node list becomes exactly these)."""
        ...

    def ensure_node_down_trigger(self, program: str) -> bool:
        """Make slurmctld run ``program`` whenever a node goes down (a permanent
        trigger, set once). False when triggers are not allowed to this user."""
        ...

    # -- reservations (the daemon-held spare pools, b300.spares) -----------

    def reservation_list(self) -> str:
        """``scontrol show reservation --oneliner`` as text (b300.spares.pool parses it);
        "" when there is none."""
        ...

    def create_reservation(self, name: str, nodes: Sequence[str], *, users: str,
                           partition: str) -> None:
        """Create reservation ``name`` over ``nodes`` of ``partition`` for ``users``, with no
        end (the pool's nodes are held until it is updated or deleted)."""
        ...

    def update_reservation(self, name: str, nodes: Sequence[str]) -> None:
        """Make ``nodes`` the reservation's node list."""
        ...

    def add_reservation_flag(self, name: str, flag: str) -> None:
        """Add one ``Flags=`` value to a reservation."""
        ...

    def delete_reservation(self, name: str) -> None:
        """Delete a reservation; SlurmError(transient=False) while Slurm refuses (a job in it)."""
        ...

    # -- about the client itself --------------------------------------------

    def version(self) -> str:
        """What ``sinfo -V`` prints (``slurm-wlm 24.11.5``); see :mod:`b300.slurm.release`."""
        ...

    def call_counts(self) -> dict[str, int]:
        """Requests made to Slurm so far, by tool or operation (benchmarks, ``b300d --once``)."""
        ...

    def close(self) -> None:
        """Release what the client holds (a worker process); the client is not used after."""
        ...


@runtime_checkable
class CheckpointLayout(Protocol):
    """How one training framework lays out its checkpoints under a directory.

    Implementations are plugins (entry-point group ``b300.checkpoint_layouts``,
    keyed by ``name`` as used in a spec's ``[checkpoint] layout``).
    ``list_checkpoints`` never raises for a missing or unreadable root (it
    returns ``[]``), never follows a symlink that leaves ``root``, and never
    reports as complete a checkpoint that is still being written or was cut
    off by a crash. Results are sorted by step, oldest first.
    """

    name: str

    def list_checkpoints(self, root: str) -> list[CheckpointInfo]: ...


@runtime_checkable
class DriftProbe(Protocol):
    """One software version read on a node over SSH (a plugin, group ``b300.probes``).

    ``command`` returns the fixed shell text to run on the node, built only
    from the probe's own strings and ``settings`` values the config already
    validated (each passed through ``shlex.quote``); ``None`` when the probe
    does not apply (e.g. no training image configured). ``parse`` is pure: it
    turns the command's stdout into one comparable value and raises
    ``ValueError`` when the output cannot be understood (a finding
    "unparseable", never a crash). ``default_policy`` is ``"drain"`` or
    ``"warn"``.
    """

    name: str
    default_policy: str

    def command(self, settings: Mapping[str, str]) -> str | None: ...

    def parse(self, stdout: str) -> str: ...


class NodeCommandRunner(Protocol):
    """Runs named shell commands on cluster nodes (over SSH) and returns what they said.

    ``run`` never raises for a node's own trouble: each node gets a
    :class:`b300.drift.scan_records.NodeRun` whose status says whether it was
    reached (unreachable, refused host key, failed auth, timed out); a
    command that did not finish in time has ``exit_code`` None. The commands
    are fixed text and must not contain values from outside the program.
    """

    def run(self, nodes: Sequence[str], commands: Mapping[str, str]) -> dict[str, NodeRun]: ...


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """One file of a replica as a replication target holds it.

    ``size`` is the finished file's size (0 when only a partial exists);
    ``partial`` the bytes of an unfinished copy an interrupted transfer left.
    """

    size: int = 0
    partial: int = 0


@runtime_checkable
class ReplicationTarget(Protocol):
    """An offsite place holding copies (replicas) of checkpoints, by checkpoint name.

    Implementations are plugins (entry-point group ``b300.replication_targets``),
    built from keyword options. A replica is a set of files under its name plus a
    record written last (``put_record``); only replicas with a record are listed.
    ``rel`` paths use '/' and never contain '..'. Methods may be called from
    several threads at once. Network and permission failures raise ``OSError``
    (or the client library's own errors); a missing file in ``read_file`` raises
    ``FileNotFoundError``.
    """

    name: str

    def stat_files(self, replica: str) -> dict[str, RemoteFile]:
        """Every file (finished or partial) the target holds for ``replica``."""
        ...

    def put_file(
        self, local_path: str, replica: str, rel: str, size: int, offset: int,
        on_chunk: Callable[[int], None],
    ) -> int:
        """Copy a local file, continuing a partial copy at ``offset`` when the target can.

        ``on_chunk(n)`` is called before sending each chunk (the bandwidth
        limit blocks there). Returns the bytes sent. The file appears under
        its name only once complete.
        """
        ...

    def read_file(self, replica: str, rel: str) -> Iterator[bytes]:
        """The file's bytes, streamed (for verification after a copy)."""
        ...

    def put_record(self, replica: str, data: bytes) -> None: ...

    def get_record(self, replica: str) -> bytes | None: ...

    def delete_record(self, replica: str) -> None: ...

    def list_replicas(self) -> list[str]:
        """Names of replicas whose record exists."""
        ...

    def delete_replica(self, replica: str) -> None:
        """Remove the record first, then every file of the replica."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class RemoteHasher(Protocol):
    """A replication target that can hash its copies where they are stored.

    Optional beside :class:`ReplicationTarget`: verification after a copy then
    costs no second transfer. ``sha256_files`` returns hex digests of the files
    it could hash (any it could not are simply absent and get verified by reading
    them back); it raises only for a broken connection.
    """

    def sha256_files(self, replica: str, rels: Sequence[str]) -> dict[str, str]: ...


@runtime_checkable
class SentDigests(Protocol):
    """A replication target that hashes each file while it copies it (optional).

    ``sent_sha256`` returns, and forgets, the hex digests of files ``put_file``
    wrote in this process, taken from the bytes as the target holds them, for
    files unchanged since; the replication then verifies those without reading
    them back. Files it does not know (copied by an earlier process, changed since)
    are absent and get verified the ordinary way.
    """

    def sent_sha256(self, replica: str, rels: Sequence[str]) -> dict[str, str]: ...


@runtime_checkable
class ReplicaLister(Protocol):
    """A replication target that can list every replica directory it holds, with a
    record or not (optional beside :class:`ReplicationTarget`).

    The upkeep uses it to remove what an interrupted remote prune left behind
    (files whose record was already deleted)."""

    def list_all(self) -> list[str]: ...
