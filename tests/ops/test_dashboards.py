"""deploy/grafana/ and deploy/prometheus/: the dashboard is valid Grafana JSON, the rules
pass ``promtool check rules`` (when promtool is installed: Debian's ``prometheus``
package), and every b300 metric either of them names is in what a real b300d metrics
server answers on ``GET /metrics``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from b300.ops.health import CycleSnapshot
from b300.ops.metrics import MetricsServer, MetricsSnapshot
from b300.training.detectors import TrainingSnapshot
from b300.training.health_step import RunFigures

REPO = Path(__file__).resolve().parent.parent.parent
DASHBOARD = REPO / "deploy" / "grafana" / "b300-dashboard.json"
RULES = REPO / "deploy" / "prometheus" / "b300-rules.yml"
_METRIC = re.compile(r"\bb300_[a-z0-9_]+\b")


def _served_names() -> set[str]:
    """Sample names a real metrics server exports for a snapshot with every family filled."""
    figures = RunFigures("r1", 1, TrainingSnapshot(
        step=10, last_record_time=1.0, loss=2.0, tokens_per_s=1e5, samples_per_s=None, steps_per_s=None,
        mfu=0.4, stragglers=frozenset({"gpu02"}), open_checkpoints=0, exit_intent=None),
        seconds_per_step=1.0, host_step_time_s={"gpu01": 0.9, "gpu02": 1.5})
    snap = MetricsSnapshot(cycle=CycleSnapshot(3, 0, 0.1, 1764590400.0, None), drift_findings_open=0,
                           checkpoint_age_s={"r1": 5.0}, replication_lag_s={"r1": 0.0},
                           checkpoint_schedule={"r1": {"interval_s": 60.0, "overdue": 0.0,
                                                       "young_daly_s": 30.0, "save_s": 1.0, "mtbf_s": 9.0}},
                           training={"r1": figures}, triage_verdicts={"pass": 1}, lemon_nodes=("gpu03",))
    server = MetricsServer("127.0.0.1", 0, lambda: snap)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.address[1]}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.stop()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def _dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    var = next(v for v in doc["templating"]["list"] if v["name"] == "run")
    return [*exprs, var["definition"]]


def test_the_dashboard_is_grafana_json() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and isinstance(doc["schemaVersion"], int)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 10
    for p in doc["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]) and p["gridPos"]["w"] <= 24, p["title"]
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    cells = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in doc["panels"]}
    assert len(cells) == len(doc["panels"])  # no two panels on top of each other
    assert {v["name"] for v in doc["templating"]["list"]} == {"datasource", "run"}


def test_every_metric_of_the_dashboard_and_the_rules_is_served() -> None:
    served = _served_names()
    used = {m for e in _dashboard_exprs() for m in _METRIC.findall(e)}
    used |= set(_METRIC.findall(RULES.read_text()))
    assert "b300_last_cycle_timestamp" in used  # the dead-man rule's input
    assert used - served == set(), f"not in /metrics: {sorted(used - served)}"
    assert len(used) >= 15


def test_the_rules_have_a_dead_man_rule() -> None:
    text = RULES.read_text()
    assert re.search(r"expr: time\(\) - max\(b300_last_cycle_timestamp\) > \d+", text)
    assert "absent(b300_last_cycle_timestamp)" in text


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed "
                    "(apt-get install prometheus; deploy/install-deps.sh does)")
def test_promtool_accepts_the_rules() -> None:
    proc = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 12 rules found" in proc.stdout
