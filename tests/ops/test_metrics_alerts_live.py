"""/metrics scraped from a real b300d and parsed; alerts delivered to a real SMTP server and
a local webhook within the bound, and not again after a restart."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from prometheus_client.parser import text_string_to_metric_families

from b300.interfaces import NewEvent
from b300.model import Event
from b300.ops.alerts import alerts_for
from b300.store import open_store
from helpers import DaemonHandle, make_daemon, wait_for, write_spec

ALERT_BOUND_S = 60  # "within a minute"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope.content)
        return "250 OK"


@pytest.fixture
def receivers() -> Iterator[tuple[_Inbox, list[dict[str, Any]], int, int]]:
    inbox = _Inbox()
    smtp_port = _free_port()
    smtp = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    posts: list[dict[str, Any]] = []

    class _Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            posts.append({"content_type": self.headers["Content-Type"], **json.loads(body)})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        yield inbox, posts, smtp_port, int(hook.server_address[1])
    finally:
        hook.shutdown()
        hook.server_close()
        smtp.stop()


def _scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):  # raises on malformed exposition text
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@pytest.mark.slurm
def test_metrics_and_alerts(tmp_path: Path, slurm_conf: str,
                            receivers: tuple[_Inbox, list[dict[str, Any]], int, int]) -> None:
    inbox, posts, smtp_port, hook_port = receivers
    metrics_port = _free_port()
    handle: DaemonHandle = make_daemon(tmp_path, slurm_conf)
    handle.config.write_text(handle.config.read_text() + (
        f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n'
        f'[report]\nsmtp_host = "127.0.0.1"\nsmtp_port = {smtp_port}\nstarttls = false\n'
        'from = "b300d@login01.test"\n'
        f'[alerts]\nmail_to = ["oncall@example.test"]\nwebhook_url = "http://127.0.0.1:{hook_port}/hook"\n'
        'drained_burst = 2\nscan_interval = "1s"\n'))
    handle.start()
    try:
        # The control socket answers before the metrics server listens: refused is "not yet".
        m = wait_for(lambda: (s := _scrape(metrics_port)).get("b300_last_cycle_timestamp") and s, 30,
                     "a cycle in the metrics", ignoring=(urllib.error.URLError, ConnectionError))
        assert m["b300_daemon_up"][()] == 1
        assert m["b300_cycle_failures_total"][()] == 0
        assert m["b300_cycle_duration_seconds"][()] >= 0
        assert abs(m["b300_last_cycle_timestamp"][()] - time.time()) < 60
        assert {dict(k)["state"] for k in m["b300_runs"]} >= {"RUNNING", "PENDING", "FAILED", "COMPLETED"}
        assert m["b300_recoveries_total"][()] == 0

        run_id = handle.submit(write_spec(tmp_path / "job.toml", "ops-metrics", "sleep 300"))
        wait_for(lambda: sum(v for k, v in _scrape(metrics_port)["b300_runs"].items()
                             if dict(k)["state"] in ("PENDING", "RUNNING")) == 1, 30, "the run in b300_runs")

        # Events that need a person, recorded as recovery and the drain logic record them.
        t0 = time.monotonic()
        store = open_store(handle.database_url)
        try:
            now = datetime.now(UTC)
            store.append_events([NewEvent("recovery.budget_spent", run_id=run_id,
                                          data={"why": "infrastructure retry budget spent (5 of 5)"})], now)
            store.append_events([NewEvent("node.drained", node="gpu01", data={"reason": "b300: test"}),
                                 NewEvent("node.drained", node="gpu02", data={"reason": "b300: test"})],
                                now + timedelta(seconds=1))
        finally:
            store.close()
        wait_for(lambda: len(posts) >= 2 and len(inbox.messages) >= 2, ALERT_BOUND_S, "alerts delivered")
        assert time.monotonic() - t0 < ALERT_BOUND_S
        kinds = sorted(p["kind"] for p in posts)
        assert kinds == ["nodes.drained_burst", "recovery.budget_spent"]
        assert all(p["content_type"] == "application/json" for p in posts)
        burst = next(p for p in posts if p["kind"] == "nodes.drained_burst")
        assert burst["nodes"] == ["gpu01", "gpu02"]
        assert any(b"[b300 alert] run " + run_id.encode() in msg for msg in inbox.messages)

        # A restart resends nothing.
        handle.kill(15)
        handle.proc = None
        seen = handle.log.stat().st_size
        handle.start()
        # Three scans of the restarted daemon (its debug log says so): nothing may arrive.
        wait_for(lambda: handle.log.read_text()[seen:].count('"alerts.scanned"') >= 3, 30,
                 "three alert scans after the restart")
        assert len(posts) == 2 and len(inbox.messages) == 2
    finally:
        handle.cleanup()


def _ev(i: int, kind: str, minute: float, node: str | None = None) -> Event:
    return Event(i, datetime(2026, 11, 20, tzinfo=UTC) + timedelta(minutes=minute), kind, node=node)


def test_a_drain_burst_alerts_once_when_it_reaches_the_threshold() -> None:
    drains = [_ev(1, "node.drained", 0, "a"), _ev(2, "drift.drained", 4, "b"),
              _ev(3, "node.drained", 9, "c"), _ev(4, "node.drained", 9.5, "d")]
    alerts = alerts_for(drains, [], drained_burst=3)
    assert [(a.event_id, a.nodes) for a in alerts] == [(3, ("a", "b", "c"))]
    # Spread out over more than 10 minutes: no burst.
    spread = [_ev(1, "node.drained", 0, "a"), _ev(2, "node.drained", 11, "b"), _ev(3, "node.drained", 22, "c")]
    assert alerts_for(spread, [], drained_burst=2) == []
    # The earlier drains come from before the scanned range.
    assert [a.event_id for a in alerts_for(drains[2:], drains[:2], drained_burst=3)] == [3]


def test_a_partition_alerts_once_with_its_nodes_and_drains_nothing() -> None:
    start = Event(7, datetime(2026, 11, 20, tzinfo=UTC), "liveness.partition",
                  data={"nodes": ["gpu03", "gpu04"], "checked": 4, "note": "2 of 4 nodes silent"})
    over = Event(8, datetime(2026, 11, 20, 0, 1, tzinfo=UTC), "liveness.partition_over",
                 data={"nodes": ["gpu03", "gpu04"], "checked": 4, "lasted_s": 60.0})
    alerts = alerts_for([start, over], [], drained_burst=3)
    assert [(a.event_id, a.nodes) for a in alerts] == [(7, ("gpu03", "gpu04"))]
    assert "2 of 4 nodes silent at once" in alerts[0].summary and "nothing drained" in alerts[0].summary
