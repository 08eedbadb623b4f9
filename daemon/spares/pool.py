"""What the spare pools should hold and whether a resubmitted job fits one: pure.

A pool is one Slurm reservation (``b300-spares-<partition>``, ``Users=`` the daemon's
user, ``Flags=NO_HOLD_JOBS_AFTER_END`` and no other flag: only jobs that name it may use
its nodes, and only that user can; a job still pending in it when it is deleted goes to
the queue instead of being held).
Its nodes are of three kinds at any time: *idle* ones (healthy, free: the spares),
nodes allocated to a job the daemon placed there (a run resumed through the pool keeps
its nodes reserved while it runs, so when it loses a node again its survivors are back
in the pool at once), and unhealthy ones (drained, down, not responding), which are
taken out. :func:`refill` keeps ``wanted`` idle ones: it adds healthy idle nodes of the
partition that no job uses and no other reservation holds, and gives surplus idle ones
back only while no run of the daemon may need them.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..events import Kind
from ..model import AttemptState, Event, NodeObservation, RunState
from ..payloads import SparesPool
from ..slurm.parse import expand_nodes

#: sinfo's states (upper case, suffix flags stripped) of a node that runs nothing.
_FREE = frozenset({"IDLE", "RESERVED"})

#: The one flag of a pool's reservation: without it Slurm holds (priority 0, reason
#: ReservationDeleted) every job still pending in a reservation that is deleted.
NO_HOLD = "NO_HOLD_JOBS_AFTER_END"

#: An attempt in one of these states has not started: the nodes it was placed on are
#: promised to it but still idle.
_WAITING = frozenset({AttemptState.SUBMITTING, AttemptState.PENDING})


@dataclass(frozen=True, slots=True)
class Reservation:
    """One reservation as ``scontrol show reservation -o`` lists it."""

    name: str
    nodes: tuple[str, ...] = ()
    users: str = ""
    partition: str = ""
    flags: str = ""
    state: str = ""


def parse_reservations(stdout: str) -> list[Reservation]:
    """Lines of ``scontrol show reservation -o`` (one record a line; ``No reservations in
    the system`` when there are none)."""
    found: list[Reservation] = []
    for line in stdout.splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        name = fields.get("ReservationName")
        if not name:
            continue
        raw = fields.get("Nodes", "")
        try:
            nodes = tuple(expand_nodes(raw)) if raw and raw != "(null)" else ()
        except ValueError:
            nodes = ()
        found.append(Reservation(name=name, nodes=nodes, users=fields.get("Users", ""),
                                 partition=fields.get("PartitionName", ""),
                                 flags=fields.get("Flags", ""), state=fields.get("State", "")))
    return found


def latest_pools(records: Iterable[Event]) -> list[Event]:
    """Each pool's latest ``spares.pool`` record (one is written per change), in reservation
    order; a pool whose latest record is ``retired`` (the config dropped it, its reservation
    is deleted) is not one any more. ``b300ctl nodes`` and ``/metrics`` read the pools so."""
    last: dict[str, Event] = {}
    for e in records:
        pool = SparesPool.of(e)
        key = str(pool.reservation)
        if pool.retired:
            last.pop(key, None)
        else:
            last[key] = e
    return [last[k] for k in sorted(last)]


def lacks_no_hold(reservation: Reservation) -> bool:
    """An (adopted) pool reservation without :data:`NO_HOLD`: the daemon adds it."""
    return NO_HOLD not in {f.strip().upper() for f in reservation.flags.split(",")}


def pooled_reservation(events: Iterable[tuple[str, Mapping[str, object]]]) -> str | None:
    """The reservation an attempt is (to be) submitted in, from its ``attempt.intent`` and
    ``spares.used`` events (kind, data) in order: the intent's ``reservation``, unless a
    later ``spares.used`` says it was refused or dropped (then the plain queue)."""
    found: str | None = None
    for kind, data in events:
        resv = data.get("reservation")
        if kind == Kind.ATTEMPT_INTENT:
            found = resv if isinstance(resv, str) else None
        elif kind == Kind.SPARES_USED and (data.get("refused") or data.get("dropped")):
            found = None
    return found


@dataclass(frozen=True, slots=True)
class Waiting:
    """A run of the daemon as the pools see it: its state, its latest attempt's state, its
    partition, the reservation that attempt was placed in (None: the queue), its nodes."""

    run_state: RunState
    attempt_state: AttemptState | None
    partition: str | None
    reservation: str | None
    needed: int
    attempt_id: int | None = None


def promised(runs: Iterable[Waiting], reservation: str, *,
             ignore: Collection[int] = ()) -> int:
    """The pool's idle nodes promised to attempts placed in ``reservation`` that have not
    started (SUBMITTING or PENDING): a pending job in a reservation allocates nothing, so
    its nodes still look idle. ``ignore``: attempt ids not to count (an attempt asking
    again for its own place)."""
    return sum(max(0, w.needed) for w in runs
               if w.reservation == reservation and w.attempt_state in _WAITING
               and w.attempt_id not in ignore)


def keep_surplus(runs: Iterable[Waiting], partition: str, reservation: str) -> bool:
    """Whether the pool keeps idle nodes beyond K: a run of its partition is RECOVERING
    (its survivors may be needed at once), or a run's latest attempt was placed in this
    pool and has not started. A run waiting in the plain queue keeps nothing."""
    return any((w.run_state is RunState.RECOVERING and w.partition == partition)
               or (w.reservation == reservation and w.attempt_state in _WAITING)
               for w in runs)


def node_states(observed: Iterable[NodeObservation]) -> dict[str, str]:
    """sinfo's state of each node with its suffix flags put back (``IDLE*``: not responding)."""
    return {o.name: o.state.upper() + "".join(o.flags) for o in observed}


