"""``b300ctl nodes`` (every node with its failure and drain history), ``nodes resume NODE``
(a request to the daemon) and ``b300ctl notify`` (what the Slurm triggers call)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .command import Command, Context, arg
from .output import print_json, print_table, show

if TYPE_CHECKING:
    from ..model import Event

_HISTORY_SHOWN = 20


def run_nodes(ctx: Context, args: argparse.Namespace) -> int:
    if args.action == "resume":
        if not args.node:
            raise UsageError("nodes resume needs a node name")
        code, result = ctx.ask({"op": "node_resume", "node": args.node})
        if code == 0:
            if ctx.json:
                print_json(result, lines=True)
            else:
                print(f"resumed {result['node']}")
        return code
    rows, pools = _node_rows(ctx)
    code = show(ctx.json, rows, _print_nodes)
    if pools and not ctx.json:
        _print_pools(pools)
    return code


def _node_rows(ctx: Context) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from ..events import DRAINS, NODE_HISTORY, Kind

    store = ctx.open_store()
    try:
        nodes = store.list_nodes()
        history = store.events(kinds=list(NODE_HISTORY))
        pool_events = store.events(kinds=[Kind.SPARES_POOL])
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
                        for e in mine if e.kind != Kind.NODE_STATE][-_HISTORY_SHOWN:],
        })
    return rows, spare_pools(pool_events)


def spare_pools(events: list[Event]) -> list[dict[str, Any]]:
    """The daemon's spare pools as last recorded (one ``spares.pool`` event per change)."""
    from ..spares.pool import latest_pools

    return [{**e.data, "ts": e.ts.isoformat()} for e in latest_pools(events)]


def _print_pools(pools: list[dict[str, Any]]) -> None:
    print()
    table = [["SPARE POOL", "PARTITION", "WANTED", "IDLE", "IN USE", "NODES"]]
    table += [[p["reservation"], str(p.get("partition", "")), str(p.get("wanted", "")),
               str(len(p.get("idle", []))), str(len(p.get("held", []))),
               ",".join(p.get("nodes", [])) or "-"] for p in pools]
    print_table(table)


def _print_nodes(rows: list[dict[str, Any]]) -> None:
    table = [["NODE", "STATE", "FAILED", "SUSPECT", "DRAINED", "RESUMED", "REASON"]]
    table += [[r["node"], r["state"].lower(), str(r["failed"]), str(r["suspect"]),
               str(r["drained"]), str(r["resumed"]), r["reason"] or ""] for r in rows]
    print_table(table)


def _returned(e: Event) -> bool:
    """An operator's resume, or the drift scan resuming a node it had drained."""
    from ..events import Kind

    return e.kind == Kind.NODE_RESUMED or (e.kind == Kind.DRIFT_CLEARED and e.data.get("resumed") is True)


def run_notify(ctx: Context, args: argparse.Namespace) -> int:
    code, _ = ctx.ask({"op": "wake", "why": f"{args.event} {' '.join(args.detail)}"})
    return code


COMMANDS = (
    Command("nodes", "nodes with their failure/drain history; 'nodes resume NODE'", run_nodes, arguments=(
        arg("action", nargs="?", choices=["list", "resume"], default="list"),
        arg("node", nargs="?", help="node to resume"),
    )),
    Command("notify", "tell the daemon something happened (used by Slurm triggers)", run_notify,
            mutating=True, arguments=(
                arg("event", choices=["node-down", "wake"]),
                arg("detail", nargs="*", help="what Slurm passed (e.g. node names)"),
            )),
)
