"""Prometheus metrics (``[metrics] listen``) for the platform team's Grafana.

Three parts, from pure to I/O:

- :func:`collect_metrics` reads a :class:`MetricsSnapshot` from the store (a handful of
  small queries; a store error gives ``b300_store_up 0``, never an error page);
- :func:`metric_families` turns a snapshot into prometheus_client metric families (pure);
  :class:`SnapshotCollector` does that for every scrape, on a registry of its own
  (:func:`metrics_registry`: never prometheus_client's global default registry);
- :class:`MetricsServer` serves prometheus_client's WSGI app, which writes the exposition
  format (text 0.0.4, or OpenMetrics when the scraper asks for it), on the configured
  address (127.0.0.1 by default), in a daemon thread that :meth:`MetricsServer.stop` ends.

Only ``GET /metrics`` is served: prometheus_client's own app answers every path with the
metrics (and OPTIONS, and ``/favicon.ico``); here any other path is 404 and any other
method 405, so a mistyped scrape target fails loudly instead of working by accident.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from socketserver import BaseRequestHandler
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import structlog
from prometheus_client.exposition import ThreadingWSGIServer, generate_latest, make_wsgi_app
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..checkpoints.advice import RunSchedule, stored_run_schedule
from ..checkpoints.cadence import HISTORY, FailureIndex
from ..errors import B300Error
from ..events import TRAINING_FINDINGS, Kind
from ..interfaces import Store
from ..model import Run, RunState
from ..payloads import SparesPool, TriageVerdict
from ..report.compute import RunInput, checkpoint_figures
from ..spares.pool import latest_pools
from ..spec import JobSpec, parse_spec
from ..triage.figures import lemon_nodes
from .health import CycleSnapshot

if TYPE_CHECKING:
    from ..training.health_step import RunFigures

log = structlog.get_logger(__name__)
PATH = "/metrics"


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What one scrape exports; built by :func:`collect_metrics` (and the daemon's counters)."""

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
    # Training health (b300.training.health_step): the running attempts' figures, by run, and
    # the findings recorded per (run, event kind).
    training: dict[str, RunFigures] = field(default_factory=dict)
    training_findings: dict[tuple[str, str], int] = field(default_factory=dict)
    step_relaunches_total: int = 0   # in-allocation restarts (spare_nodes)
    spare_pool_nodes: dict[str, int] = field(default_factory=dict)  # [spares]: idle nodes per partition
    triage_verdicts: dict[str, int] = field(default_factory=dict)   # [triage]: verdicts so far, by verdict
    lemon_nodes: tuple[str, ...] = ()                                # [triage]: nodes never returned


#: The per-run schedule gauges: (key in ``checkpoint_schedule``, metric name, HELP).
_SCHEDULE_GAUGES = (
    ("interval_s", "b300_checkpoint_interval_seconds", "the spec's checkpoint interval per run"),
    ("overdue", "b300_checkpoint_overdue", "1 while the run's newest checkpoint is older than its interval"),
    ("young_daly_s", "b300_checkpoint_young_daly_seconds",
     "Young/Daly interval sqrt(2 * save time * MTBF) per run (absent until both are known)"),
    ("save_s", "b300_checkpoint_save_seconds",
     "median save time of the run's newest checkpoints (first file to last), a Young/Daly input"),
    ("mtbf_s", "b300_checkpoint_mtbf_seconds",
     "time between infrastructure failures for the run's node count, a Young/Daly input"),
)


def _gauge(name: str, help: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help, value=value)


def _counter(name: str, help: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help, value=value)


