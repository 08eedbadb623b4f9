"""``b300ctl drill RUN [--node NODE] [--method down|crash] [--timeout 10m]``: the failure drill.

A request to the daemon (admins only), which checks the run may be drilled, pulls the
node and measures; this command then waits (at most ``--timeout`` and a minute to
finish the record) for the daemon's ``drill.finished`` and prints the figures. If this
command goes away, the daemon measures on (``b300ctl events --kind drill.``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from typing import Any

from ..errors import UsageError
from .command import Command, Context, arg
from .output import print_json

_POLL_S = 1.0
_FINISH_S = 60.0  # after the daemon's timeout: returning the node, writing the record
_MILESTONES = (("detect_s", "detected"), ("drain_s", "drained"), ("excluded_s", "excluded"),
               ("resubmit_s", "resubmitted"), ("allocation_s", "allocated"), ("training_s", "training again"))


def drill_timeout(text: str) -> float:
    """``--timeout``: a duration (``90``, ``90s``, ``10m``) of at most an hour."""
    from ..grammar.duration import DurationError, duration_seconds

    try:
        seconds = duration_seconds(text)
    except DurationError as exc:
        raise UsageError(f"drill: --timeout {exc}") from None
    if not 1 <= seconds <= 3600:
        raise UsageError(f"drill: --timeout must be between 1 s and 1 h, got {seconds:g} s")
    return seconds


def run_drill(ctx: Context, args: argparse.Namespace) -> int:
    timeout = drill_timeout(args.timeout)
    request: dict[str, Any] = {"op": "drill", "run_id": args.run, "method": args.method, "timeout_s": timeout}
    if args.node:
        request["node"] = args.node
    code, started = ctx.ask(request)
    if code:
        return code
    drill = int(started["drill"])
    if not ctx.json:
        print(f"drill {drill}: run {started['run']} attempt {started['attempt']} (job {started['job_id']}): "
              f"{args.method} {started['node']} at step {_or(started.get('step_at_failure'))}", flush=True)
    record = _wait(ctx, drill, time.monotonic() + timeout + _FINISH_S)
    if ctx.json:
        print_json(record)
    else:
        print_drill(record)
    finished = record.get("finished")
    if finished is None:
        return 1
    return 0 if str(finished.get("outcome")) == "trained again" else 1


def _wait(ctx: Context, drill: int, until: float) -> dict[str, Any]:
    record: dict[str, Any] = {}
    while True:
        code, record = ctx.ask({"op": "drill_status", "drill": drill}, timeout=30)
        if code:
            return record
        if "finished" in record or time.monotonic() >= until:
            return record
        time.sleep(_POLL_S)


def _or(value: object, unit: str = "") -> str:
    return "-" if value is None else f"{value}{unit}"


def print_drill(record: Mapping[str, Any]) -> None:
    """One screen: the drill's figures (or how far it got)."""
    started = record.get("started") or {}
    finished = record.get("finished")
    figures: Mapping[str, Any] = finished or {}
    print(f"run {record.get('run')}, node {started.get('node')} ({started.get('method')}), "
          f"was {started.get('node_state') or 'unknown'}")
    injected = record.get("injected") or {}
    if injected:
        print(f"  {'injected':<16}{injected.get('inject_s', 0):>8.1f} s")
    for key, label in _MILESTONES:
        v = figures.get(key)
        extra = ""
        if key == "detect_s" and figures.get("detected_by"):
            extra = f"  ({figures['detected_by']})"
        if key == "resubmit_s" and figures.get("new_attempt"):
            extra = f"  (attempt {figures['new_attempt']})"
        if key == "training_s" and figures.get("trained_step") is not None:
            extra = f"  (step {figures['trained_step']})"
        print(f"  {label:<16}{'-' if v is None else f'{float(v):.1f}':>8} s{extra}")
    print(f"  {'resumed at step':<16}{_or(figures.get('resume_step')):>8}")
    print(f"  {'steps lost':<16}{_or(figures.get('steps_lost')):>8}  "
          f"(at step {_or(started.get('step_at_failure'))} when pulled)")
    if finished is None:
        print("  still measuring: the daemon goes on (b300ctl events --kind drill.)")
        return
    print(f"  outcome: {finished.get('outcome')}; node {finished.get('node')}: {finished.get('returned')}")
    if finished.get("error"):
        print(f"  error: {finished['error']}")


COMMANDS = (
    Command("drill", "failure drill: pull a node out of a running run and time its recovery",
            run_drill, mutating=True, arguments=(
                arg("run", help="run id (running, with a verified checkpoint)"),
                arg("--node", help="the node to pull (default: one of the running attempt's nodes)"),
                arg("--method", choices=("down", "crash"), default="down",
                    help="down: scontrol state=down with a drill reason; crash: the site's "
                         "[drill] crash_command"),
                arg("--timeout", default="10m",
                    help="how long the daemon measures, and this command waits (default 10m, at most 1h)"),
            )),
)
