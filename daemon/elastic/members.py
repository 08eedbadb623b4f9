"""What the daemon does when a node of an elastic run dies: a pure function of the run's
spec, its allocation, what the job's host reports, the run's elastic events so far and the
nodes Slurm no longer offers. No store, no Slurm, no files: :mod:`.effects` carries it out.

- the node is not one of the run's agents (an idle spare died): nothing to do;
- the node is the batch host (it runs the rendezvous store and the batch script): the job
  ends with it; fall back to recovery (resubmit from the newest verified checkpoint);
- the run's torchrun restarts are spent (each lost member costs the survivors one): fall
  back;
- a spare is left in the allocation: the member left, an agent starts on the spare (the
  survivors re-rendezvous, the new agent joins at their next restart);
- no spare: ``on_no_spare = "shrink"`` trains on with the survivors while they are at least
  ``min_nodes``; otherwise (or below the minimum) fall back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..events import Kind
from ..spec import JobSpec

LEFT = Kind.ELASTIC_MEMBER_LEFT.value
JOINED = Kind.ELASTIC_MEMBER_JOINED.value


@dataclass(frozen=True, slots=True)
class MemberLeft:
    node: str
    members: tuple[str, ...]      # the agents' nodes after it left
    restarts_used: int
    then: str                     # "replace", "shrink" or "resubmit"


@dataclass(frozen=True, slots=True)
class StartAgent:
    node: str
    generation: int
    replaces: str
    add: tuple[str, ...]          # every node the daemon added to this job so far, this one too
    members: tuple[str, ...]
    spares_left: int


@dataclass(frozen=True, slots=True)
class FallBack:
    why: str                      # the job is cancelled; recovery resubmits it


@dataclass(frozen=True, slots=True)
class Nothing:
    why: str
    already: bool = False         # the node's loss is on record: the plan is rewritten from it


Action = MemberLeft | StartAgent | FallBack | Nothing


def members_now(spec: JobSpec, allocation: Sequence[str],
                history: Iterable[tuple[str, Mapping[str, object]]]) -> list[str]:
    """The nodes with an agent: the first ``nodes`` of the allocation, plus those joined,
    less those that left (in the order of the events)."""
    members = list(allocation[:spec.nodes])
    for kind, data in history:
        node = str(data.get("node", ""))
        if kind == JOINED and node not in members:
            members.append(node)
        elif kind == LEFT and node in members:
            members.remove(node)
    return members


def decide(spec: JobSpec, *, node: str, allocation: Sequence[str], batch_host: str,
           history: Sequence[tuple[str, Mapping[str, object]]],
           unusable: Iterable[str] = ()) -> list[Action]:
    """The actions for ``node`` confirmed dead under a running attempt of an elastic run.
    ``history``: the attempt's ``elastic.*`` events as (kind, data), oldest first;
    ``unusable``: nodes Slurm holds down or drained."""
    e = spec.elastic
    if e is None:
        return []
    left = [str(d.get("node")) for k, d in history if k == LEFT]
    joined = [str(d.get("node")) for k, d in history if k == JOINED]
    if node in left:
        return [Nothing(f"{node} left the run before", already=True)]
    members = members_now(spec, allocation, history)
    if node not in members:
        return [Nothing(f"{node} runs no agent of the run (an idle spare)")]
    survivors = tuple(n for n in members if n != node)
    restarts = len(left) + 1
    if node == batch_host:
        return [MemberLeft(node, survivors, restarts, "resubmit"),
                FallBack(f"{node} is the job's batch host (the rendezvous store): the job ends with it")]
    if restarts > e.max_restarts:
        return [MemberLeft(node, survivors, restarts, "resubmit"),
                FallBack(f"torchrun restarts spent ({e.max_restarts})")]
    bad = {*unusable, *left, node}
    ever = {*allocation[:spec.nodes], *joined}
    spares = [n for n in allocation if n not in ever and n not in bad]
    if spares and len(survivors) < e.max_nodes:
        spare = spares[0]
        return [MemberLeft(node, survivors, restarts, "replace"),
                StartAgent(spare, generation=len(joined) + 1, replaces=node,
                           add=tuple(sorted({*joined, spare})), members=(*survivors, spare),
                           spares_left=len(spares) - 1)]
    if e.on_no_spare == "shrink" and len(survivors) >= e.min_nodes:
        return [MemberLeft(node, survivors, restarts, "shrink")]
    why = (f"{len(survivors)} member(s) left, below min_nodes ({e.min_nodes})"
           if len(survivors) < e.min_nodes else "no spare left and on_no_spare = \"resubmit\"")
    return [MemberLeft(node, survivors, restarts, "resubmit"), FallBack(why)]
