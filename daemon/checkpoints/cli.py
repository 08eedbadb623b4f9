"""``b300ctl checkpoints [RUN]``: every checkpoint with step, time, size, verified,
replicated where, and what the next prune would delete; ``--prune`` carries it out.
Above the table, the run's schedule: its interval, the newest checkpoint's age, and the
Young/Daly interval beside it with the inputs it used.

Reads the checkpoint directories (through the run's layout plugin) and the state
store; a prune is a dry run unless ``--yes`` is given, and deletes nothing unless
the checkpoint it prunes against verifies again first.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ..config import Config
from ..config.duration import parse_span
from ..errors import B300Error, UsageError
from ..events import Kind
from ..interfaces import Store
from ..model import Run
from ..spec import parse_spec
from .advice import stored_run_schedule
from .layouts import explain_nothing, load_layout, recognise
from .manifest import verify
from .prune import prune_local
from .records import StoredCheckpoint, plan_state
from .resume import pending_resumes
from .retention import CheckpointState, PrunePlan, RetentionPolicy, plan_prune
from .schedule import format_span


def add_checkpoint_commands(subparsers: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Add ``checkpoints [RUN] [--prune [--yes]]`` with the retention options to b300ctl."""
    p = subparsers.add_parser("checkpoints", parents=list(parents),
                              help="checkpoints of the runs: verified, replicated, what a prune deletes")
    p.add_argument("run", nargs="?", help="run id (default: every run that is not ended)")
    p.add_argument("--keep-last", type=int, default=None, metavar="N",
                   help="newest complete ones kept (default: [checkpoints] keep_last)")
    p.add_argument("--keep-hourly-for", default=None, metavar="DURATION",
                   help="keep the newest of each hour for this long (default: keep_hourly_for)")
    p.add_argument("--keep-daily-for", default=None, metavar="DURATION",
                   help="keep the newest of each day for this long (default: keep_daily_for)")
    p.add_argument("--prune", action="store_true", help="delete what the plan says (dry run without --yes)")
    p.add_argument("--yes", action="store_true", help="with --prune: really delete")


def run_checkpoint_command(
    cfg: Config, args: argparse.Namespace, open_store: Callable[[Config], Store],
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> int:
    """Run ``b300ctl checkpoints``; returns the exit code."""
    policy = _policy(args, cfg.checkpoints.retention)
    configured = [t.name for t in cfg.checkpoints.targets]
    store = open_store(cfg)
    try:
        if args.run:
            runs = [store.get_run(args.run)]
        else:
            runs = [r for r in store.list_runs() if not r.state.is_terminal]
        if args.prune and not args.run:
            raise UsageError("--prune needs a run id")
        reports = [_report(store, run, policy, now(), prune=args.prune, really=args.yes, targets=configured)
                   for run in runs]
    finally:
        store.close()
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    _print(reports)
    return 0


def _policy(args: argparse.Namespace, configured: RetentionPolicy) -> RetentionPolicy:
    if args.keep_last is not None and args.keep_last < 1:
        raise UsageError("--keep-last must be at least 1")

    def span(value: str | None, flag: str, default: timedelta) -> timedelta:
        return default if value is None else parse_span(value.strip(), flag, "b300ctl", UsageError)

    return RetentionPolicy(
        keep_last=configured.keep_last if args.keep_last is None else args.keep_last,
        hourly_for=span(args.keep_hourly_for, "--keep-hourly-for", configured.hourly_for),
        daily_for=span(args.keep_daily_for, "--keep-daily-for", configured.daily_for),
    )


def _report(store: Store, run: Run, policy: RetentionPolicy, now: datetime, *, prune: bool,
            really: bool, targets: Sequence[str] = ()) -> dict[str, Any]:
    try:
        spec = parse_spec(run.spec_toml, where=f"run {run.id}")
    except B300Error as exc:
        return {"run": run.id, "error": str(exc), "checkpoints": []}
    if spec.checkpoint.dir is None:
        return {"run": run.id, "dir": None, "checkpoints": [], "would_delete": []}
    found = load_layout(spec.checkpoint.layout).list_checkpoints(spec.checkpoint.dir)
    known = _known(store, run.id)
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
    if prune:
        result = prune_local(plan, spec.checkpoint.dir, dry_run=not really, verify=lambda p: verify(p).ok)
        report["prune"] = {"dry_run": result.dry_run, "deleted": list(result.deleted),
                           "refused": result.refused}
        if result.deleted and not result.dry_run:
            _record_pruned(store, run.id, result.deleted, now)
    return report


def _known(store: Store, run_id: str) -> dict[str, StoredCheckpoint]:
    """What the store knows about the run's checkpoints."""
    return {c.info.path: c for c in store.checkpoints.checkpoints(run_id)}


def _record_pruned(store: Store, run_id: str, paths: Sequence[str], now: datetime) -> None:
    from ..errors import NotFoundError

    try:
        store.checkpoints.record_pruned(run_id, paths, now, actor="b300ctl")
    except NotFoundError:  # checkpoints the daemon never listed: only the event
        from ..interfaces import NewEvent

        store.append_events([NewEvent(Kind.CHECKPOINT_PRUNED, run_id=run_id, actor="b300ctl",
                                      data={"paths": list(paths)})], now)


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


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _print(reports: list[dict[str, Any]]) -> None:
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
            table.append([str(c["step"]), c["time"][:19].replace("T", " "), _size(c["size_bytes"]), save,
                          complete, verified, _where(c), nxt])
        if r.get("note"):
            print(f"  {r['note']}")
        if len(table) > 1:
            _print_table(table)
        print(f"  next prune deletes {len(r['would_delete'])} checkpoint(s)")
        if "prune" in r:
            p = r["prune"]
            verb = "would delete" if p["dry_run"] else "deleted"
            refused = f"; refused: {p['refused']}" if p["refused"] else ""
            print(f"  prune: {verb} {len(p['deleted'])}{refused}")
