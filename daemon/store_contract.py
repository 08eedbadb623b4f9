"""The store's seam: :class:`Store` and its repositories, and the records passed to it.

Part of :mod:`b300.interfaces` (which re-exports every name here; import them from
there). Each protocol's docstring is its contract; the implementation is
:class:`b300.store.sql_store.SqlStore`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from .events import check_event
from .model import (
    Attempt,
    AttemptState,
    CheckpointInfo,
    Event,
    NodeObservation,
    NodeRecord,
    Run,
    RunState,
)

if TYPE_CHECKING:
    from .checkpoints.entries import StoredCheckpoint
    from .drift.scan_records import Finding, OpenFinding


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. The store assigns its id; its time is the ``now`` of the call.

    ``kind`` must be a :class:`b300.events.Kind` and ``data`` may only use the keys
    :data:`b300.events.PAYLOAD` declares for it (ValueError otherwise).

    An event passed to a store method with ``run_id`` or ``attempt_id`` left
    ``None`` is filled in with the run or attempt that method is about (so the
    event of ``begin_attempt`` names the attempt it created).
    """

    kind: str
    run_id: str | None = None
    attempt_id: int | None = None
    node: str | None = None
    actor: str = "daemon"
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Kinds and their payload keys are declared once (b300.events); a writer that
        # strays from them is a bug, caught by the first test that runs it.
        check_event(self.kind, self.data)


@dataclass(frozen=True, slots=True)
class AttemptUpdate:
    """One attempt's change within a batch (:meth:`Store.update_attempts`); ``None``
    leaves a field as it is. ``run_state``: the state the attempt's run takes now
    (recorded with a ``run.state`` event only when it differs)."""

    attempt_id: int
    state: AttemptState | None = None
    nodes: Sequence[str] | None = None
    reason: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    start: datetime | None = None
    end: datetime | None = None
    events: Sequence[NewEvent] = ()
    run_state: RunState | None = None


class CheckpointRepository(Protocol):
    """What the daemon knows about checkpoints beyond their files (``store.checkpoints``):
    listings, verification verdicts, marks, replicas, prunes.

    Same guarantees as :class:`Store`: every write commits atomically with its events
    (``checkpoint.corrupt``, ``checkpoint.marked``/``unmarked``, ``checkpoint.replicated``/
    ``replication_failed``, ``checkpoint.replica_pruned``, ``checkpoint.pruned``); a path the
    store does not know raises :class:`b300.errors.NotFoundError`; an unreachable database
    raises :class:`b300.errors.StoreError`.
    """

    def record_listing(self, run_id: str, checkpoints: Sequence[CheckpointInfo], now: datetime) -> None:
        """Upsert what a layout listed for the run. A checkpoint whose size, file count or
        time changed since it was verified loses its verdict; rows no longer listed are
        marked deleted."""
        ...

    def record_verification(self, run_id: str, path: str, ok: bool, now: datetime,
                            problems: Sequence[str] = ()) -> None: ...

    def set_marked(self, run_id: str, path: str, marked: bool, now: datetime,
                   actor: str = "daemon") -> None: ...

    def record_replica(self, run_id: str, path: str, target: str, ok: bool, now: datetime, *,
                       bytes_sent: int = 0, error: str = "") -> None: ...

    def record_replicas_pruned(self, run_id: str, paths: Sequence[str], target: str, now: datetime,
                               actor: str = "daemon") -> None:
        """``target``'s retention deleted these replicas; they still count as made."""
        ...

    def record_pruned(self, run_id: str, paths: Sequence[str], now: datetime,
                      actor: str = "daemon") -> None: ...

    def checkpoints(self, run_id: str, *, include_deleted: bool = False) -> list[StoredCheckpoint]:
        """The run's checkpoints by step, oldest first, with their replicas."""
        ...

    def checkpoints_of(self, run_ids: Sequence[str]) -> dict[str, list[StoredCheckpoint]]:
        """:meth:`checkpoints` (not deleted) of each named run, in a few queries."""
        ...


class DriftRepository(Protocol):
    """Version-drift state (``store.drift``): open findings, the daemon's drains, scans.

    Writes commit atomically with their ``drift.*`` events; StoreError as for :class:`Store`.
    """

    def open_findings(self) -> list[OpenFinding]:
        """Every open finding, by node and probe."""
        ...

    def open_drift_nodes(self) -> set[str]:
        """Nodes with an open drift finding whose policy is drain (no run may land there)."""
        ...

    def drained_nodes(self) -> dict[str, str]:
        """Nodes the daemon drained for drift and has not resumed: node -> reason."""
        ...

    def last_scan(self) -> tuple[datetime, datetime, dict[str, Any]] | None:
        """(started_at, finished_at, matrix) of the newest scan, or None."""
        ...

    def record_action_failures(self, failures: Sequence[tuple[str | None, str]], now: datetime,
                               actor: str = "daemon") -> None: ...

    def record_scan(self, started_at: datetime, now: datetime, nodes_scanned: int,
                    matrix: dict[str, Any], opened: Sequence[Finding], closed: Sequence[OpenFinding],
                    actor: str = "daemon") -> None: ...

    def mark_drained(self, node: str, reason: str, now: datetime, actor: str = "daemon") -> None: ...

    def release(self, node: str, now: datetime, *, resumed: bool, actor: str = "daemon") -> None: ...


