"""A Prometheus text endpoint (``[metrics] listen``) for the platform team's Grafana.

Every scrape reads the store (a handful of small queries) and the daemon's own
cycle statistics; :func:`render_metrics` is pure, the HTTP server a thin edge.
Only GET /metrics is served, on the configured address (127.0.0.1 by default).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import structlog

from .checkpoints.advice import RunSchedule, stored_run_schedule
from .checkpoints.schedule import HISTORY
from .errors import B300Error
from .events import Kind
from .health import CycleSnapshot
from .interfaces import Store
from .model import RunState
from .report.compute import RunInput, checkpoint_figures
from .spec import parse_spec

log = structlog.get_logger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    cycle: CycleSnapshot
    store_up: bool = True
    runs_by_state: dict[str, int] = field(default_factory=dict)
    recoveries_total: int = 0
    nodes_drained: int = 0
    drift_findings_open: int | None = None
    checkpoint_age_s: dict[str, float] = field(default_factory=dict)
    replication_lag_s: dict[str, float] = field(default_factory=dict)
    accounting_up: bool = True
    accounting_failures_total: int = 0
    # Per run: interval, overdue (0/1), Young/Daly interval and its inputs (save time, MTBF).
    checkpoint_schedule: dict[str, dict[str, float]] = field(default_factory=dict)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(m: MetricsSnapshot) -> str:
    """The Prometheus text exposition format (0.0.4) of a snapshot."""
    out: list[str] = []

    def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{labels} {value:g}" if float(value).is_integer() else f"{name}{labels} {value!r}"
                   for labels, value in samples)

    metric("b300_daemon_up", "gauge", "1 while b300d runs (this endpoint answers)", [("", 1)])
    metric("b300_store_up", "gauge", "1 if the state store answered this scrape", [("", int(m.store_up))])
    metric("b300_runs", "gauge", "runs by state",
           [(f'{{state="{s.value}"}}', m.runs_by_state.get(s.value, 0)) for s in RunState])
    metric("b300_recoveries_total", "counter", "automatic resubmissions by recovery",
           [("", m.recoveries_total)])
    metric("b300_nodes_drained", "gauge", "nodes in a DRAIN state as last seen", [("", m.nodes_drained)])
    if m.drift_findings_open is not None:
        metric("b300_drift_findings_open", "gauge", "open version drift findings",
               [("", m.drift_findings_open)])
    metric("b300_checkpoint_newest_age_seconds", "gauge", "age of the newest complete checkpoint per run",
           [(f'{{run="{_label(r)}"}}', round(v, 3)) for r, v in sorted(m.checkpoint_age_s.items())])
    sched = sorted(m.checkpoint_schedule.items())
    for key, name, help in (
            ("interval_s", "b300_checkpoint_interval_seconds", "the spec's checkpoint interval per run"),
            ("overdue", "b300_checkpoint_overdue",
             "1 while the run's newest checkpoint is older than its interval"),
            ("young_daly_s", "b300_checkpoint_young_daly_seconds",
             "Young/Daly interval sqrt(2 * save time * MTBF) per run (absent until both are known)"),
            ("save_s", "b300_checkpoint_save_seconds",
             "median save time of the run's newest checkpoints (first file to last), a Young/Daly input"),
            ("mtbf_s", "b300_checkpoint_mtbf_seconds",
             "time between infrastructure failures for the run's node count, a Young/Daly input")):
        metric(name, "gauge", help,
               [(f'{{run="{_label(r)}"}}', round(v[key], 3)) for r, v in sched if key in v])
    metric("b300_replication_lag_seconds", "gauge",
           "age of the oldest checkpoint not yet on every replica target (0: all replicated)",
           [(f'{{run="{_label(r)}"}}', round(v, 3)) for r, v in sorted(m.replication_lag_s.items())])
    metric("b300_accounting_up", "gauge",
           "1 if Slurm accounting (sacct/slurmdbd) answered when last asked", [("", int(m.accounting_up))])
    metric("b300_accounting_failures_total", "counter",
           "poll cycles whose accounting query (sacct) failed", [("", m.accounting_failures_total)])
    c = m.cycle
    metric("b300_cycles_total", "counter", "poll cycles run", [("", c.cycles_total)])
    metric("b300_cycle_failures_total", "counter", "poll cycles that failed", [("", c.failures_total)])
    metric("b300_cycle_overruns_total", "counter", "poll cycles that outlived the poll interval",
           [("", c.overruns_total)])
    if c.last_duration_s is not None:
        metric("b300_cycle_duration_seconds", "gauge", "wall time of the last poll cycle",
               [("", round(c.last_duration_s, 6))])
    if c.last_end_unix is not None:
        metric("b300_last_cycle_timestamp", "gauge", "unix time the last poll cycle ended",
               [("", round(c.last_end_unix, 3))])
    return "\n".join(out) + "\n"


def collect_metrics(store: Store, cycle: CycleSnapshot, now: datetime) -> MetricsSnapshot:
    """Read a snapshot from the store; a store error gives ``store_up`` 0, not an error page."""
    try:
        runs = store.list_runs()
        by_state: dict[str, int] = {}
        for r in runs:
            by_state[r.state.value] = by_state.get(r.state.value, 0) + 1
        recoveries = len(store.events(kinds=[Kind.RECOVERY_RESUBMIT]))
        drained = sum("DRAIN" in n.state.upper() for n in store.list_nodes())
        ages: dict[str, float] = {}
        lags: dict[str, float] = {}
        schedules: dict[str, dict[str, float]] = {}
        drift_open: int | None = len(store.drift.open_findings())
        ckpts = store.checkpoints
        history = store.attempts_since(now - HISTORY)
        for run in runs:
            if run.state.is_terminal:
                continue
            try:
                spec = parse_spec(run.spec_toml, where=f"run {run.id}")
            except B300Error:
                continue
            if not spec.checkpoint.dir:
                continue
            stored = [(c.info.step, c.info.mtime, c.info.size_bytes, c.replicated_to, frozenset(c.replicas))
                      for c in ckpts.checkpoints(run.id) if c.info.complete]
            fig = checkpoint_figures(RunInput(run, (), checkpoint_interval_s=spec.checkpoint.interval_s,
                                              checkpoints=stored), now)
            if fig is not None and fig.newest_age_s is not None:
                ages[run.id] = fig.newest_age_s
            sched = stored_run_schedule(store, run, spec, now, history=history)
            if sched is not None:
                if run.id not in ages and sched.age_s is not None:
                    ages[run.id] = sched.age_s  # no checkpoint yet: the running attempt's age
                schedules[run.id] = _schedule_figures(sched)
            if fig is not None and fig.replication_lag_s is not None:
                lags[run.id] = fig.replication_lag_s
    except B300Error as exc:
        log.warning("metrics.store_failed", error=str(exc))
        return MetricsSnapshot(cycle=cycle, store_up=False)
    return MetricsSnapshot(cycle, True, by_state, recoveries, drained, drift_open, ages, lags,
                           checkpoint_schedule=schedules)


def _schedule_figures(s: RunSchedule) -> dict[str, float]:
    yd = s.young_daly
    out = {"interval_s": s.interval_s, "overdue": float(s.overdue)}
    for key, value in (("young_daly_s", yd.interval_s), ("save_s", yd.save_s), ("mtbf_s", yd.mtbf_s)):
        if value is not None:
            out[key] = value
    return out


class MetricsServer:
    """Serves ``GET /metrics`` from ``snapshot()`` in a daemon thread."""

    def __init__(self, host: str, port: int, snapshot: Callable[[], MetricsSnapshot]) -> None:
        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics here")
                    return
                try:
                    body = render_metrics(snapshot()).encode()
                except Exception:  # a scrape must never take the daemon down
                    log.exception("metrics.crashed")
                    self.send_error(500)
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("metrics.request", line=format % args)

        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self.address = self._server.server_address
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
