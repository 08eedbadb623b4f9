"""``b300ctl checkpoints [RUN] [--prune [--yes]]``: every checkpoint with step, time, size,
verified, replicated where, and what the next prune would delete. Above the table, the
run's schedule: its interval, the newest checkpoint's age, and the Young/Daly interval
beside it with the inputs it used.

The listing and the dry run (``--prune`` alone) read the checkpoint directories
(through the run's layout plugin) and the state store here. ``--prune --yes`` is a
request to the daemon (op ``checkpoints_prune``), which deletes under its action lock
after the re-checks its upkeep makes (b300.checkpoints.upkeep), as the user who asked.
``checkpoints restore`` fetches one back from an offsite target (b300.cli.restore).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .command import Command, Context, arg
from .output import print_table, show, size, when
from .restore import RESTORE

if TYPE_CHECKING:
    from ..checkpoints.entries import StoredCheckpoint
    from ..checkpoints.retention import CheckpointState, PrunePlan, RetentionPolicy
    from ..interfaces import Store
    from ..model import Run
    from ..plugin_registry import PluginRegistry

_PRUNE_TIMEOUT_S = 3600.0  # deleting a few TB of checkpoint files takes a while


def run_checkpoints(ctx: Context, args: argparse.Namespace) -> int:
    from ..checkpoints.retention import requested_policy

    if args.prune and not args.run:
        raise UsageError("--prune needs a run id")
    cfg = ctx.config()
    policy = requested_policy(cfg.checkpoints.retention, keep_last=args.keep_last,
                              keep_hourly_for=args.keep_hourly_for, keep_daily_for=args.keep_daily_for)
    pruned: dict[str, Any] | None = None
    if args.prune and args.yes:
        code, pruned = ctx.ask({"op": "checkpoints_prune", "run_id": args.run, "keep_last": args.keep_last,
                                "keep_hourly_for": args.keep_hourly_for,
                                "keep_daily_for": args.keep_daily_for}, timeout=_PRUNE_TIMEOUT_S)
        if code:
            return code
    from ..plugin_registry import PluginRegistry

    configured = [t.name for t in cfg.checkpoints.targets]
    plugins = PluginRegistry()  # the layouts, loaded once for every run listed
    store = ctx.open_store()
    try:
        runs = [store.get_run(args.run)] if args.run else \
            [r for r in store.list_runs() if not r.state.is_terminal]
        reports = [_report(store, run, policy, ctx.clock(), plugins, targets=configured) for run in runs]
    finally:
        store.close()
    if args.prune:
        # What the daemon deleted (the listing above is after it), or what it would delete.
        reports[0]["prune"] = ({"dry_run": False, **pruned} if pruned is not None else
                               {"dry_run": True, "deleted": reports[0]["would_delete"], "refused": ""})
    return show(ctx.json, reports, _print)


def _report(store: Store, run: Run, policy: RetentionPolicy, now: datetime, plugins: PluginRegistry,
            targets: Sequence[str] = ()) -> dict[str, Any]:
    from ..checkpoints.advice import stored_run_schedule
    from ..checkpoints.entries import plan_state
    from ..checkpoints.layouts import explain_nothing, load_layout, recognise
    from ..checkpoints.resume import pending_resumes
    from ..checkpoints.retention import plan_prune
    from ..errors import B300Error
    from ..spec import parse_spec

    try:
        spec = parse_spec(run.spec_toml, where=f"run {run.id}")
    except B300Error as exc:
        return {"run": run.id, "error": str(exc), "checkpoints": [], "would_delete": []}
    if spec.checkpoint.dir is None:
        return {"run": run.id, "dir": None, "checkpoints": [], "would_delete": []}
    found = load_layout(spec.checkpoint.layout, plugins).list_checkpoints(spec.checkpoint.dir)
    known = {c.info.path: c for c in store.checkpoints.checkpoints(run.id)}
    targets = sorted(set(targets) | {t for k in known.values() for t in k.replicas})
    pending = pending_resumes(store.attempts(run.id))
    states = [plan_state(c, known.get(c.path)) for c in found]
    plan = plan_prune(states, policy, now, pending_resume=pending, replication_targets=targets)
    schedule = stored_run_schedule(store, run, spec, now, checkpoints=found)
    report: dict[str, Any] = {
        "run": run.id, "dir": spec.checkpoint.dir, "layout": spec.checkpoint.layout,
        "schedule": schedule.to_dict() if schedule else None,
        "schedule_text": schedule.lines() if schedule else [],
        "checkpoints": [_row(s, known.get(s.info.path), plan) for s in states],
        "would_delete": [c.path for c in plan.delete],
    }
    if spec.checkpoint.layout == "auto":
        chosen, why = recognise(spec.checkpoint.dir)
        report["layout_chosen"] = chosen
        report["note"] = f"auto: {why}" + (f"; chose {chosen}" if chosen else "")
    if not found:
        report["note"] = explain_nothing(spec.checkpoint.layout, spec.checkpoint.dir)
    return report


def _row(state: CheckpointState, known: StoredCheckpoint | None, plan: PrunePlan) -> dict[str, Any]:
    c = state.info
    return {
        "path": c.path, "step": c.step, "time": c.mtime.isoformat(), "size_bytes": c.size_bytes,
        "files": c.files, "complete": c.complete, "why_incomplete": c.why_incomplete,
        "save_s": None if c.save_s is None else round(c.save_s, 3),
        "verified": None if known is None else known.verified, "marked": state.marked,
        "replicated_to": sorted(state.replicated_to),
        "replicas_pruned": [] if known is None else sorted(known.replicas_pruned),
        "next_prune": "keep" if c.path in plan.keep else "delete",
        "kept_because": list(plan.keep.get(c.path, ())),
    }


def _where(row: dict[str, Any]) -> str:
    pruned = set(row.get("replicas_pruned", ()))
    names = [f"{t}(pruned there)" if t in pruned else t for t in row["replicated_to"]]
    return ",".join(names) or "-"


def _print(reports: list[dict[str, Any]]) -> None:
    from ..checkpoints.cadence import format_span

    for r in reports:
        layout = f" ({r['layout']})" if r.get("layout") else ""
        print(f"run {r['run']}: {r.get('dir') or 'no checkpoint dir'}{layout}")
        if r.get("error"):
            print(f"  {r['error']}")
            continue
        for line in r.get("schedule_text", ()):
            print(f"  {line}")
        table = [["STEP", "TIME", "SIZE", "SAVE", "COMPLETE", "VERIFIED", "REPLICATED", "NEXT PRUNE"]]
        for c in r["checkpoints"]:
            verified = {True: "yes", False: "FAILED", None: "-"}[c["verified"]]
            complete = "yes" if c["complete"] else f"no: {c['why_incomplete']}"
            nxt = "delete" if c["next_prune"] == "delete" else "keep (" + "; ".join(c["kept_because"]) + ")"
            save = "-" if c["save_s"] is None else format_span(c["save_s"])
            table.append([str(c["step"]), when(c["time"]), size(c["size_bytes"]), save, complete, verified,
                          _where(c), nxt])
        if r.get("note"):
            print(f"  {r['note']}")
        if len(table) > 1:
            print_table(table)
        print(f"  next prune deletes {len(r['would_delete'])} checkpoint(s)")
        if "prune" in r:
            p = r["prune"]
            verb = "would delete" if p["dry_run"] else "deleted"
            refused = f"; refused: {p['refused']}" if p["refused"] else ""
            kept = f"; kept, copying again: {len(p['unconfirmed'])}" if p.get("unconfirmed") else ""
            print(f"  prune: {verb} {len(p['deleted'])}{refused}{kept}")


COMMANDS = (
    Command("checkpoints", "checkpoints of the runs: verified, replicated, what a prune deletes",
            run_checkpoints, arguments=(
                arg("run", nargs="?", help="run id (default: every run that is not ended)"),
                arg("--keep-last", type=int, default=None, metavar="N",
                    help="newest complete ones kept (default: [checkpoints] keep_last)"),
                arg("--keep-hourly-for", default=None, metavar="DURATION",
                    help="keep the newest of each hour for this long (default: keep_hourly_for)"),
                arg("--keep-daily-for", default=None, metavar="DURATION",
                    help="keep the newest of each day for this long (default: keep_daily_for)"),
                arg("--prune", action="store_true",
                    help="delete what the plan says (a dry run without --yes)"),
                arg("--yes", action="store_true", help="with --prune: ask b300d to really delete"),
            ), subcommands=(RESTORE,)),
)