def _per_run(name: str, help: str, values: Iterable[tuple[str, float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help, labels=["run"])
    for run, value in values:
        family.add_metric([run], value)
    return family


def metric_families(m: MetricsSnapshot) -> list[Metric]:
    """Every metric family of a snapshot, in a fixed order (pure).

    Per-run families are exported even without samples (HELP and TYPE only), so a
    dashboard finds every name; ``b300_drift_findings_open`` only with a ``[drift]``
    section, the cycle duration and timestamp only after a first cycle.
    """
    out: list[Metric] = [
        _gauge("b300_daemon_up", "1 while b300d runs (this endpoint answers)", 1),
        _gauge("b300_store_up", "1 if the state store answered this scrape", int(m.store_up)),
    ]
    runs = GaugeMetricFamily("b300_runs", "runs by state", labels=["state"])
    for state in RunState:
        runs.add_metric([state.value], m.runs_by_state.get(state.value, 0))
    out += [runs,
            _counter("b300_recoveries_total", "automatic resubmissions by recovery", m.recoveries_total),
            _counter("b300_step_relaunches_total", "training steps relaunched on a spare node in the "
                     "same job (spare_nodes)", m.step_relaunches_total),
            _gauge("b300_nodes_drained", "nodes in a DRAIN state as last seen", m.nodes_drained)]
    if m.spare_pool_nodes:
        pool = GaugeMetricFamily("b300_spare_pool_nodes", "idle healthy nodes in the daemon's spare "
                                 "pool (reservation) per partition", labels=["partition"])
        for partition, count in sorted(m.spare_pool_nodes.items()):
            pool.add_metric([partition], count)
        out.append(pool)
    if m.triage_verdicts:
        verdicts = CounterMetricFamily("b300_triage_verdicts", "node triage verdicts (pass, fail, lemon)",
                                       labels=["verdict"])
        for verdict, count in sorted(m.triage_verdicts.items()):
            verdicts.add_metric([verdict], count)
        lemons = GaugeMetricFamily("b300_lemon_node", "1 for a node triage keeps out as a lemon",
                                   labels=["node"])
        for node in m.lemon_nodes:
            lemons.add_metric([node], 1)
        out += [verdicts, lemons]
    if m.drift_findings_open is not None:
        out.append(_gauge("b300_drift_findings_open", "open version drift findings", m.drift_findings_open))
    out.append(_per_run("b300_checkpoint_newest_age_seconds", "age of the newest complete checkpoint per run",
                        ((r, round(v, 3)) for r, v in sorted(m.checkpoint_age_s.items()))))
    schedules = sorted(m.checkpoint_schedule.items())
    out += [_per_run(name, help, ((r, round(v[key], 3)) for r, v in schedules if key in v))
            for key, name, help in _SCHEDULE_GAUGES]
    out += [
        _per_run("b300_replication_lag_seconds",
                 "age of the oldest checkpoint not yet on every replica target (0: all replicated)",
                 ((r, round(v, 3)) for r, v in sorted(m.replication_lag_s.items()))),
        _gauge("b300_accounting_up", "1 if Slurm accounting (sacct/slurmdbd) answered when last asked",
               int(m.accounting_up)),
        _counter("b300_accounting_failures_total", "poll cycles whose accounting query (sacct) failed",
                 m.accounting_failures_total),
    ]
    out += _training_families(m)
    c = m.cycle
    out += [_counter("b300_cycles_total", "poll cycles run", c.cycles_total),
            _counter("b300_cycle_failures_total", "poll cycles that failed", c.failures_total),
            _counter("b300_cycle_overruns_total", "poll cycles that outlived the poll interval",
                     c.overruns_total)]
    if c.last_duration_s is not None:
        out.append(_gauge("b300_cycle_duration_seconds", "wall time of the last poll cycle",
                          round(c.last_duration_s, 6)))
    if c.last_end_unix is not None:
        out.append(_gauge("b300_last_cycle_timestamp", "unix time the last poll cycle ended",
                          round(c.last_end_unix, 3)))
    return out


#: The ``kind`` label values of ``b300_training_findings_total``.
FINDING_COUNTER_KINDS = tuple(k.value.removeprefix("training.")
                              for k in (*TRAINING_FINDINGS, Kind.TRAINING_PROGRESS_PROBLEM))

#: The per-run training gauges: (metric name, HELP, figure of a RunFigures or None).
_TRAINING_GAUGES: tuple[tuple[str, str, Callable[[RunFigures], float | None]], ...] = (
    ("b300_training_step", "newest training step the running attempt reported",
     lambda f: f.snapshot.step),
    ("b300_training_loss", "newest training loss the running attempt reported", lambda f: f.snapshot.loss),
    ("b300_training_tokens_per_second", "tokens trained per second over [training] rate_window",
     lambda f: f.snapshot.tokens_per_s),
    ("b300_training_samples_per_second", "samples trained per second over [training] rate_window",
     lambda f: f.snapshot.samples_per_s),
    ("b300_training_mfu", "model FLOPs utilisation, 6*N*tokens/s / (GPUs * [training.peak] per_gpu)",
     lambda f: f.snapshot.mfu),
    ("b300_training_seconds_per_step", "wall time per step between the two newest steps reported",
     lambda f: f.seconds_per_step),
    ("b300_training_stragglers", "hosts of the running attempt that are stragglers now",
     lambda f: len(f.snapshot.stragglers)),
    ("b300_training_checkpoint_saves_open", "checkpoint saves begun and not yet ended",
     lambda f: f.snapshot.open_checkpoints),
)


def _training_families(m: MetricsSnapshot) -> list[Metric]:
    runs = sorted(m.training.items())
    out: list[Metric] = []
    for name, help, get in _TRAINING_GAUGES:
        values = ((r, get(f)) for r, f in runs)
        out.append(_per_run(name, help, ((r, float(v)) for r, v in values if v is not None)))
    host_time = GaugeMetricFamily("b300_training_host_step_time_seconds",
                                  "a host's own step time (step_time_s), newest reported",
                                  labels=["run", "host"])
    straggler = GaugeMetricFamily("b300_training_straggler", "1 for a host that is a straggler now",
                                  labels=["run", "host"])
    for run, f in runs:
        for host, value in sorted(f.host_step_time_s.items()):
            host_time.add_metric([run, host], value)
        for host in sorted(f.snapshot.stragglers):
            straggler.add_metric([run, host], 1)
    findings = CounterMetricFamily("b300_training_findings_total",
                                   "training-health findings recorded (loss spikes, NaN, throughput drops, "
                                   "stragglers, stalled checkpoint writes, progress file problems)",
                                   labels=["run", "kind"])
    counts = dict(m.training_findings)
    # Every kind of a watched run from 0, so that the first finding is an increase (a series
    # that appears at 1 is no increase to Prometheus' increase()/rate()).
    for run in m.training:
        for kind in FINDING_COUNTER_KINDS:
            counts.setdefault((run, kind), 0)
    for (run, kind), count in sorted(counts.items()):
        findings.add_metric([run, kind], count)
    return [*out, host_time, straggler, findings]


#: A snapshot with every optional family present: what :meth:`SnapshotCollector.describe` names.
_EVERY_FAMILY = MetricsSnapshot(cycle=CycleSnapshot(0, 0, 0.0, 0.0, None), drift_findings_open=0,
                                spare_pool_nodes={"-": 0}, triage_verdicts={"-": 0})


class SnapshotCollector(Collector):
    """A prometheus_client collector that takes a fresh snapshot on every scrape."""

    def __init__(self, snapshot: Callable[[], MetricsSnapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        """Every family this collector can export, without reading the store: the registry
        learns the names from it (a scrape's ``?name[]=`` filter, duplicate checks)."""
        yield from metric_families(_EVERY_FAMILY)

    def collect(self) -> Iterator[Metric]:
        yield from metric_families(self._snapshot())


def metrics_registry(snapshot: Callable[[], MetricsSnapshot]) -> CollectorRegistry:
    """A registry of its own holding only :class:`SnapshotCollector` (no process or GC
    metrics, no global state); ``snapshot`` is called once per scrape, not at registration."""
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(snapshot))
    return registry


def render_metrics(m: MetricsSnapshot) -> str:
    """The Prometheus text exposition format (0.0.4) of one snapshot, as a scrape gets it."""
    return generate_latest(metrics_registry(lambda: m)).decode()


def collect_metrics(store: Store, cycle: CycleSnapshot, now: datetime) -> MetricsSnapshot:
    """Read a snapshot from the store; a store error gives ``store_up`` 0, not an error page."""
    try:
        runs = store.list_runs()
        by_state: dict[str, int] = {}
        for r in runs:
            by_state[r.state.value] = by_state.get(r.state.value, 0) + 1
        # One grouped count for the three event counters (no event is read).
        finding_kinds = {*TRAINING_FINDINGS, Kind.TRAINING_PROGRESS_PROBLEM}
        counts = store.event_counts([Kind.RECOVERY_RESUBMIT, Kind.ATTEMPT_STEP_RELAUNCH, *finding_kinds])
        recoveries = sum(n for (_, kind), n in counts.items() if kind == Kind.RECOVERY_RESUBMIT)
        relaunched = sum(n for (_, kind), n in counts.items() if kind == Kind.ATTEMPT_STEP_RELAUNCH)
        findings: dict[tuple[str, str], int] = {}
        for (run_id, kind), n in counts.items():
            if kind in finding_kinds:
                key = (run_id or "", kind.removeprefix("training."))
                findings[key] = findings.get(key, 0) + n
        pools = {str((p := SparesPool.of(e)).partition): len(p.idle)
                 for e in latest_pools(store.events(kinds=[Kind.SPARES_POOL]))}
        drained = sum("DRAIN" in n.state.upper() for n in store.list_nodes())
        verdict_events = store.events(kinds=[Kind.TRIAGE_VERDICT])
        verdicts: dict[str, int] = {}
        for e in verdict_events:
            v = str(TriageVerdict.of(e).verdict)
            verdicts[v] = verdicts.get(v, 0) + 1
        ages: dict[str, float] = {}
        lags: dict[str, float] = {}
        schedules: dict[str, dict[str, float]] = {}
        drift_open: int | None = len(store.drift.open_findings())
        ckpts = store.checkpoints
        history = store.attempts_since(now - HISTORY)
        failures = FailureIndex(history, now)  # one pass over the cluster's history for every run
        watched: list[tuple[Run, JobSpec]] = []
        for run in runs:
            if run.state.is_terminal:
                continue
            try:
                spec = parse_spec(run.spec_toml, where=f"run {run.id}")
            except B300Error:
                continue
            if spec.checkpoint.dir:
                watched.append((run, spec))
        # Each read once for all watched runs (a few queries, not a few per run); the
        # figures and the schedule both use the listing.
        listings = ckpts.checkpoints_of([run.id for run, _ in watched])
        attempts = store.attempts_of([run.id for run, _ in watched])
        for run, spec in watched:
            listing = listings[run.id]
            stored = [(c.info.step, c.info.mtime, c.info.size_bytes, c.replicated_to, frozenset(c.replicas))
                      for c in listing if c.info.complete]
            fig = checkpoint_figures(RunInput(run, (), checkpoint_interval_s=spec.checkpoint.interval_s,
                                              checkpoints=stored), now)
            if fig is not None and fig.newest_age_s is not None:
                ages[run.id] = fig.newest_age_s
            sched = stored_run_schedule(store, run, spec, now, checkpoints=[c.info for c in listing],
                                        history=history, attempts=attempts[run.id],
                                        failures=failures.of(run.id))
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
                           checkpoint_schedule=schedules, training_findings=findings,
                           step_relaunches_total=relaunched, spare_pool_nodes=pools,
                           triage_verdicts=verdicts, lemon_nodes=tuple(lemon_nodes(verdict_events)))


def _schedule_figures(s: RunSchedule) -> dict[str, float]:
    yd = s.young_daly
    out = {"interval_s": s.interval_s, "overdue": float(s.overdue)}
    for key, value in (("young_daly_s", yd.interval_s), ("save_s", yd.save_s), ("mtbf_s", yd.mtbf_s)):
        if value is not None:
            out[key] = value
    return out


_WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _metrics_only(app: _WSGIApp) -> _WSGIApp:
    """``app`` for ``GET /metrics``; 404 elsewhere, 405 for other methods, and 500 (logged
    with its traceback) when taking the snapshot fails in a way the store does not catch."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"only /metrics here\n"]
        if environ.get("REQUEST_METHOD") != "GET":
            start_response("405 Method Not Allowed", [("Allow", "GET"),
                                                      ("Content-Type", "text/plain; charset=utf-8")])
            return [b"only GET /metrics\n"]
        try:
            return app(environ, start_response)
        except Exception:  # a scrape must never take the daemon down
            log.exception("metrics.crashed")
            start_response("500 Internal Server Error", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"metrics failed; see the b300d log\n"]

    return guarded


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics.request", line=format % args)


class _Server(ThreadingWSGIServer):
    """prometheus_client's threading WSGI server, on the address family of the host
    (``::1`` works as well as ``127.0.0.1``)."""

    def __init__(self, address: tuple[str, int], handler: type[BaseRequestHandler]) -> None:
        infos = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        self.address_family = infos[0][0]
        super().__init__(address, handler)


class MetricsServer:
    """Serves ``GET /metrics`` from ``snapshot()`` (called once per scrape) in a daemon thread.

    Binds in the constructor (an ``OSError`` when the address is taken or unknown), so
    ``address`` is the real one (port 0: any free port); :meth:`start` serves,
    :meth:`stop` stops serving and closes the socket.
    """

    def __init__(self, host: str, port: int, snapshot: Callable[[], MetricsSnapshot]) -> None:
        app = _metrics_only(make_wsgi_app(metrics_registry(snapshot)))
        self._server = make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler)
        bound = self._server.server_address
        self.address = (str(bound[0]), int(bound[1]))
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()
