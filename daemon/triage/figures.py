"""Node triage's figures, pure: for the weekly report and ``/metrics``.

From the events of a period (drains, triage verdicts, returns): drains per cause, time
from drain to return (median, p95), triage outcomes, lemon nodes, and node-hours lost in
drain (each drain's time until its return, or until the period's end for a node still out).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from ..events import Kind
from ..model import Event
from ..payloads import DriftCleared, NodeDrained, TriageVerdict
from .decide import cause_of


def lemon_nodes(events: Iterable[Event]) -> list[str]:
    """Nodes whose newest triage verdict is ``lemon`` (given the ``triage.verdict`` events)."""
    last: dict[str, str] = {}
    for e in sorted(events, key=lambda e: e.id):
        if e.kind == Kind.TRIAGE_VERDICT and e.node:
            last[e.node] = str(TriageVerdict.of(e).verdict)
    return sorted(n for n, v in last.items() if v == "lemon")


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class TriageFigures:
    drains_by_cause: dict[str, int] = field(default_factory=dict)
    return_median_s: float | None = None
    return_p95_s: float | None = None
    returns: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    lemons: list[str] = field(default_factory=list)
    node_hours_lost: float = 0.0


def triage_figures(events: Iterable[Event], start: datetime, end: datetime) -> TriageFigures:
    """The figures of ``[start, end)`` from the drain, return and triage events (any order;
    events before ``start`` are read for drains still open when the period began)."""
    evs = sorted(events, key=lambda e: e.id)
    by_cause: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    open_at: dict[str, datetime] = {}
    durations: list[float] = []
    lost_s = 0.0
    for e in evs:
        if not e.node or e.ts >= end:
            continue
        if e.kind in (Kind.NODE_DRAINED, Kind.DRIFT_DRAINED):
            if e.ts >= start:
                cause = "drift" if e.kind == Kind.DRIFT_DRAINED else (
                    cause_of(NodeDrained.of(e).reason) or "other")
                by_cause[cause] = by_cause.get(cause, 0) + 1
            open_at.setdefault(e.node, e.ts)
        elif e.kind == Kind.NODE_RESUMED or (e.kind == Kind.DRIFT_CLEARED and DriftCleared.of(e).resumed):
            began = open_at.pop(e.node, None)
            if began is not None:
                lost_s += (e.ts - max(began, start)).total_seconds() if e.ts >= start else 0.0
                if e.ts >= start:
                    durations.append((e.ts - began).total_seconds())
        elif e.kind == Kind.TRIAGE_VERDICT and e.ts >= start:
            v = str(TriageVerdict.of(e).verdict)
            outcomes[v] = outcomes.get(v, 0) + 1
    lost_s += sum((end - max(t, start)).total_seconds() for t in open_at.values())
    return TriageFigures(by_cause, _quantile(durations, 0.5), _quantile(durations, 0.95), len(durations),
                         outcomes, lemon_nodes(e for e in evs if e.ts < end), lost_s / 3600.0)
