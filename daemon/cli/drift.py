"""``b300ctl drift``: the latest drift matrix, and ``b300ctl drift scan [NODES]``.

The matrix is read from the state store; a scan is asked of the running
daemon (control op ``drift_scan``), which runs it under its action lock.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import UsageError
from .command import Command, Context, arg
from .output import print_json, print_table, when

_SCAN_TIMEOUT_S = 3600.0
_CELL_MAX = 24


def run_scan(ctx: Context, args: argparse.Namespace) -> int:
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    try:
        nodes = list(NodeSet(args.nodes)) if args.nodes else []
    except NodeSetParseError as exc:
        raise UsageError(f"bad node list {args.nodes!r}: {exc}") from None
    code, result = ctx.ask({"op": "drift_scan", "nodes": nodes}, timeout=_SCAN_TIMEOUT_S)
    if code:
        return code
    if ctx.json:
        print_json(result)
        return 0
    statuses: dict[str, int] = {}
    for node in result["nodes"].values():
        statuses[node["status"]] = statuses.get(node["status"], 0) + 1
    print(f"scanned {len(result['nodes'])} node(s) in {result['wall_s']:.1f} s: "
          + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))
    for f in result["findings"]:
        print(f"  {f['node']:<12} {f['probe']:<14} {f['kind']:<11} {f['found']}"
              f" (expected {f['expected'] or '-'}) [{f['policy']}]")
    for node in result["drained"]:
        print(f"  drained {node}")
    for node in result["resumed"]:
        print(f"  resumed {node}")
    return 0


def run_show(ctx: Context, args: argparse.Namespace) -> int:
    from ..drift.baseline import expected_values
    from ..drift.scanner import finding_to_dict, reports_from_matrix
    from ..events import Kind
    from ..payloads import DriftActionFailed

    cfg = ctx.config()
    store = ctx.open_store()
    try:
        drift = store.drift
        last = drift.last_scan()
        findings = [finding_to_dict(o.finding) | {"id": o.id, "opened_at": o.opened_at.isoformat()}
                    for o in drift.open_findings()]
        drained = drift.drained_nodes()
        failed: list[dict[str, Any]] = [] if last is None else [
            {"ts": e.ts.isoformat(), "node": e.node, "error": DriftActionFailed.of(e).error or None}
            for e in store.events(kinds=[Kind.DRIFT_ACTION_FAILED], since=last[0])]
    finally:
        store.close()
    if last is None:
        if ctx.json:
            print_json({"scanned_at": None, "nodes": {}, "findings": [], "drained": {}}, lines=True)
        else:
            print("no drift scan yet (b300ctl drift scan)")
        return 0
    _started, finished, matrix = last
    reports = reports_from_matrix(matrix)
    expected = expected_values(reports, cfg.drift.pinned if cfg.drift else {})
    if ctx.json:
        exp: dict[str, dict[str, str | None]] = {}
        for (part, probe), value in sorted(expected.items()):
            exp.setdefault(part, {})[probe] = value
        print_json({"scanned_at": finished.isoformat(), "nodes": matrix, "expected": exp,
                    "findings": findings, "drained": drained, "failed_actions": failed})
        return 0
    probes = sorted({p for r in reports for p in r.values})
    table = [["NODE", "PARTITION", "STATUS", *[p.upper() for p in probes]]]
    for r in reports:
        cells = []
        for p in probes:
            v = r.values.get(p)
            if v is None:
                cells.append("-")
            elif v.status.value != "ok":
                cells.append(f"!{v.status.value}")
            else:
                exp_value = expected.get((r.partition, p))
                # '*' marks a value that differs from the baseline (pinned or majority).
                cells.append(v.value if exp_value in (None, v.value) else f"*{v.value}")
        table.append([r.node, r.partition, r.status.value, *[_short(c) for c in cells]])
    print(f"last scan {finished:%Y-%m-%d %H:%M:%S}Z   (* differs from the baseline, ! no value)")
    print_table(table)
    if findings:
        print("\nopen findings:")
        for f in findings:
            mark = " DRAINED" if f["node"] in drained else ""
            print(f"  {f['node']:<12} {f['probe']:<14} {f['kind']:<11} {f['found']} "
                  f"(expected {f['expected'] or '-'}) [{f['policy']}]{mark}")
    if failed:
        print("\nfailed at the last scan (retried at the next):")
        for item in failed:
            print(f"  {when(str(item['ts']))}  {item['error']}")
    return 0


def _short(text: str) -> str:
    return text if len(text) <= _CELL_MAX else text[:_CELL_MAX - 3] + "..."


COMMANDS = (
    Command("drift", "version drift: the latest matrix of nodes by probe", run_show, subcommands=(
        Command("scan", "ask the daemon to scan now", run_scan, mutating=True, arguments=(
            arg("nodes", nargs="?", default="", help="hostlist, e.g. gpu[01-04] (default: all)"),
        )),
    )),
)
