"""``b300ctl report --since DATE [--until DATE] --out FILE [--format html|text|json]``."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import UsageError
from ..events_cli import parse_when
from ..interfaces import Store
from .collect import collect_report
from .compute import WeeklyReport, Window


def add_report_command(add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("report", help="the weekly report (ETTR, interruptions, nodes, checkpoints) for a window")
    p.add_argument("--since", required=True, metavar="WHEN", help="start (date, ISO time, or 7d ago)")
    p.add_argument("--until", metavar="WHEN", help="end, excluded (default: now)")
    p.add_argument("--out", metavar="FILE", help="write here (default: stdout)")
    p.add_argument("--format", choices=["html", "text", "json"],
                   help="html (charts inline), text or json (default: from --out's suffix, else text)")


def report_json(report: WeeklyReport) -> dict[str, Any]:
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
    from .render import render_text

    if fmt == "json":
        return json.dumps(report_json(report), indent=2) + "\n"
    if fmt == "text":
        return render_text(report)
    from .render import charts, render_html

    return render_html(report, charts(report),
                       lambda _name, png: "data:image/png;base64," + base64.b64encode(png).decode())


def run_report(cfg: Config, args: argparse.Namespace, open_store: Callable[[Config], Store]) -> int:
    now = datetime.now(UTC)
    since = parse_when(args.since, now, "--since")
    until = parse_when(args.until, now, "--until") if args.until else now
    if until <= since:
        raise UsageError("--until must be after --since")
    fmt = args.format or ("json" if args.json else None)
    if fmt is None:
        suffix = Path(args.out).suffix.lower() if args.out else ""
        fmt = {".html": "html", ".htm": "html", ".json": "json"}.get(suffix, "text")
    store = open_store(cfg)
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
