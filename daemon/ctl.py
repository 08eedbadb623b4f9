"""``b300ctl``: the operators' command line.

Queries read the state store directly; commands that change something go to
the running daemon over its control socket, so that only the daemon acts on
the cluster. Every error is one line on stderr with a meaningful exit code:
0 ok, 2 wrong input (bad spec/config/argument, unknown run), 3 Slurm refused,
4 state store unavailable, 5 daemon not reachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy.engine import make_url

from .checkpoints.advice import RunSchedule, stored_run_schedule
from .checkpoints.cli import add_checkpoint_commands, run_checkpoint_command
from .config import Config, config_path, load_config
from .control import ask_daemon
from .drift.cli import add_drift_commands, run_drift_command
from .errors import B300Error, StoreError, one_line
from .events import ACCOUNTING, Kind
from .events_cli import add_events_command, run_events
from .interfaces import Store
from .model import Attempt, Run, attempt_to_dict, run_to_dict
from .nodes_cli import add_node_commands, run_nodes, run_notify
from .report.cli import add_report_command, run_report
from .spec import load_spec_file, parse_spec
from .store import open_store


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"b300ctl: error: {one_line(message)}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    # Options accepted before or after the command; SUPPRESS keeps a later default
    # from overwriting an earlier value.
    common = _Parser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS,
                        help="config file (default: $B300_CONFIG or /etc/b300/b300.toml)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON instead of tables")
    ap = _Parser(prog="b300ctl", description="Drive the b300 orchestrator.", parents=[common])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    p = add("submit", help="submit a training run from a TOML spec")
    p.add_argument("spec", help="job spec file (TOML)")
    p = add("status", help="all runs, or one run with its attempts and events")
    p.add_argument("run", nargs="?", help="run id")
    p.add_argument("--all", action="store_true", help="include ended runs in the list")
    p = add("resubmit", help="submit a new attempt of a run")
    p.add_argument("run", help="run id")
    p.add_argument("--exclude", action="append", default=[], metavar="NODES",
                   help="nodes to keep the attempt off (hostlist, e.g. gpu[01-03]); repeatable")
    p.add_argument("--from-checkpoint", metavar="PATH",
                   help="checkpoint to resume from (default: the newest verified one); it must "
                        "be a complete checkpoint of the run's layout")
    p.add_argument("--force", action="store_true",
                   help="use --from-checkpoint PATH without verifying it (it must exist)")
    p.add_argument("--from-scratch", action="store_true",
                   help="start the new attempt without any checkpoint")
    p = add("cancel", help="cancel a run's active attempt")
    p.add_argument("run", help="run id")
    add_drift_commands(sub, [common])
    add_checkpoint_commands(sub, [common])
    add_node_commands(add)
    add_events_command(add)
    add_report_command(add)
    p = add("completion", help="print a shell completion script (bash)")
    p.add_argument("shell", choices=["bash"])
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.json = getattr(args, "json", False)
    args.config = getattr(args, "config", None)
    try:
        if args.command == "completion":
            from .completion import bash_completion

            print(bash_completion(build_parser()), end="")
            return 0
        cfg = load_config(config_path(args.config))
        if args.command == "events":
            return run_events(cfg, args, _open_store)
        if args.command == "report":
            return run_report(cfg, args, _open_store)
        if args.command == "status":
            return _status(cfg, args)
        if args.command == "checkpoints":
            return run_checkpoint_command(cfg, args, _open_store)
        if args.command == "drift":
            return run_drift_command(cfg, args, _open_store)
        if args.command == "nodes":
            return run_nodes(cfg, args, _open_store)
        if args.command == "notify":
            return run_notify(cfg, args)
        return _mutate(cfg, args)
    except B300Error as exc:
        print(f"b300ctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (b300ctl drift | head): stop quietly, and keep Python's
        # own flush at exit from failing on the same pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _open_store(cfg: Config) -> Store:
    url = make_url(cfg.database_url)
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
        raise StoreError(f"no state store at {url.database} (has b300d been started?)")
    return open_store(cfg.database_url)


def _mutate(cfg: Config, args: argparse.Namespace) -> int:
    request: dict[str, Any]
    if args.command == "submit":
        _spec, text = load_spec_file(args.spec)
        request = {"op": "submit", "spec_toml": text, "where": args.spec}
    elif args.command == "resubmit":
        if args.force and not args.from_checkpoint:
            print("b300ctl: --force needs --from-checkpoint PATH", file=sys.stderr)
            return 2
        request = {"op": "resubmit", "run_id": args.run, "exclude": args.exclude,
                   "resume_from": args.from_checkpoint, "force": args.force,
                   "from_scratch": args.from_scratch}
    else:
        request = {"op": "cancel", "run_id": args.run}
    code, result = ask_daemon(cfg.socket, request)
    if code:
        return code
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    run = result["run"]
    last = result["attempts"][-1] if result["attempts"] else {}
    verb = {"submit": "submitted", "resubmit": "resubmitted", "cancel": "cancel requested for"}
    job = f" as Slurm job {last['job_id']}" if last.get("job_id") and args.command != "cancel" else ""
    print(f"{verb[args.command]} run {run['id']}{job} ({run['state']})")
    return 0


def _status(cfg: Config, args: argparse.Namespace) -> int:
    store = _open_store(cfg)
    try:
        if args.run:
            return _status_one(store, args.run, args.json, cfg.state_dir)
        note = _accounting_note(store)
        daemon_line = _daemon_line(cfg, store)
        runs = store.list_runs()
        if not args.all:
            runs = [r for r in runs if not r.state.is_terminal] or runs[:20]
        rows = []
        for run in runs:
            attempts = store.attempts(run.id)
            last = attempts[-1] if attempts else None
            rows.append({**run_to_dict(run), "current": attempt_to_dict(last) if last else None})
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [["RUN", "NAME", "STATE", "ATT", "JOB", "NODES", "UPDATED", "REASON"]]
    for r in rows:
        cur = r["current"] or {}
        # Why a pending run waits (Resources, ReqNodeNotAvail, a hold) is what to look at.
        reason = cur.get("reason") or "" if r["state"] in ("PENDING", "SUBMITTING") else ""
        table.append([r["id"], r["name"], r["state"], str(r["attempts"]),
                      str(cur.get("job_id") or "-"), _nodes(cur.get("nodes") or []),
                      r["updated_at"][:19].replace("T", " "), reason])
    print_table(table)
    if note:
        print(f"\n{note}")
    print(f"\n{daemon_line}")
    return 0


def _daemon_line(cfg: Config, store: Store) -> str:
    """Which daemon is active (from the lease row), and what this host's b300d is."""
    from .control import call_daemon
    from .errors import DaemonUnavailableError

    try:
        reply = call_daemon(cfg.socket, {"op": "ping"}, timeout=2)
        local = reply.get("result") or {}
        here = f"this host's b300d: {local.get('role', 'active')} (pid {local.get('pid')})"
    except DaemonUnavailableError:
        here = "this host's b300d: not running"
    lease = store.daemon_lease(cfg.lease_name)
    if lease is None:
        return f"active daemon: none yet; {here}"
    if not lease["live"]:
        return f"active daemon: none (the lease expired at {lease['expires_at'][:19]}Z); {here}"
    return (f"active daemon: {lease['host']} pid {lease['pid']} epoch {lease['epoch']} "
            f"since {lease['since'][:19]}Z; {here}")


