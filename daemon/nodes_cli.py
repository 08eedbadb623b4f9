"""``b300ctl nodes`` (history of every node, ``resume``) and ``b300ctl notify``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from .config import Config
from .control import ask_daemon
from .events import DRAINS, NODE_HISTORY, Kind
from .interfaces import Store
from .model import Event


def add_node_commands(
    add: Callable[..., argparse.ArgumentParser],
) -> None:
    p = add("nodes", help="nodes with their failure/drain history; 'nodes resume NODE'")
    p.add_argument("action", nargs="?", choices=["list", "resume"], default="list")
    p.add_argument("node", nargs="?", help="node to resume")
    p = add("notify", help="tell the daemon something happened (used by Slurm triggers)")
    p.add_argument("event", choices=["node-down", "wake"])
    p.add_argument("detail", nargs="*", help="what Slurm passed (e.g. node names)")


def run_notify(cfg: Config, args: argparse.Namespace) -> int:
    code, _ = ask_daemon(cfg.socket, {"op": "wake", "why": f"{args.event} {' '.join(args.detail)}"})
    return code


def run_nodes(cfg: Config, args: argparse.Namespace, open_store: Callable[[Config], Store]) -> int:
    if args.action == "resume":
        if not args.node:
            print("b300ctl: nodes resume needs a node name", file=sys.stderr)
            return 2
        code, result = ask_daemon(cfg.socket, {"op": "node_resume", "node": args.node})
        if code == 0:
            print(json.dumps(result) if args.json else f"resumed {result['node']}")
        return code
    store = open_store(cfg)
    try:
        nodes = store.list_nodes()
        history = store.events(kinds=list(NODE_HISTORY))
    finally:
        store.close()
    rows: list[dict[str, Any]] = []
    for node in nodes:
        mine = [e for e in history if e.node == node.name]
        # Every drain the daemon made, for a failure, a black hole or version drift.
        drains = [e for e in mine if e.kind in DRAINS]
        rows.append({
            "node": node.name, "state": node.state, "reason": node.reason,
            "failed": sum(e.kind == Kind.NODE_FAILED for e in mine),
            "suspect": sum(e.kind == Kind.NODE_SUSPECT for e in mine),
            "drained": len(drains), "resumed": sum(_returned(e) for e in mine),
            "runs": sorted({e.run_id for e in mine if e.run_id}),
            "last_drain": drains[-1].data.get("reason") if drains else None,
            "history": [{"ts": e.ts.isoformat(), "kind": e.kind, "run_id": e.run_id,
                         "actor": e.actor, "data": e.data}
                        for e in mine if e.kind != Kind.NODE_STATE][-20:],
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from .ctl import print_table

    table = [["NODE", "STATE", "FAILED", "SUSPECT", "DRAINED", "RESUMED", "REASON"]]
    table += [[r["node"], r["state"].lower(), str(r["failed"]), str(r["suspect"]),
               str(r["drained"]), str(r["resumed"]), r["reason"] or ""] for r in rows]
    print_table(table)
    return 0


def _returned(e: Event) -> bool:
    """An operator's resume, or the drift scan resuming a node it had drained."""
    return e.kind == Kind.NODE_RESUMED or (e.kind == Kind.DRIFT_CLEARED and e.data.get("resumed") is True)
