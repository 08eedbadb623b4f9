"""``b300ctl report --since WHEN [--until WHEN] [--out FILE] [--format html|text|json]``:
the weekly report (ETTR, interruptions, nodes, checkpoints) for any window, from the store."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .command import Command, Context, arg
from .events import parse_when

if TYPE_CHECKING:
    from ..report.compute import WeeklyReport

_SUFFIX_FORMAT = {".html": "html", ".htm": "html", ".json": "json"}


def report_json(report: WeeklyReport) -> dict[str, Any]:
    """The report as JSON-able data (times as ISO text), with each ETTR figure."""
    def conv(x: Any) -> Any:
        if isinstance(x, datetime):
            return x.isoformat()
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [conv(v) for v in x]
        return x

    out = conv(dataclasses.asdict(report))
    out["ettr"] = report.ettr
    for r, fig in zip(out["runs"], report.runs, strict=True):
        r["ettr"] = fig.ettr
    return dict(out)


def render(report: WeeklyReport, fmt: str) -> str:
    """The report as ``json``, ``text`` or ``html`` (charts inline as data: URLs)."""
    from ..report.render import render_text

    if fmt == "json":
        return json.dumps(report_json(report), indent=2) + "\n"
    if fmt == "text":
        return render_text(report)
    from ..report.render import charts, render_html

    return render_html(report, charts(report),
                       lambda _name, png: "data:image/png;base64," + base64.b64encode(png).decode())


def run_report(ctx: Context, args: argparse.Namespace) -> int:
    from ..report.collect import collect_report
    from ..report.compute import Window

    now = ctx.clock()
    since = parse_when(args.since, now, "--since")
    until = parse_when(args.until, now, "--until") if args.until else now
    if until <= since:
        raise UsageError("--until must be after --since")
    fmt = args.format or ("json" if ctx.json else None)
    if fmt is None:
        suffix = Path(args.out).suffix.lower() if args.out else ""
        fmt = _SUFFIX_FORMAT.get(suffix, "text")
    store = ctx.open_store()
    try:
        report = collect_report(store, Window(since, until), now)
    finally:
        store.close()
    try:
        text = render(report, fmt)
    except ImportError as exc:
        raise UsageError(f"the html report needs matplotlib (pip install 'b300-orchestrator[report]'): "
                         f"{exc}") from None
    if args.out:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {args.out}: {exc.strerror or exc}") from None
        print(f"wrote {args.out} ({fmt}, {len(report.runs)} runs, "
              f"{sum(report.by_cause.values())} interruptions)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


COMMANDS = (
    Command("report", "the weekly report (ETTR, interruptions, nodes, checkpoints) for a window",
            run_report, arguments=(
                arg("--since", required=True, metavar="WHEN", help="start (date, ISO time, or 7d ago)"),
                arg("--until", metavar="WHEN", help="end, excluded (default: now)"),
                arg("--out", metavar="FILE", help="write here (default: stdout)"),
                arg("--format", choices=["html", "text", "json"],
                    help="html (charts inline), text or json (default: from --out's suffix, else text)"),
            )),
)
