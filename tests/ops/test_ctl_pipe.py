"""b300ctl whose reader leaves early (``b300ctl events | head``): no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from b300.interfaces import NewEvent
from b300.ops.health import CycleHealth
from b300.ops.metrics import MetricsSnapshot, render_metrics
from b300.store import open_store


def test_a_closed_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    url = f"sqlite:///{state}/state.db"
    with open_store(url) as store:
        # Far more than a pipe holds (64 KiB), so b300ctl is still writing when head leaves.
        store.append_events([NewEvent("recovery.waiting", data={"why": f"{i} " + "x" * 100})
                             for i in range(3000)], datetime.now(UTC))
    cfg = tmp_path / "b300.toml"
    cfg.write_text(f"[daemon]\nstate_dir = {json.dumps(str(state))}\n"
                   f"database_url = {json.dumps(url)}\n")
    cfg.chmod(0o600)
    proc = subprocess.Popen([sys.executable, "-m", "b300.cli", "--config", str(cfg), "events",
                             "--limit", "3000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what head does after its lines
    err = proc.stderr.read().decode()
    proc.stderr.close()
    code = proc.wait(60)
    assert b"recovery.waiting" in first
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code == 0


def test_an_overrunning_cycle_is_counted_and_exported() -> None:
    health = CycleHealth()
    health.overran()
    health.overran()
    snap = health.snapshot()
    assert snap.overruns_total == 2
    text = render_metrics(MetricsSnapshot(cycle=snap))
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "b300_cycle_overruns"]
    assert family.type == "counter" and [(s.name, s.value) for s in family.samples] == [
        ("b300_cycle_overruns_total", 2)]
