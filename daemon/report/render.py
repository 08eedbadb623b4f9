"""The weekly report as plain text and as HTML with inline charts (matplotlib PNGs).

Mail clients strip ``<style>`` blocks and scripts, so the HTML uses inline
styles and plain tables only; charts are PNG images whose ``src`` the caller
chooses (``data:`` URIs for a file, ``cid:`` references for a mail).
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable
from datetime import datetime

from .compute import CAUSES, WeeklyReport

ImageSrc = Callable[[str, bytes], str]


def hours(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{seconds / 3600:.1f}"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _day(ts: datetime) -> str:
    return f"{ts:%Y-%m-%d %H:%M}"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def ettr_rows(report: WeeklyReport) -> list[list[str]]:
    rows = [["run", "name", "state", "attempts", "wall h", "train h", "ETTR", "detect h", "queue h",
             "restart h", "recompute h", "other h"]]
    for r in report.runs:
        rows.append([r.run_id, r.name, r.state, str(r.attempts), hours(r.wall_s), hours(r.training_s),
                     pct(r.ettr), hours(r.detect_s), hours(r.queue_s), hours(r.restart_s),
                     hours(r.recompute_s), hours(r.other_s)])
    return rows


def cause_rows(report: WeeklyReport) -> list[list[str]]:
    total = sum(report.by_cause.values())
    rows = [["cause", "interruptions", "share"]]
    for cause in CAUSES:
        n = report.by_cause[cause]
        rows.append([cause, str(n), pct(n / total) if total else "-"])
    rows.append(["total", str(total), "100.0%" if total else "-"])
    return rows


def node_rows(report: WeeklyReport) -> list[list[str]]:
    rows = [["time", "node", "event", "by", "reason"]]
    for c in sorted(report.drained + report.returned, key=lambda c: c.ts):
        rows.append([_day(c.ts), c.node, c.kind, c.actor, c.reason[:80]])
    return rows


def checkpoint_rows(report: WeeklyReport) -> list[list[str]]:
    rows = [["run", "newest step", "age h", "interval h", "Young/Daly h", "overdue", "stored GB", "count",
             "replication lag h"]]
    for c in report.checkpoints or ():
        rows.append([c.run_id, "-" if c.newest_step is None else str(c.newest_step), hours(c.newest_age_s),
                     hours(c.interval_s), "-" if c.young_daly_s is None else hours(c.young_daly_s),
                     "yes" if c.overdue else "no", f"{c.stored_bytes / 1e9:.1f}", str(c.count),
                     "no target" if c.replication_lag_s is None else hours(c.replication_lag_s)])
    return rows


def drill_rows(report: WeeklyReport) -> list[list[str]]:
    rows = [["time", "run", "node", "method", "detected s", "excluded s", "resubmitted s", "allocated s",
             "training again s", "resumed at step", "steps lost", "outcome"]]

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    for d in report.drills:
        rows.append([_day(d.ts), d.run_id, d.node, d.method, s(d.detect_s), s(d.excluded_s), s(d.resubmit_s),
                     s(d.allocation_s), s(d.training_s), "-" if d.resume_step is None else str(d.resume_step),
                     "-" if d.steps_lost is None else str(d.steps_lost), d.outcome])
    return rows


def training_rows(report: WeeklyReport) -> list[list[str]]:
    rows = [["run", "MFU", "tokens/s", "queue h per attempt", "recoveries", "recoveries per day"]]
    for t in report.training:
        rows.append([t.run_id, pct(t.mfu), "n/a" if t.tokens_per_s is None else f"{t.tokens_per_s:,.0f}",
                     hours(t.queue_s_per_attempt), str(t.recoveries),
                     "n/a" if t.recoveries_per_day is None else f"{t.recoveries_per_day:.2f}"])
    return rows


def finding_rows(report: WeeklyReport) -> list[list[str]]:
    rows = [["time", "run", "finding", "host", "step", "evidence"]]
    for f in report.training_findings:
        rows.append([_day(f.ts), f.run_id, f.kind, f.host or "-", "-" if f.step is None else str(f.step),
                     f.evidence[:100]])
    return rows


def spare_lines(report: WeeklyReport) -> list[str]:
    """The spares' cost beside the time they saved (docs/design/spares.md, "How many spares" and "Cost")."""
    sp = report.spares
    if sp is None:
        return []
    gpu, total = _gpu_hours(sp.pool_gpu_hours), _gpu_hours(sp.cost_gpu_hours)
    lines = [f"Pool {part}: {nh:.1f} idle node-hours" for part, nh in sp.pool_node_hours.items()]
    lines += [
        f"Cost in idle GPU-hours: {total} (pools {gpu}, inside allocations "
        f"{sp.in_allocation_gpu_hours:.1f})",
        f"Used: {sp.pool_recoveries} resubmission(s) started in a pool, {sp.relaunches} "
        "in-allocation relaunch(es)",
        f"Saved (queue wait avoided, estimate): {hours(sp.saved_s)} h; baseline: median wait of "
        f"the daemon's plain-queue jobs {hours(sp.baseline_queue_s)} h",
    ]
    return lines + [f"Note: {n}" for n in sp.notes]