def _accounting_note(store: Store) -> str | None:
    """One line when the daemon's last word on Slurm accounting is that it is down."""
    last = store.events(kinds=list(ACCOUNTING))[-1:]
    if not last or last[0].kind != Kind.ACCOUNTING_UNAVAILABLE:
        return None
    error = str(last[0].data.get("error") or "")
    return (f"note: Slurm accounting (sacct/slurmdbd) has not answered since "
            f"{last[0].ts:%Y-%m-%d %H:%M:%S}Z ({error}); a job that ends meanwhile gets its exit "
            f"code once it answers, or none after [slurm] accounting_grace")


def _schedule(store: Store, run: Run) -> RunSchedule | None:
    try:
        spec = parse_spec(run.spec_toml, where=f"run {run.id}")
    except B300Error:
        return None
    return stored_run_schedule(store, run, spec, datetime.now(UTC))


def _status_one(store: Store, run_id: str, as_json: bool, state_dir: str = "") -> int:
    note = _accounting_note(store)
    run = store.get_run(run_id)
    schedule = _schedule(store, run)
    stored = store.attempts(run_id)
    attempts = [attempt_to_dict(a) for a in stored]
    exclusions = _exclusions(store, stored[-1]) if stored else []
    if attempts:
        attempts[-1]["exclusions"] = exclusions
    events: list[dict[str, Any]] = [
        {"id": e.id, "ts": e.ts.isoformat(), "kind": e.kind, "actor": e.actor,
         "attempt_id": e.attempt_id, "data": e.data}
        for e in store.events(run_id=run_id)]
    if as_json:
        from .slurm.release import read_release

        # "slurm": the release b300d found at its last start (None before the first).
        print(json.dumps({"run": run_to_dict(run), "attempts": attempts, "events": events,
                          "slurm": read_release(state_dir) if state_dir else None,
                          "checkpoint_schedule": schedule.to_dict() if schedule else None}, indent=2))
        return 0
    print(f"run      {run.id}\nname     {run.name}\nstate    {run.state.value}\n"
          f"created  {run.created_at:%Y-%m-%d %H:%M:%S}Z")
    for line in schedule.lines() if schedule else ():
        print(f"         {line}")
    print()
    table = [["#", "JOB", "STATE", "EXIT", "NODES", "EXCLUDED", "START", "END", "REASON"]]
    for a in attempts:
        code = "-" if a["exit_code"] is None else f"{a['exit_code']}:{a['signal'] or 0}"
        table.append([str(a["number"]), str(a["job_id"] or "-"), a["state"], code,
                      _nodes(a["nodes"]), _nodes(a["excluded_nodes"]),
                      (a["start"] or "-")[:19].replace("T", " "),
                      (a["end"] or "-")[:19].replace("T", " "), a["reason"] or ""])
    print_table(table)
    if exclusions:
        print(f"\nexcluded nodes (attempt {attempts[-1]['number']}):")
        print_table([[f"  {x['node']}", x["cause"], x["detail"], x["now"]] for x in exclusions])
    print("\nevents:")
    # Progress events (every few minutes) would crowd out the ones a person looks for.
    for e in [e for e in events if e["kind"] != Kind.ATTEMPT_PROGRESS][-50:]:
        detail = " ".join(f"{k}={v}" for k, v in e["data"].items() if v not in (None, "", []))
        print(f"  {e['ts'][:19].replace('T', ' ')}  {e['kind']:<24} {e['actor']:<8} {detail}")
    if note:
        print(f"\n{note}")
    return 0


def _exclusions(store: Store, attempt: Attempt) -> list[dict[str, str]]:
    """The attempt's exclusions, each with its cause and whether that still holds now."""
    from .recovery.exclusions import holds
    from .run_actions import attempt_exclusions

    found = attempt_exclusions(store, attempt)
    if not found:
        return []
    drift = store.drift.open_drift_nodes()
    nodes_now = {n.name: n for n in store.list_nodes()}
    out = []
    for ex in found:
        why = holds(ex, nodes_now, drift, ())
        out.append({**ex.to_dict(), "now": f"holds: {why}" if why else "ended: healthy again"})
    return out


def _nodes(nodes: list[str]) -> str:
    from .slurm.parse import fold_nodes

    return fold_nodes(nodes) or "-"


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
