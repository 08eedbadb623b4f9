"""``b300ctl nodes`` (every node with its failure and drain history), ``nodes resume NODE``
and ``nodes triage NODE [--returnable]`` (requests to the daemon), ``nodes show NODE`` (one
node's drains, causes, checks and returns) and ``b300ctl notify`` (what the Slurm triggers
call)."""

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
    if args.action == "triage":
        if not args.node:
            raise UsageError("nodes triage needs a node name")
        code, result = ctx.ask({"op": "node_triage", "node": args.node, "returnable": args.returnable})
        if code == 0:
            if ctx.json:
                print_json(result, lines=True)
            else:
                print(f"triage of {result['node']} asked" + (" (returnable: earlier drains no longer make it a "
                                                             "lemon)" if result["returnable"] else ""))
        return code
    if args.action == "show":
        if not args.node:
            raise UsageError("nodes show needs a node name")
        return show(ctx.json, _node_show(ctx, args.node), _print_show)
    rows, pools = _node_rows(ctx)
    code = show(ctx.json, rows, _print_nodes)
    if pools and not ctx.json:
        _print_pools(pools)
    return code


def _node_rows(ctx: Context) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from ..events import DRAINS, NODE_HISTORY, Kind
    from ..payloads import NodeDrained

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
            "last_drain": (NodeDrained.of(drains[-1]).reason or None) if drains else None,
            "history": [{"ts": e.ts.isoformat(), "kind": e.kind, "run_id": e.run_id,
                         "actor": e.actor, "data": e.data}
                        for e in mine if e.kind != Kind.NODE_STATE][-_HISTORY_SHOWN:],
        })
    return rows, spare_pools(pool_events)


def _node_show(ctx: Context, node: str) -> dict[str, Any]:
    """One node's history: drains (with their cause), triages (checks, verdict), returns."""
    from ..events import NODE_HISTORY, TRIAGE, Kind
    from ..payloads import NodeDrained, TriageVerdict
    from ..triage.decide import cause_of

    store = ctx.open_store()
    try:
        known = {n.name: n for n in store.list_nodes()}
        events = store.events(node=node, kinds=sorted({*NODE_HISTORY, *TRIAGE}))
    finally:
        store.close()
    if node not in known and not events:
        raise UsageError(f"unknown node {node!r}")
    now = known.get(node)
    history = []
    for e in events:
        if e.kind == Kind.NODE_STATE:
            continue
        item: dict[str, Any] = {"ts": e.ts.isoformat(), "kind": e.kind, "actor": e.actor, "run_id": e.run_id}
        if e.kind in (Kind.NODE_DRAINED, Kind.DRIFT_DRAINED):
            item["cause"] = cause_of(NodeDrained.of(e).reason or "b300: drift") or "other"
        item["data"] = e.data
        history.append(item)
    verdicts = [e for e in events if e.kind == Kind.TRIAGE_VERDICT]
    return {"node": node, "state": now.state if now else None, "reason": now.reason if now else None,
            "drains": sum(1 for h in history if "cause" in h),
            "returns": sum(1 for e in events if _returned(e)),
            "lemon": bool(verdicts) and TriageVerdict.of(verdicts[-1]).verdict == "lemon",
            "last_verdict": verdicts[-1].data if verdicts else None, "history": history}


def _print_show(doc: dict[str, Any]) -> None:
    from ..events import Kind

    state = str(doc["state"] or "?").lower()
    print(f"{doc['node']}: {state}" + (f" ({doc['reason']})" if doc["reason"] else ""))
    print(f"drains {doc['drains']}, returns {doc['returns']}" + (", LEMON: never returned automatically "
                                                                 "(b300ctl nodes triage NODE --returnable)"
                                                                 if doc["lemon"] else ""))
    table = [["TIME", "EVENT", "BY", "DETAIL"]]
    for h in doc["history"]:
        d = h["data"]
        if "cause" in h:
            detail = f"cause {h['cause']}: {d.get('reason', '')}"
        elif h["kind"] == Kind.TRIAGE_STARTED:
            detail = f"checks {', '.join(d.get('checks') or [])} (cause {d.get('cause')})"
        elif h["kind"] == Kind.TRIAGE_VERDICT:
            detail = f"{d.get('verdict')}: {d.get('evidence', '')}"
        elif h["kind"] == Kind.TRIAGE_REBOOT:
            detail = f"reboot after {d.get('failed_check')} failed: {d.get('evidence', '')}"
        else:
            detail = ", ".join(f"{k}={v}" for k, v in d.items())
        table.append([h["ts"][:19], h["kind"], h["actor"], detail[:120]])
    print_table(table)


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
    from ..payloads import DriftCleared

    return e.kind == Kind.NODE_RESUMED or (e.kind == Kind.DRIFT_CLEARED and DriftCleared.of(e).resumed)


def run_notify(ctx: Context, args: argparse.Namespace) -> int:
    code, _ = ctx.ask({"op": "wake", "why": f"{args.event} {' '.join(args.detail)}"})
    return code


COMMANDS = (
    Command("nodes", "nodes with their failure/drain history; 'nodes resume|triage|show NODE'", run_nodes,
            arguments=(
                arg("action", nargs="?", choices=["list", "resume", "triage", "show"], default="list"),
                arg("node", nargs="?", help="node to resume, triage or show"),
                arg("--returnable", action="store_true",
                    help="with triage: a lemon may be returned again (its earlier drains no longer count)"),
            )),
    Command("notify", "tell the daemon something happened (used by Slurm triggers)", run_notify,
            mutating=True, arguments=(
                arg("event", choices=["node-down", "wake"]),
                arg("detail", nargs="*", help="what Slurm passed (e.g. node names)"),
            )),
)