def triage_lines(report: WeeklyReport) -> list[str]:
    """Node triage: drains per cause, drain to return (median, p95), verdicts, lemons, node-hours lost."""
    t = report.triage
    if t is None:
        return []
    causes = ", ".join(f"{c} {n}" for c, n in sorted(t.drains_by_cause.items())) or "none"
    outcomes = ", ".join(f"{v} {n}" for v, n in sorted(t.outcomes.items())) or "none"
    return [
        f"Drains per cause: {causes}",
        f"Drain to return: median {_minutes(t.return_median_s)}, p95 {_minutes(t.return_p95_s)} "
        f"({t.returns} returns)",
        f"Triage verdicts: {outcomes}",
        f"Lemon nodes (never returned automatically): {', '.join(t.lemons) or 'none'}",
        f"Node-hours lost in drain: {t.node_hours_lost:.1f}",
    ]


def _minutes(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds / 60:.1f} min"


def title(report: WeeklyReport) -> str:
    w = report.window
    return f"b300 weekly report {w.since:%Y-%m-%d} to {w.until:%Y-%m-%d}"


def summary_lines(report: WeeklyReport) -> list[str]:
    return [
        f"Window: {w_text(report)}",
        f"Cluster ETTR: {pct(report.ettr)} over {len(report.runs)} runs",
        f"Interruptions: {sum(report.by_cause.values())}",
        f"Jobs: {report.jobs}, GPU-hours: {report.gpu_hours:.1f}",
        f"Nodes drained: {len(report.drained)}, returned: {len(report.returned)}",
        f"Drift findings opened: {sum(report.drift_findings.values())}"
        + ("" if report.drift_open is None else f", open now: {report.drift_open}"),
        f"Failure drills: {len(report.drills)}",
    ] + ([] if report.spares is None else [
        f"Spares: {_gpu_hours(report.spares.cost_gpu_hours)} idle GPU-hours, saved "
        f"{hours(report.spares.saved_s)} h of queue wait"])


def _gpu_hours(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.1f}"


def w_text(report: WeeklyReport) -> str:
    w = report.window
    return f"{w.since.isoformat()} to {w.until.isoformat()} (until excluded)"


def render_text(report: WeeklyReport) -> str:
    out = [title(report), "=" * len(title(report)), "", *summary_lines(report), ""]
    out += ["Effective training time ratio per run (hours)", _table(ettr_rows(report)), ""]
    for r in report.runs:
        out += [f"  {r.run_id}: {n}" for n in r.notes]
    out += ["", "Training: MFU, tokens/s, queue time, recovery frequency", _table(training_rows(report))]
    out += ["", "Loss spikes and stragglers"]
    out += [_table(finding_rows(report)) if report.training_findings else "  none"]
    out += ["", "Interruptions by cause", _table(cause_rows(report)), ""]
    if report.interruptions:
        out.append(_table([["ended", "run", "attempt", "job", "outcome", "cause"]] + [
            [_day(i.ended), i.run_id, str(i.attempt), str(i.job_id or "-"), i.outcome, i.cause]
            for i in report.interruptions]))
        out.append("")
    out += ["Nodes drained and returned"]
    out += [_table(node_rows(report)) if report.drained or report.returned else "  none", ""]
    out += ["Drift findings opened (by probe)"]
    out += [f"  {p}: {n}" for p, n in sorted(report.drift_findings.items())] or ["  none"]
    out += ["", "Failure drills (b300ctl drill; seconds from the node pulled)"]
    out += [_table(drill_rows(report)) if report.drills else "  none"]
    if report.triage is not None:
        out += ["", "Node triage"]
        out += [f"  {line}" for line in triage_lines(report)]
    if report.spares is not None:
        out += ["", "Spare capacity: cost and time saved"]
        out += [f"  {line}" for line in spare_lines(report)]
    out += ["", "Checkpoints (running runs)"]
    if report.checkpoints is None:
        out.append("  not available")
    else:
        out.append(_table(checkpoint_rows(report)) if report.checkpoints else "  no running run checkpoints")
        out += [f"  {c.run_id}: {c.young_daly}" for c in report.checkpoints or () if c.young_daly]
    out += ["", *[f"Note: {n}" for n in report.notes], f"Generated {report.generated_at.isoformat()}"]
    return "\n".join(out).rstrip() + "\n"


