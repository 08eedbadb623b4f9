"""``b300ctl submit SPEC``, ``resubmit RUN`` and ``cancel RUN``: requests to the daemon.

The spec is checked here first (a bad one is one line and exit 2 without a
daemon); the daemon checks it again, decides and acts under its action lock.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import UsageError
from .command import Command, Context, arg
from .output import print_json

_DONE = {"submit": "submitted", "resubmit": "resubmitted", "cancel": "cancel requested for"}


def run_submit(ctx: Context, args: argparse.Namespace) -> int:
    if args.dry_run:
        from .dry_run import run_dry

        return run_dry(ctx, args)
    from ..spec import load_spec_file

    _spec, text = load_spec_file(args.spec)
    return _ask(ctx, "submit", {"op": "submit", "spec_toml": text, "where": args.spec})


def run_resubmit(ctx: Context, args: argparse.Namespace) -> int:
    if args.force and not args.from_checkpoint:
        raise UsageError("--force needs --from-checkpoint PATH")
    return _ask(ctx, "resubmit", {"op": "resubmit", "run_id": args.run, "exclude": args.exclude,
                                  "resume_from": args.from_checkpoint, "force": args.force,
                                  "from_scratch": args.from_scratch})


def run_cancel(ctx: Context, args: argparse.Namespace) -> int:
    return _ask(ctx, "cancel", {"op": "cancel", "run_id": args.run})


def _ask(ctx: Context, op: str, request: dict[str, Any]) -> int:
    code, result = ctx.ask(request)
    if code:
        return code
    if ctx.json:
        print_json(result)
        return 0
    run = result["run"]
    last = result["attempts"][-1] if result["attempts"] else {}
    job = f" as Slurm job {last['job_id']}" if last.get("job_id") and op != "cancel" else ""
    print(f"{_DONE[op]} run {run['id']}{job} ({run['state']})")
    return 0


COMMANDS = (
    Command("submit", "submit a training run from a TOML spec (--dry-run: only show it)", run_submit,
            mutating=True, arguments=(
        arg("spec", help="job spec file (TOML)"),
        arg("--dry-run", action="store_true",
            help="check the spec and print the sbatch command, batch script, excluded nodes and "
                 "resume point it would get; submit and record nothing"),
    )),
    Command("resubmit", "submit a new attempt of a run", run_resubmit, mutating=True, arguments=(
        arg("run", help="run id"),
        arg("--exclude", action="append", default=[], metavar="NODES",
            help="nodes to keep the attempt off (hostlist, e.g. gpu[01-03]); repeatable"),
        arg("--from-checkpoint", metavar="PATH",
            help="checkpoint to resume from (default: the newest verified one); it must "
                 "be a complete checkpoint of the run's layout"),
        arg("--force", action="store_true",
            help="use --from-checkpoint PATH without verifying it (it must exist)"),
        arg("--from-scratch", action="store_true", help="start the new attempt without any checkpoint"),
    )),
    Command("cancel", "cancel a run's active attempt", run_cancel, mutating=True, arguments=(
        arg("run", help="run id"),
    )),
)
