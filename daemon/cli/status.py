"""``b300ctl status [RUN] [--all]``: every run, or one run with its attempts and events.

Asked of this host's b300d first (control op ``status``: the daemon has the store
open, so b300ctl need not import SQLAlchemy and SQLModel, most of its start-up
time); read from the store when no daemon answers (not running, not ours to ask, or
older than this b300ctl). Both build the same data (:mod:`b300.control.status_view`). The
list ends with which daemon holds the lease and what this host's b300d is.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .command import Command, Context, arg
from .output import details, node_list, print_json, print_table, when

#: How long to wait for this host's daemon before reading the store instead.
_DAEMON_WAIT_S = 2.0
_EVENTS_SHOWN = 50


def run_status(ctx: Context, args: argparse.Namespace) -> int:
    cfg = ctx.config()
    request: dict[str, Any] = {"run": args.run} if args.run else {"all": args.all}
    code, view = _from_daemon(cfg.socket, request)
    if code:
        return code
    if view is None:
        view = _from_store(ctx, request)
    if args.run:
        return _print_one(ctx, view)
    return _print_list(ctx, view)


def _from_daemon(socket_path: str, request: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
    """``(0, view)`` from the daemon; ``(0, None)`` when none answers; ``(code, None)``
    after printing its one-line refusal (an unknown run)."""
    from ..control.client import call_daemon
    from ..errors import DaemonUnavailableError

    try:
        reply = call_daemon(socket_path, {"op": "status", **request}, timeout=_DAEMON_WAIT_S)
    except DaemonUnavailableError:
        return 0, None
    result = reply.get("result")
    if reply.get("ok") and isinstance(result, dict):
        return 0, result
    error = str(reply.get("error", "the daemon refused"))
    if error.startswith("unknown request"):  # a daemon older than this b300ctl
        return 0, None
    print(f"b300ctl: {error}", file=sys.stderr)
    code = reply.get("exit_code")
    return (code if isinstance(code, int) and code else 1), None


def _from_store(ctx: Context, request: dict[str, Any]) -> dict[str, Any]:
    from ..control.status_view import status_view

    cfg = ctx.config()
    store = ctx.open_store()
    try:
        return status_view(store, request, lease_name=cfg.lease_name, state_dir=cfg.state_dir,
                           now=ctx.clock())
    finally:
        store.close()


def _print_list(ctx: Context, view: dict[str, Any]) -> int:
    rows = view["runs"]
    if ctx.json:
        print_json(rows)
        return 0
    table = [["RUN", "NAME", "STATE", "ATT", "JOB", "NODES", "UPDATED", "REASON"]]
    for r in rows:
        cur = r["current"] or {}
        # Why a pending run waits (Resources, ReqNodeNotAvail, a hold) is what to look at.
        reason = cur.get("reason") or "" if r["state"] in ("PENDING", "SUBMITTING") else ""
        table.append([r["id"], r["name"], r["state"], str(r["attempts"]), str(cur.get("job_id") or "-"),
                      node_list(cur.get("nodes") or []), when(r["updated_at"]), reason])
    print_table(table)
    if view["accounting_note"]:
        print(f"\n{view['accounting_note']}")
    here = view["daemon"] if "daemon" in view else _ping(ctx.config().socket)
    print(f"\n{_daemon_line(view['lease'], here)}")
    return 0


def _ping(socket_path: str) -> dict[str, Any] | None:
    """This host's b300d's ``ping`` answer, or None when none answers."""
    from ..control.client import call_daemon
    from ..errors import DaemonUnavailableError

    try:
        reply = call_daemon(socket_path, {"op": "ping"}, timeout=_DAEMON_WAIT_S)
    except DaemonUnavailableError:
        return None
    result = reply.get("result")
    return result if isinstance(result, dict) else {}


def _daemon_line(lease: dict[str, Any] | None, local: dict[str, Any] | None) -> str:
    """Which daemon is active (from the lease row), and what this host's b300d is."""
    here = ("this host's b300d: not running" if local is None else
            f"this host's b300d: {local.get('role', 'active')} (pid {local.get('pid')})")
    if lease is None:
        return f"active daemon: none yet; {here}"
    if not lease["live"]:
        return f"active daemon: none (the lease expired at {lease['expires_at'][:19]}Z); {here}"
    return (f"active daemon: {lease['host']} pid {lease['pid']} epoch {lease['epoch']} "
            f"since {lease['since'][:19]}Z; {here}")


