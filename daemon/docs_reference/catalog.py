"""``docs/reference/events.md`` and ``docs/reference/metrics.md``, from :mod:`b300.events`
and :mod:`b300.ops.metrics`."""

from __future__ import annotations

import inspect
import re

from .text import cell

_MEMBER = re.compile(r"^\s+([A-Z_]+)\s*=\s*\"([a-z_.]+)\"(?:\s*#\s*(.*))?$")
_GROUP = re.compile(r"^\s+#\s*(.+)$")


def render_events() -> str:
    """Every event kind, under the group heading its declaration in :class:`Kind` has,
    with the payload keys :data:`b300.events.PAYLOAD` declares for it."""
    from .. import events

    lines = [
        "# Event reference", "",
        "Every kind of event the daemon records in its append-only event log, and the payload "
        "keys each may carry (`b300ctl events --kind KIND` or `--kind PREFIX.` reads them; "
        "`b300ctl events --json` prints the payloads). An event written by an older version may "
        "lack a key.", "",
    ]
    group = ""
    source = inspect.getsource(events.Kind).splitlines()
    seen: set[str] = set()
    for line in source:
        if m := _GROUP.match(line):
            group = m.group(1)
            continue
        if not (m := _MEMBER.match(line)):
            continue
        kind = events.Kind(m.group(2))
        if group:
            lines += ["", f"## {group[0].upper()}{group[1:]}", "",
                      "| kind | payload keys | note |", "|---|---|---|"]
            group = ""
        keys = ", ".join(f"`{k}`" for k in sorted(events.PAYLOAD[kind])) or "(none)"
        lines.append(f"| `{kind.value}` | {keys} | {cell(m.group(3) or '')} |")
        seen.add(kind.value)
    missing = sorted(k.value for k in events.Kind if k.value not in seen)
    if missing:
        raise ValueError(f"event kinds not found in the source of Kind: {missing}")
    return "\n".join(lines) + "\n"


def _full_snapshot() -> object:
    """A snapshot with every optional family present (spare pool, drift, a finished cycle)."""
    from ..ops.health import CycleSnapshot
    from ..ops.metrics import MetricsSnapshot

    return MetricsSnapshot(cycle=CycleSnapshot(1, 0, 0.1, 1.0, None), drift_findings_open=0,
                           spare_pool_nodes={"partition": 0})


def render_metrics() -> str:
    """Every metric family :func:`b300.ops.metrics.metric_families` exports, in its order."""
    from ..ops.health import CycleSnapshot
    from ..ops.metrics import MetricsSnapshot, metric_families

    always = {f.name for f in metric_families(MetricsSnapshot(cycle=CycleSnapshot(0, 0, None, None, None)))}
    lines = [
        "# Metrics reference", "",
        "What `GET /metrics` exports (`[metrics] listen`), in the Prometheus text format "
        "(OpenMetrics when the scraper asks for it). A counter's samples carry the suffix "
        "`_total`. *Always*: exported on every scrape; otherwise only once there is something to "
        "show (a `[drift]` table, a spare pool, a first poll cycle).", "",
        "| metric | type | labels | always | help |", "|---|---|---|---|---|",
    ]
    for family in metric_families(_full_snapshot()):  # type: ignore[arg-type]
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = sorted({k for s in family.samples for k in s.labels} | set(getattr(family, "_labelnames", ())))
        lines.append(f"| `{name}` | {family.type} | {', '.join(f'`{x}`' for x in labels)} "
                     f"| {'yes' if family.name in always else 'no'} | {cell(family.documentation)} |")
    return "\n".join(lines) + "\n"