def charts(report: WeeklyReport) -> dict[str, bytes]:
    """PNG charts by name: ``ettr`` (time of each run by bucket), ``causes``."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a login node
    from matplotlib.figure import Figure

    out: dict[str, bytes] = {}
    fig = Figure(figsize=(8, 1.6 + 0.45 * max(1, len(report.runs))), dpi=100)
    ax = fig.add_subplot()
    buckets = [("training", "training_s", "#2e7d32"), ("detect", "detect_s", "#c62828"),
               ("queue", "queue_s", "#ef6c00"), ("restart", "restart_s", "#6a1b9a"),
               ("recompute", "recompute_s", "#1565c0"), ("other", "other_s", "#9e9e9e")]
    names = [r.run_id for r in report.runs] or ["(no runs)"]
    left = [0.0] * len(names)
    for label, attr, color in buckets:
        values = [(getattr(r, attr) or 0.0) / 3600 for r in report.runs] or [0.0]
        ax.barh(names, values, left=left, label=label, color=color)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("hours in the window")
    ax.set_title("Where each run's time went")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 / fig.get_figheight() * 3), fontsize=8,
              ncols=len(buckets), frameon=False)
    fig.tight_layout()
    out["ettr"] = _png(fig)
    fig = Figure(figsize=(8, 3.2), dpi=100)
    ax = fig.add_subplot()
    ax.bar(list(CAUSES), [report.by_cause[c] for c in CAUSES], color="#37474f")
    ax.set_ylabel("interruptions")
    ax.set_title("Interruptions by cause")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    out["causes"] = _png(fig)
    return out


def _png(fig: object) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")  # type: ignore[attr-defined]
    return buf.getvalue()


def _html_table(rows: list[list[str]]) -> str:
    td = 'style="border:1px solid #ccc;padding:3px 8px;text-align:left"'
    head = "".join(f'<th {td} bgcolor="#eeeeee">{html.escape(c)}</th>' for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td {td}>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f'<table style="border-collapse:collapse;font-size:13px"><tr>{head}</tr>{body}</table>'


def render_html(report: WeeklyReport, pngs: dict[str, bytes], image_src: ImageSrc) -> str:
    e = html.escape
    parts = [f'<html><head><meta charset="utf-8"><title>{e(title(report))}</title></head>',
             '<body style="font-family:Arial,Helvetica,sans-serif;color:#222;max-width:1100px">',
             f"<h1 style=\"font-size:20px\">{e(title(report))}</h1><ul>"]
    parts += [f"<li>{e(line)}</li>" for line in summary_lines(report)]
    parts.append("</ul><h2 style=\"font-size:16px\">Effective training time ratio</h2>")
    if "ettr" in pngs:
        parts.append(f'<img alt="time of each run" src="{image_src("ettr", pngs["ettr"])}" width="800">')
    parts.append(_html_table(ettr_rows(report)))
    notes = [f"{r.run_id}: {n}" for r in report.runs for n in r.notes]
    if notes:
        parts.append("<ul>" + "".join(f"<li><i>{e(n)}</i></li>" for n in notes) + "</ul>")
    parts.append("<h2 style=\"font-size:16px\">Training: MFU, tokens/s, queue time, recovery frequency</h2>")
    parts.append(_html_table(training_rows(report)))
    parts.append("<h2 style=\"font-size:16px\">Loss spikes and stragglers</h2>")
    parts.append(_html_table(finding_rows(report)) if report.training_findings else "<p>none</p>")
    parts.append("<h2 style=\"font-size:16px\">Interruptions by cause</h2>")
    if "causes" in pngs:
        parts.append(f'<img alt="interruptions by cause" src="{image_src("causes", pngs["causes"])}" '
                     'width="800">')
    parts.append(_html_table(cause_rows(report)))
    parts.append("<h2 style=\"font-size:16px\">Nodes drained and returned</h2>")
    parts.append(_html_table(node_rows(report)) if report.drained or report.returned else "<p>none</p>")
    parts.append("<h2 style=\"font-size:16px\">Drift findings opened</h2>")
    parts.append(_html_table([["probe", "findings"]] + [[p, str(n)] for p, n in
                                                         sorted(report.drift_findings.items())])
                 if report.drift_findings else "<p>none</p>")
    parts.append("<h2 style=\"font-size:16px\">Failure drills</h2>")
    parts.append(_html_table(drill_rows(report)) if report.drills else "<p>none</p>")
    if report.triage is not None:
        parts.append("<h2 style=\"font-size:16px\">Node triage</h2><ul>")
        parts += [f"<li>{e(line)}</li>" for line in triage_lines(report)]
        parts.append("</ul>")
    if report.spares is not None:
        parts.append("<h2 style=\"font-size:16px\">Spare capacity: cost and time saved</h2><ul>")
        parts += [f"<li>{e(line)}</li>" for line in spare_lines(report)]
        parts.append("</ul>")
    parts.append("<h2 style=\"font-size:16px\">Checkpoints (running runs)</h2>")
    if report.checkpoints is None:
        parts.append("<p>not available</p>")
    else:
        parts.append(_html_table(checkpoint_rows(report)) if report.checkpoints
                     else "<p>no running run checkpoints</p>")
        parts += [f"<p>{e(c.run_id)}: {e(c.young_daly)}</p>" for c in report.checkpoints or () if c.young_daly]
    parts += [f"<p><i>Note: {e(n)}</i></p>" for n in report.notes]
    parts.append(f'<p style="color:#777;font-size:11px">Generated {e(report.generated_at.isoformat())} '
                 "by b300d</p></body></html>")
    return "\n".join(parts)
