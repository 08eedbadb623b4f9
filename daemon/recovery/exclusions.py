"""Which nodes a run's next attempt is kept off, and why (pure functions).

An exclusion has a cause, and the cause has an end:

- ``failed``: the node failed one of this run's attempts; holds while Slurm shows
  the node bad (drained, down, not responding) or it is inside the black-hole
  window. Once it is repaired and resumed (by an operator or the daemon) the run
  may use it again.
- ``drift``: an open version-drift finding (drain policy); holds while open.
- ``black_hole``: the node failed too many runs within the black-hole window
  (counted since its last return to service); holds while that is so.
- ``operator``: ``b300ctl resubmit --exclude``; holds until the run ends.

Exclusions are never allowed to make a run unschedulable: Slurm refuses a job
whose partition has fewer nodes left than it asks for ("Requested node
configuration is not available"). When that would happen the plan keeps only
the exclusions that matter: a node Slurm shows bad is skipped by Slurm anyway,
so excluding it too only shrinks the partition; then, if still too few, the
rest go as well (the job then waits for nodes instead of being refused).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..model import NodeRecord
from .classify import node_is_bad

CAUSES = ("failed", "drift", "black_hole", "operator")


@dataclass(frozen=True, slots=True)
class Exclusion:
    node: str
    cause: str
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"node": self.node, "cause": self.cause, "detail": self.detail}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Exclusion:
        return cls(str(d.get("node", "")), str(d.get("cause", "failed")), str(d.get("detail", "")))


@dataclass(frozen=True, slots=True)
class ExclusionPlan:
    """``kept`` go to Slurm; ``dropped`` are (exclusion, why) pairs for the event log."""

    kept: tuple[Exclusion, ...]
    dropped: tuple[tuple[Exclusion, str], ...] = ()
    trimmed: bool = False   # dropped although its cause holds: the run would not fit

    @property
    def nodes(self) -> list[str]:
        return sorted({e.node for e in self.kept})


def holds(ex: Exclusion, nodes_now: Mapping[str, NodeRecord], drift: Collection[str],
          black_holes: Collection[str]) -> str | None:
    """Why ``ex`` still holds (one phrase), or ``None`` when its cause has ended."""
    rec = nodes_now.get(ex.node)
    if ex.cause == "operator":
        return "excluded by an operator"
    if ex.cause == "drift":
        return "open drift finding" if ex.node in drift else None
    if ex.cause == "black_hole":
        return "in the black-hole window" if ex.node in black_holes else None
    # "failed" (and anything unknown from an older version): while Slurm shows it bad,
    # or while the node is inside the black-hole window.
    if node_is_bad(rec):
        assert rec is not None
        return f"node {rec.state.lower()}" + (f" ({rec.reason})" if rec.reason else "")
    return "in the black-hole window" if ex.node in black_holes else None


def merge(*groups: Iterable[Exclusion]) -> list[Exclusion]:
    """One exclusion per node; the first group that names a node gives its cause."""
    seen: dict[str, Exclusion] = {}
    for group in groups:
        for ex in group:
            seen.setdefault(ex.node, ex)
    return [seen[n] for n in sorted(seen)]


def plan_exclusions(
    candidates: Iterable[Exclusion],
    *,
    nodes_now: Mapping[str, NodeRecord],
    drift: Collection[str],
    black_holes: Collection[str],
    partition_nodes: Sequence[str] | None,
    needed: int,
    fresh: Collection[str] = (),
) -> ExclusionPlan:
    """Keep the candidates whose cause holds, then make sure the run still fits.

    ``partition_nodes`` are the nodes of the run's partition (``None``: unknown,
    no fit check); ``needed`` is how many nodes the run asks for; ``fresh`` are
    nodes that failed the run just now (their failure holds whatever the node
    states read before it say).
    """
    kept: list[Exclusion] = []
    dropped: list[tuple[Exclusion, str]] = []
    for ex in merge(candidates):
        if ex.node not in fresh and holds(ex, nodes_now, drift, black_holes) is None:
            dropped.append((ex, "cause ended: node healthy again" if ex.cause == "failed"
                            else f"cause ended ({ex.cause})"))
        else:
            kept.append(ex)
    if partition_nodes is None:
        return ExclusionPlan(tuple(kept), tuple(dropped))
    members = set(partition_nodes)

    def fits(excl: list[Exclusion]) -> bool:
        return len(members - {e.node for e in excl}) >= needed

    trimmed = False
    if not fits(kept):
        # Slurm skips a node it shows bad anyway: excluding it as well only shrinks the partition.
        redundant = [e for e in kept if node_is_bad(nodes_now.get(e.node))]
        kept = [e for e in kept if e not in redundant]
        dropped += [(e, "would leave too few nodes in the partition; Slurm skips it while it is "
                        "bad") for e in redundant]
        trimmed = bool(redundant)
    if not fits(kept):
        dropped += [(e, "would leave too few nodes in the partition") for e in kept
                    if e.node in members]
        kept = [e for e in kept if e.node not in members]
        trimmed = True
    return ExclusionPlan(tuple(kept), tuple(dropped), trimmed)


def exclusions_of(intent_data: Mapping[str, Any], excluded_nodes: Sequence[str]) -> list[Exclusion]:
    """An attempt's exclusions with their causes, from its ``attempt.intent`` event data;
    nodes an older version excluded without a cause count as ``failed``."""
    raw = intent_data.get("exclusions")
    found = [Exclusion.from_dict(d) for d in raw if isinstance(d, Mapping)] \
        if isinstance(raw, list) else []
    actual = set(excluded_nodes)
    found = [e for e in found if e.node in actual]
    named = {e.node for e in found}
    return merge(found, [Exclusion(n, "failed", "excluded before causes were recorded")
                         for n in excluded_nodes if n not in named])
