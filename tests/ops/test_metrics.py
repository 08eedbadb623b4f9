"""The metrics endpoint: names, types, labels and HELP as the dashboards know them,
prometheus_client's exposition from a real store, and the HTTP server on loopback
(``GET /metrics`` only, a store error as ``b300_store_up 0``, a crash as a 500)."""

from __future__ import annotations

import http.client
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from b300.model import RunState
from b300.ops.health import CycleSnapshot
from b300.ops.metrics import MetricsServer, MetricsSnapshot, collect_metrics, render_metrics
from b300.store import SqlStore, open_store
from b300.training.detectors import TrainingSnapshot
from b300.training.health_step import RunFigures

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
CYCLE = CycleSnapshot(7, 1, 0.25, 1764590400.5, None, 2)

#: The contract with the dashboards: every family's type, label names and HELP text.
FAMILIES = {
    "b300_daemon_up": ("gauge", (), "1 while b300d runs (this endpoint answers)"),
    "b300_store_up": ("gauge", (), "1 if the state store answered this scrape"),
    "b300_runs": ("gauge", ("state",), "runs by state"),
    "b300_recoveries": ("counter", (), "automatic resubmissions by recovery"),
    "b300_step_relaunches": ("counter", (), "training steps relaunched on a spare node in the "
                             "same job (spare_nodes)"),
    "b300_nodes_drained": ("gauge", (), "nodes in a DRAIN state as last seen"),
    "b300_drift_findings_open": ("gauge", (), "open version drift findings"),
    "b300_checkpoint_newest_age_seconds": ("gauge", ("run",), "age of the newest complete checkpoint per run"),
    "b300_checkpoint_interval_seconds": ("gauge", ("run",), "the spec's checkpoint interval per run"),
    "b300_checkpoint_overdue": ("gauge", ("run",),
                                "1 while the run's newest checkpoint is older than its interval"),
    "b300_checkpoint_young_daly_seconds": (
        "gauge", ("run",),
        "Young/Daly interval sqrt(2 * save time * MTBF) per run (absent until both are known)"),
    "b300_checkpoint_save_seconds": (
        "gauge", ("run",),
        "median save time of the run's newest checkpoints (first file to last), a Young/Daly input"),
    "b300_checkpoint_mtbf_seconds": (
        "gauge", ("run",), "time between infrastructure failures for the run's node count, a Young/Daly input"),
    "b300_replication_lag_seconds": (
        "gauge", ("run",), "age of the oldest checkpoint not yet on every replica target (0: all replicated)"),
    "b300_accounting_up": ("gauge", (), "1 if Slurm accounting (sacct/slurmdbd) answered when last asked"),
    "b300_accounting_failures": ("counter", (), "poll cycles whose accounting query (sacct) failed"),
    "b300_cycles": ("counter", (), "poll cycles run"),
    "b300_cycle_failures": ("counter", (), "poll cycles that failed"),
    "b300_cycle_overruns": ("counter", (), "poll cycles that outlived the poll interval"),
    "b300_cycle_duration_seconds": ("gauge", (), "wall time of the last poll cycle"),
    "b300_last_cycle_timestamp": ("gauge", (), "unix time the last poll cycle ended"),
    # training health (issue 17, b300.training.health_step)
    "b300_training_step": ("gauge", ("run",), "newest training step the running attempt reported"),
    "b300_training_loss": ("gauge", ("run",), "newest training loss the running attempt reported"),
    "b300_training_tokens_per_second": ("gauge", ("run",),
                                        "tokens trained per second over [training] rate_window"),
    "b300_training_samples_per_second": ("gauge", ("run",),
                                         "samples trained per second over [training] rate_window"),
    "b300_training_mfu": ("gauge", ("run",),
                          "model FLOPs utilisation, 6*N*tokens/s / (GPUs * [training.peak] per_gpu)"),
    "b300_training_seconds_per_step": ("gauge", ("run",),
                                       "wall time per step between the two newest steps reported"),
    "b300_training_stragglers": ("gauge", ("run",), "hosts of the running attempt that are stragglers now"),
    "b300_training_checkpoint_saves_open": ("gauge", ("run",), "checkpoint saves begun and not yet ended"),
    "b300_training_host_step_time_seconds": ("gauge", ("host", "run"),
                                             "a host's own step time (step_time_s), newest reported"),
    "b300_training_straggler": ("gauge", ("host", "run"), "1 for a host that is a straggler now"),
    "b300_training_findings": ("counter", ("kind", "run"),
                               "training-health findings recorded (loss spikes, NaN, throughput drops, "
                               "stragglers, stalled checkpoint writes, progress file problems)"),
}

TRAINING = RunFigures("r1", 2, TrainingSnapshot(
    step=120, last_record_time=1764590400.0, loss=2.5, tokens_per_s=4.0e5, samples_per_s=100.0,
    steps_per_s=None, mfu=0.41, stragglers=frozenset({"gpu02"}), open_checkpoints=1, exit_intent=None),
    seconds_per_step=0.9, host_step_time_s={"gpu01": 0.8, "gpu02": 1.4})

