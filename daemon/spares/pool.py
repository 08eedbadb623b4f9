"""What the spare pools should hold and whether a resubmitted job fits one: pure.

A pool is one Slurm reservation (``b300-spares-<partition>``, ``Users=`` the daemon's
user, no other flag: only jobs that name it may use its nodes, and only that user can).
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

from ..model import NodeObservation
from ..slurm.parse import expand_nodes

#: sinfo's states (upper case, suffix flags stripped) of a node that runs nothing.
_FREE = frozenset({"IDLE", "RESERVED"})


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
           other_reserved: Collection[str], keep_surplus: bool) -> PoolPlan:
    """The pool's next node list.

    ``current``: the reservation's nodes (empty: no reservation yet); ``partition_nodes``:
    the partition's nodes; ``nodes_now``: their states (:func:`node_states`); ``avoid``: nodes no job of the
    daemon may land on (open drift findings, black holes); ``other_reserved``: nodes in
    any other reservation; ``keep_surplus``: a run of the daemon is recovering or waiting
    in the pool, so idle nodes beyond ``wanted`` (its survivors) stay.

    Kept: the current nodes that are allocated (a job of the daemon: only its jobs can run
    there) or healthy idle and not avoided. Removed: the others (drained, down, drifted).
    Added: healthy idle, not avoided, not reserved elsewhere, in name order, until
    ``wanted`` are idle. A node a job uses is never added: it is not idle (and Slurm
    refuses a reservation on busy nodes anyway, unless told IGNORE_JOBS, which we never do).
    """
    cur = list(dict.fromkeys(current))
    held = [n for n in cur if _allocated(nodes_now.get(n))]
    idle = [n for n in cur if healthy_idle(nodes_now.get(n)) and n not in avoid]
    removed = [n for n in cur if n not in held and n not in idle]
    if len(idle) > wanted and not keep_surplus:
        removed += idle[wanted:]
        idle = idle[:wanted]
    taken = set(cur) | set(other_reserved)
    free = [n for n in sorted(set(partition_nodes)) if n not in taken and n not in avoid
            and healthy_idle(nodes_now.get(n))]
    added = free[:max(0, wanted - len(idle))]
    idle += added
    if not added and not removed:
        return PoolPlan(None, tuple(idle), short=max(0, wanted - len(idle)), held=tuple(held))
    new = tuple(n for n in cur if n not in removed) + tuple(added)
    return PoolPlan(new, tuple(idle), tuple(added), tuple(removed), max(0, wanted - len(idle)),
                    tuple(held))


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
          avoid: Collection[str]) -> Placement | None:
    """The placement of a resubmitted job of ``needed`` nodes, or None (today's plain
    resubmission) when the pool has fewer usable nodes: idle and healthy now, not in the
    attempt's exclusions, not avoided. A job in a reservation runs only on its nodes, so
    the pool must cover all of them."""
    if reservation is None or needed < 1:
        return None
    usable = tuple(n for n in reservation.nodes if healthy_idle(nodes_now.get(n))
                   and n not in excluded and n not in avoid)
    if len(usable) < needed:
        return None
    return Placement(reservation.name, partition, needed, usable)