def healthy_idle(state: str | None) -> bool:
    """Free and well as sinfo says: IDLE (or RESERVED), no drain, no down, no suffix
    (``*`` not responding, ``~`` powered off, ``#`` powering up, ``@`` reboot pending...)."""
    if not state:
        return False
    state = state.upper()
    return state.rstrip("*~#!%$@^-") in _FREE and not re.search(r"[*~#!%$@^-]", state)


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """What one pool should become: its new node list (None: leave it as it is)."""

    nodes: tuple[str, ...] | None
    idle: tuple[str, ...]          # the healthy idle nodes it holds afterwards (the spares)
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    short: int = 0                 # idle nodes wanted that no healthy free node could fill
    held: tuple[str, ...] = field(default=())  # nodes of the daemon's jobs inside the pool


def refill(*, wanted: int, current: Sequence[str], partition_nodes: Iterable[str],
           nodes_now: Mapping[str, str], avoid: Collection[str],
           other_reserved: Collection[str], keep_surplus: bool, promised: int = 0) -> PoolPlan:
    """The pool's next node list.

    ``current``: the reservation's nodes (empty: no reservation yet); ``partition_nodes``:
    the partition's nodes; ``nodes_now``: their states (:func:`node_states`); ``avoid``: nodes no job of the
    daemon may land on (open drift findings, black holes); ``other_reserved``: nodes in
    any other reservation; ``keep_surplus``: a run of the daemon is recovering or waiting
    in the pool, so idle nodes beyond ``wanted`` (its survivors) stay; ``promised``: idle
    nodes promised to attempts placed in the pool that have not started (:func:`promised`):
    the pool aims at ``wanted + promised`` idle nodes, and is never emptied (deleted)
    while any is promised (the pending job would lose its place).

    Kept: the current nodes that are allocated (a job of the daemon: only its jobs can run
    there) or healthy idle and not avoided. Removed: the others (drained, down, drifted).
    Added: healthy idle, not avoided, not reserved elsewhere, in name order, until
    ``wanted`` are idle. A node a job uses is never added: it is not idle (and Slurm
    refuses a reservation on busy nodes anyway, unless told IGNORE_JOBS, which we never do).
    """
    target = wanted + max(0, promised)
    cur = list(dict.fromkeys(current))
    held = [n for n in cur if _allocated(nodes_now.get(n))]
    idle = [n for n in cur if healthy_idle(nodes_now.get(n)) and n not in avoid]
    removed = [n for n in cur if n not in held and n not in idle]
    if len(idle) > target and not keep_surplus:
        removed += idle[target:]
        idle = idle[:target]
    taken = set(cur) | set(other_reserved)
    free = [n for n in sorted(set(partition_nodes)) if n not in taken and n not in avoid
            and healthy_idle(nodes_now.get(n))]
    added = free[:max(0, target - len(idle))]
    idle += added
    short = max(0, target - len(idle))
    new = tuple(n for n in cur if n not in removed) + tuple(added)
    if (not added and not removed) or (not new and promised > 0):
        # Nothing to change, or the change would delete the reservation under a job
        # still pending in it: left as it is until that job starts or leaves.
        return PoolPlan(None, tuple(idle), short=short, held=tuple(held))
    return PoolPlan(new, tuple(idle), tuple(added), tuple(removed), short, tuple(held))