def _print_one(ctx: Context, view: dict[str, Any]) -> int:
    run, attempts, events = view["run"], view["attempts"], view["events"]
    if ctx.json:
        print_json({k: view[k] for k in ("run", "attempts", "events", "slurm", "checkpoint_schedule")})
        return 0
    print(f"run      {run['id']}\nname     {run['name']}\nstate    {run['state']}\n"
          f"created  {when(run['created_at'])}Z")
    for line in view["schedule_text"]:
        print(f"         {line}")
    print()
    table = [["#", "JOB", "STATE", "EXIT", "NODES", "EXCLUDED", "START", "END", "REASON"]]
    for a in attempts:
        code = "-" if a["exit_code"] is None else f"{a['exit_code']}:{a['signal'] or 0}"
        table.append([str(a["number"]), str(a["job_id"] or "-"), a["state"], code, node_list(a["nodes"]),
                      node_list(a["excluded_nodes"]), when(a["start"]), when(a["end"]), a["reason"] or ""])
    print_table(table)
    exclusions = attempts[-1]["exclusions"] if attempts else []
    if exclusions:
        print(f"\nexcluded nodes (attempt {attempts[-1]['number']}):")
        print_table([[x["node"], x["cause"], x["detail"], x["now"]] for x in exclusions], indent="  ")
    relaunches = _relaunch_rows(attempts, events)
    if len(relaunches) > 1:
        print("\nstep relaunches in the same job (spare_nodes):")
        print_table(relaunches, indent="  ")
    print("\nevents:")
    from ..events import Kind

    # Progress events (every few minutes) would crowd out the ones a person looks for.
    for e in [e for e in events if e["kind"] != Kind.ATTEMPT_PROGRESS][-_EVENTS_SHOWN:]:
        print(f"  {when(e['ts'])}  {e['kind']:<24} {e['actor']:<8} {details(e['data'])}")
    if view["accounting_note"]:
        print(f"\n{view['accounting_note']}")
    return 0


def _relaunch_rows(attempts: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[list[str]]:
    """One row per in-allocation relaunch (``attempt.step_relaunch``), with the step Slurm
    started for it (``attempt.step_started`` of the same generation), if any yet."""
    from ..events import Kind

    number = {a["job_id"]: a["number"] for a in attempts if a["job_id"] is not None}
    started = {(e["attempt_id"], e["data"].get("generation")): e for e in events
               if e["kind"] == Kind.ATTEMPT_STEP_STARTED}
    rows = [["AT", "ATTEMPT", "JOB", "GEN", "CAUSE", "EXCLUDED", "RESUME FROM", "SPARES LEFT", "STEP STARTED"]]
    for e in events:
        if e["kind"] != Kind.ATTEMPT_STEP_RELAUNCH:
            continue
        d = e["data"]
        step = started.get((e["attempt_id"], d.get("generation")))
        rows.append([when(e["ts"]), str(number.get(d.get("job_id"), "?")), str(d.get("job_id", "-")),
                     str(d.get("generation", "-")), str(d.get("cause") or "node lost"),
                     node_list(d.get("exclude") or []), str(d.get("resume_from") or "-"),
                     str(d.get("spares_left", "-")),
                     f"{when(step['ts'])} step {step['data'].get('step_id', '?')}" if step else "not yet"])
    return rows


COMMANDS = (
    Command("status", "all runs, or one run with its attempts and events", run_status, arguments=(
        arg("run", nargs="?", help="run id"),
        arg("--all", action="store_true", help="include ended runs in the list"),
    )),
)