class Store(Protocol):
    """The daemon's durable state: runs, their attempts, nodes, and the event log.

    Every mutating method commits before it returns, atomically with the
    events passed to it, so a state change is never recorded without its event
    or the other way round. Readers (b300ctl) may use the store while the
    daemon writes. Unknown ids raise :class:`b300.errors.NotFoundError`; an
    unreachable or broken database raises :class:`b300.errors.StoreError`.
    Times are timezone-aware UTC ``datetime`` values supplied by the caller.

    ``checkpoints`` and ``drift`` are the same database's checkpoint and drift
    repositories, with the same guarantees.
    """

    @property
    def checkpoints(self) -> CheckpointRepository: ...

    @property
    def drift(self) -> DriftRepository: ...

    def create_run(
        self, run_id: str, name: str, spec_toml: str, now: datetime, events: Sequence[NewEvent] = ()
    ) -> Run:
        """Record a new run in state SUBMITTING. A duplicate id raises UsageError."""
        ...

    def get_run(self, run_id: str) -> Run: ...

    def list_runs(self, states: Iterable[RunState] | None = None) -> list[Run]:
        """Runs, newest first, optionally only those in ``states``."""
        ...

    def set_run_state(
        self, run_id: str, state: RunState, now: datetime, events: Sequence[NewEvent] = (),
        *, actor: str = "daemon",
    ) -> Run:
        """Set the run's state; a change is recorded as a ``run.state`` event (``from``/``to``,
        by ``actor``) in the same transaction, after ``events``. The one way a run's state
        is written besides :meth:`update_attempts` (which records it the same way)."""
        ...

    def begin_attempt(
        self,
        run_id: str,
        now: datetime,
        *,
        excluded_nodes: Sequence[str] = (),
        resume_from: str | None = None,
        events: Sequence[NewEvent] = (),
    ) -> Attempt:
        """Record the intent to submit the run's next attempt (state SUBMITTING).

        The attempt's number is one more than the run's last; its ``tag``
        is ``b300-<run_id>-a<number>`` and is unique. Raises UsageError if
        the run already has an attempt that is not terminal.
        """
        ...

    def confirm_attempt(
        self, attempt_id: int, slurm_job_id: int, now: datetime, events: Sequence[NewEvent] = ()
    ) -> Attempt:
        """Record that the attempt reached Slurm as ``slurm_job_id`` (state PENDING).

        Only an attempt in state SUBMITTING can be confirmed (UsageError
        otherwise), so a job id once recorded is never overwritten.
        """
        ...

    def update_attempt(
        self,
        attempt_id: int,
        now: datetime,
        *,
        state: AttemptState | None = None,
        nodes: Sequence[str] | None = None,
        excluded_nodes: Sequence[str] | None = None,
        reason: str | None = None,
        exit_code: int | None = None,
        signal: int | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        outcome: str | None = None,
        evidence: dict[str, Any] | None = None,
        events: Sequence[NewEvent] = (),
    ) -> Attempt:
        """Change the given fields (``None`` leaves a field as it is).

        ``outcome`` is recovery's classification of the attempt's end and
        ``evidence`` (JSON-able) what it was based on.
        """
        ...

    def update_attempts(self, updates: Sequence[AttemptUpdate], now: datetime) -> list[Attempt]:
        """Apply every update, and the run states they bring, in ONE transaction (a
        poll cycle's changes); the updated attempts in the order given."""
        ...

    def get_attempt(self, attempt_id: int) -> Attempt: ...

    def attempts(self, run_id: str) -> list[Attempt]:
        """The run's attempts in order of number."""
        ...

    def attempts_of(self, run_ids: Sequence[str]) -> dict[str, list[Attempt]]:
        """Each named run's attempts in order of number, in a few queries (runs without
        attempts, or unknown, map to an empty list)."""
        ...

    def active_attempts(self) -> list[Attempt]:
        """Every attempt of every run that is not terminal (SUBMITTING included)."""
        ...

    def attempts_since(self, since: datetime) -> list[Attempt]:
        """Every attempt of every run that ended at or after ``since`` or has not ended, by id
        (one query: the cluster's recent history, e.g. for its failure rate)."""
        ...

    def append_events(self, events: Sequence[NewEvent], now: datetime) -> list[Event]: ...

    def events(
        self,
        *,
        run_id: str | None = None,
        after_id: int = 0,
        limit: int | None = None,
        node: str | None = None,
        kinds: Sequence[str] | None = None,
        since: datetime | None = None,
    ) -> list[Event]:
        """Events in id order, optionally of one run, one node, some kinds,
        after an id, and/or at or after a time."""
        ...

    def event_counts(self, kinds: Sequence[str]) -> dict[tuple[str | None, str], int]:
        """How many events of each of ``kinds`` the log holds, by (run id, kind) (one
        grouped count: no event is read); a pair with none is absent."""
        ...

    def sync_nodes(
        self, observed: Sequence[NodeObservation], now: datetime
    ) -> list[NodeRecord]:
        """Record the nodes' current state and reason.

        For each node whose state or reason differs from what was stored (or
        that is new), a ``node.state`` event with the old and new values is
        appended in the same transaction. Returns the records that changed.
        """
        ...

    def list_nodes(self) -> list[NodeRecord]:
        """Every known node, by name."""
        ...

    #: Stamped on every event appended from now on (the active daemon's identity).
    daemon_identity: str | None

    def daemon_lease(self, name: str) -> dict[str, Any] | None:
        """The HA lease ``name``: holder, host, pid, epoch, since, renewed_at,
        expires_at and ``live`` (unexpired by the database's clock); None if never held."""
        ...

    def close(self) -> None: ...