FULL = MetricsSnapshot(
    cycle=CYCLE, runs_by_state={"RUNNING": 2, "FAILED": 1}, recoveries_total=3, nodes_drained=1,
    drift_findings_open=4, checkpoint_age_s={"r1": 61.23456, 'odd"run\\x': 5.0},
    replication_lag_s={"r1": 0.0},
    checkpoint_schedule={"r1": {"interval_s": 1800.0, "overdue": 1.0, "young_daly_s": 2545.6,
                                "save_s": 45.0, "mtbf_s": 28800.0}},
    accounting_up=False, accounting_failures_total=5,
    training={"r1": TRAINING}, training_findings={("r1", "straggler"): 1, ("r1", "loss_spike"): 2})

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def _samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):  # raises on malformed exposition text
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_every_family_keeps_its_name_type_labels_and_help() -> None:
    text = render_metrics(FULL)
    seen = {}
    for family in text_string_to_metric_families(text):
        labels = {tuple(sorted(s.labels)) for s in family.samples}
        assert len(labels) == 1, (family.name, labels)
        seen[family.name] = (family.type, labels.pop(), family.documentation)
    assert seen == FAMILIES
    # Counters keep their _total names in the text format, as before prometheus_client.
    for name in ("b300_recoveries_total", "b300_cycles_total", "b300_cycle_overruns_total",
                 "b300_accounting_failures_total", "b300_cycle_failures_total"):
        assert f"# TYPE {name} counter\n" in text


def test_values_and_labels_of_a_full_snapshot() -> None:
    m = _samples(render_metrics(FULL))
    assert m["b300_runs"] == {(("state", s.value),): {"RUNNING": 2, "FAILED": 1}.get(s.value, 0)
                              for s in RunState}
    assert m["b300_checkpoint_newest_age_seconds"] == {(("run", "r1"),): 61.235, (("run", 'odd"run\\x'),): 5.0}
    assert m["b300_checkpoint_young_daly_seconds"] == {(("run", "r1"),): 2545.6}
    assert m["b300_checkpoint_overdue"] == {(("run", "r1"),): 1}
    assert m["b300_accounting_up"][()] == 0 and m["b300_accounting_failures_total"][()] == 5
    assert (m["b300_cycles_total"][()], m["b300_cycle_failures_total"][()],
            m["b300_cycle_overruns_total"][()]) == (7, 1, 2)
    assert m["b300_cycle_duration_seconds"][()] == 0.25
    assert m["b300_last_cycle_timestamp"][()] == 1764590400.5
    assert m["b300_training_mfu"] == {(("run", "r1"),): 0.41}
    assert m["b300_training_straggler"] == {(("host", "gpu02"), ("run", "r1")): 1}
    assert m["b300_training_host_step_time_seconds"][(("host", "gpu02"), ("run", "r1"))] == 1.4
    findings = m["b300_training_findings_total"]
    assert findings[(("kind", "loss_spike"), ("run", "r1"))] == 2
    assert findings[(("kind", "straggler"), ("run", "r1"))] == 1
    # Every other kind of a watched run from 0 (so that Prometheus sees the first one increase).
    assert findings[(("kind", "checkpoint_stalled"), ("run", "r1"))] == 0 and len(findings) == 6


def test_families_without_a_value_yet() -> None:
    """No [drift]: no drift family; before a first cycle: no duration or timestamp; per-run
    families are there without samples (a dashboard still finds the name)."""
    text = render_metrics(MetricsSnapshot(cycle=CycleSnapshot(0, 0, None, None, None)))
    names = {f.name for f in text_string_to_metric_families(text)}
    assert names == set(FAMILIES) - {"b300_drift_findings_open", "b300_cycle_duration_seconds",
                                     "b300_last_cycle_timestamp"}
    assert "# TYPE b300_replication_lag_seconds gauge\n" in text
    assert "b300_replication_lag_seconds{" not in text


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[tuple[SqlStore, Path]]:
    path = tmp_path / "state.db"
    store = open_store(f"sqlite:///{path}")
    yield store, path
    store.close()


def test_a_store_error_is_store_up_0_not_an_error(sqlite_store: tuple[SqlStore, Path]) -> None:
    store, path = sqlite_store
    store.create_run("r1", "one", 'name = "one"\n[job]\ncommand = "true"\n', NOW - timedelta(hours=1))
    up = _samples(render_metrics(collect_metrics(store, CYCLE, NOW)))
    assert up["b300_store_up"][()] == 1 and up["b300_runs"][(("state", "SUBMITTING"),)] == 1
    with sqlite3.connect(path) as db:  # the store breaks under the daemon
        db.execute("ALTER TABLE run RENAME TO run_gone")
    with capture_logs() as logs:
        down = _samples(render_metrics(collect_metrics(store, CYCLE, NOW)))
    assert down["b300_store_up"][()] == 0
    assert down["b300_daemon_up"][()] == 1 and down["b300_cycles_total"][()] == 7
    assert all(v == 0 for v in down["b300_runs"].values())
    [failed] = [e for e in logs if e["event"] == "metrics.store_failed"]
    assert "no such table: run" in failed["error"]


