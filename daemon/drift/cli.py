"""``b300ctl drift``: the latest drift matrix, and ``b300ctl drift scan [NODES]``.

The matrix is read from the state store; a scan is asked of the running
daemon (control op ``drift_scan``), which runs it under its action lock.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from ..config import Config
from ..control import ask_daemon
from ..errors import UsageError
from ..events import Kind
from ..interfaces import Store
from .baseline import expected_values
from .scanner import finding_to_dict

_SCAN_TIMEOUT_S = 3600.0


def add_drift_commands(subparsers: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Add ``drift`` (show the matrix) and ``drift scan [NODES]`` to b300ctl's subcommands."""
    p = subparsers.add_parser("drift", help="version drift: the latest matrix of nodes by probe",
                              parents=list(parents))
    sub = p.add_subparsers(dest="drift_command", parser_class=type(p))
    s = sub.add_parser("scan", help="ask the daemon to scan now", parents=list(parents))
    s.add_argument("nodes", nargs="?", default="", help="hostlist, e.g. gpu[01-04] (default: all)")


def run_drift_command(cfg: Config, args: argparse.Namespace, open_store: Callable[[Config], Store]) -> int:
    """Run ``b300ctl drift [scan]``; returns the exit code."""
    if getattr(args, "drift_command", None) == "scan":
        return _scan(cfg, args)
    return _show(cfg, args, open_store)


def _scan(cfg: Config, args: argparse.Namespace) -> int:
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    try:
        nodes = list(NodeSet(args.nodes)) if args.nodes else []
    except NodeSetParseError as exc:
        raise UsageError(f"bad node list {args.nodes!r}: {exc}") from None
    code, result = ask_daemon(cfg.socket, {"op": "drift_scan", "nodes": nodes},
                              timeout=_SCAN_TIMEOUT_S)
    if code:
        return code
    if args.json:
        print(json.dumps(result, indent=2))
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


def _show(cfg: Config, args: argparse.Namespace, open_store: Callable[[Config], Store]) -> int:
    from .scanner import reports_from_matrix

    store = open_store(cfg)
    try:
        drift = store.drift
        last = drift.last_scan()
        findings = [finding_to_dict(o.finding) | {"id": o.id, "opened_at": o.opened_at.isoformat()}
                    for o in drift.open_findings()]
        drained = drift.drained_nodes()
        failed: list[dict[str, Any]] = [] if last is None else [
            {"ts": e.ts.isoformat(), "node": e.node, "error": e.data.get("error")}
            for e in store.events(kinds=[Kind.DRIFT_ACTION_FAILED], since=last[0])]
    finally:
        store.close()
    if last is None:
        if args.json:
            print(json.dumps({"scanned_at": None, "nodes": {}, "findings": [], "drained": {}}))
        else:
            print("no drift scan yet (b300ctl drift scan)")
        return 0
    _started, finished, matrix = last
    reports = reports_from_matrix(matrix)
    expected = expected_values(reports, cfg.drift.pinned if cfg.drift else {})
    if args.json:
        exp: dict[str, dict[str, str | None]] = {}
        for (part, probe), value in sorted(expected.items()):
            exp.setdefault(part, {})[probe] = value
        print(json.dumps({"scanned_at": finished.isoformat(), "nodes": matrix, "expected": exp,
                          "findings": findings, "drained": drained, "failed_actions": failed},
                         indent=2))
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
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if findings:
        print("\nopen findings:")
        for f in findings:
            mark = " DRAINED" if f["node"] in drained else ""
            print(f"  {f['node']:<12} {f['probe']:<14} {f['kind']:<11} {f['found']} "
                  f"(expected {f['expected'] or '-'}) [{f['policy']}]{mark}")
    if failed:
        print("\nfailed at the last scan (retried at the next):")
        for item in failed:
            print(f"  {str(item['ts'])[:19].replace('T', ' ')}  {item['error']}")
    return 0


def _short(text: str) -> str:
    return text if len(text) <= 24 else text[:21] + "..."