def _allocated(state: str | None) -> bool:
    if not state:
        return False
    state = state.upper()
    return any(s in state for s in ("ALLOC", "MIX", "COMPLETING")) and not any(
        s in state for s in ("DRAIN", "DOWN", "FAIL"))


@dataclass(frozen=True, slots=True)
class Placement:
    """A resubmitted job goes into the pool's reservation."""

    reservation: str
    partition: str
    needed: int
    usable: tuple[str, ...]   # the pool's idle nodes not excluded for this attempt


def place(*, reservation: Reservation | None, partition: str, needed: int,
          nodes_now: Mapping[str, str], excluded: Collection[str],
          avoid: Collection[str], promised: int = 0) -> Placement | None:
    """The placement of a resubmitted job of ``needed`` nodes, or None (today's plain
    resubmission) when the pool has fewer usable nodes: idle and healthy now, not in the
    attempt's exclusions, not avoided. A job in a reservation runs only on its nodes, so
    the pool must cover all of them. ``promised``: idle nodes of the pool already promised
    to attempts placed there that have not started (:func:`promised`); they may take any
    of the usable nodes, so only what is left beyond them counts."""
    if reservation is None or needed < 1:
        return None
    usable = tuple(n for n in reservation.nodes if healthy_idle(nodes_now.get(n))
                   and n not in excluded and n not in avoid)
    if len(usable) - max(0, promised) < needed:
        return None
    return Placement(reservation.name, partition, needed, usable)


@dataclass(frozen=True, slots=True)
class PoolView:
    """One pool as a passed node's placement sees it."""

    reservation: str
    wanted: int
    partition_nodes: Collection[str]
    current: Collection[str] = ()      # the reservation's nodes (empty: none yet)
    promised: int = 0                  # idle nodes promised to attempts placed there (:func:`promised`)


def pool_to_refill(node: str, pools: Sequence[PoolView], nodes_now: Mapping[str, str],
                   avoid: Collection[str]) -> str | None:
    """The pool a node that just passed triage goes to, or None (back to general use): the
    first pool (config order) of a partition holding ``node`` that has fewer healthy idle
    nodes (not avoided) than its size plus what is promised. A pool already holding
    ``node`` (a daemon killed between the two steps) is that pool. An avoided node (an
    open drift finding, a black hole) goes to no pool."""
    if node in avoid:
        return None
    for p in pools:
        if node in p.current:
            return p.reservation
    for p in pools:
        if node not in p.partition_nodes:
            continue
        idle = sum(1 for n in p.current if healthy_idle(nodes_now.get(n)) and n not in avoid)
        if idle < p.wanted + max(0, p.promised):
            return p.reservation
    return None