def _request(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[
        int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


class Served:
    """A metrics server on a free loopback port; a test appends what the next scrapes get."""

    def __init__(self, port: int, answers: list[MetricsSnapshot | Exception],
                 calls: list[MetricsSnapshot | Exception]) -> None:
        self.port, self.answers, self.calls = port, answers, calls


@pytest.fixture(scope="module")
def _server() -> Iterator[Served]:
    """One server for the module's HTTP tests (a stop waits up to 0.5 s for its thread)."""
    answers: list[MetricsSnapshot | Exception] = []
    calls: list[MetricsSnapshot | Exception] = []

    def snapshot() -> MetricsSnapshot:
        answer = answers[-1]
        calls.append(answer)
        if isinstance(answer, Exception):
            raise answer
        return answer

    server = MetricsServer("127.0.0.1", 0, snapshot)
    assert calls == []  # building the server takes no snapshot
    server.start()
    try:
        yield Served(server.address[1], answers, calls)
    finally:
        server.stop()


@pytest.fixture
def served(_server: Served) -> Served:
    _server.answers[:] = [FULL]
    _server.calls.clear()
    return _server


def test_get_metrics_is_the_text_format(served: Served) -> None:
    port = served.port
    status, headers, body = _request(port, "GET", "/metrics")
    assert served.calls == [FULL]  # one snapshot per scrape
    assert status == 200 and headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert _samples(body) == _samples(render_metrics(FULL))
    # A query string does not change the path (prometheus_client filters by name[]).
    status, _, body = _request(port, "GET", "/metrics?name[]=b300_store_up")
    assert status == 200 and set(_samples(body)) == {"b300_store_up"}


def test_openmetrics_when_the_scraper_asks_for_it(served: Served) -> None:
    status, headers, body = _request(served.port, "GET", "/metrics",
                                     {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert body.endswith("# EOF\n") and "b300_recoveries_total 3.0" in body


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/", 404), ("GET", "/metricsx", 404), ("GET", "/metrics/", 404), ("GET", "/favicon.ico", 404),
    ("POST", "/metrics", 405), ("PUT", "/metrics", 405), ("HEAD", "/metrics", 405),
    ("OPTIONS", "/metrics", 405), ("DELETE", "/", 404),
])
def test_only_get_metrics_is_served(served: Served,
                                    method: str, path: str, status: int) -> None:
    got, headers, body = _request(served.port, method, path)
    assert got == status
    assert served.calls == []  # the store is not read for a request that is refused
    assert "b300_" not in body
    if status == 405:
        assert headers["allow"] == "GET"


def test_a_crashing_snapshot_is_a_500_and_a_logged_traceback(
        served: Served) -> None:
    port, answers = served.port, served.answers
    answers.append(RuntimeError("bug in a collector"))
    with capture_logs() as logs:
        status, _, body = _request(port, "GET", "/metrics")
    assert status == 500 and "b300_" not in body
    [crash] = [e for e in logs if e["event"] == "metrics.crashed"]
    assert crash["log_level"] == "error" and crash["exc_info"] is True
    answers.append(FULL)  # the next scrape works again
    assert _request(port, "GET", "/metrics")[0] == 200


def test_stop_closes_the_port() -> None:
    server = MetricsServer("127.0.0.1", 0, lambda: FULL)
    server.start()
    port = server.address[1]
    assert _request(port, "GET", "/metrics")[0] == 200
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        _request(port, "GET", "/metrics")
    server.stop()  # twice is harmless (the daemon's stop after a failed start)


def test_a_taken_port_is_an_oserror_at_construction() -> None:
    first = MetricsServer("127.0.0.1", 0, lambda: FULL)
    try:
        with pytest.raises(OSError):
            MetricsServer("127.0.0.1", first.address[1], lambda: FULL)
    finally:
        first.stop()


def test_ipv6_loopback() -> None:
    try:
        server = MetricsServer("::1", 0, lambda: FULL)
    except OSError as exc:  # a host without IPv6 cannot run this test
        pytest.skip(f"no IPv6 loopback here: {exc}")
    server.start()
    try:
        conn = http.client.HTTPConnection("::1", server.address[1], timeout=10)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        server.stop()


def test_describe_names_every_family_a_scrape_can_export() -> None:
    """The registry learns names from describe(): a family missing there is unknown to a
    scrape's name filter (the spare pool's was)."""
    from b300.ops.health import CycleSnapshot
    from b300.ops.metrics import MetricsSnapshot, SnapshotCollector, metric_families

    full = MetricsSnapshot(cycle=CycleSnapshot(1, 0, 0.1, 1.0, None), drift_findings_open=0,
                           spare_pool_nodes={"batch": 2})
    described = {m.name for m in SnapshotCollector(lambda: full).describe()}
    assert {m.name for m in metric_families(full)} <= described
