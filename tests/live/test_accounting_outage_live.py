"""Slurm accounting unreachable while a job ends: a real b300d on the live cluster.

The daemon's Slurm config is a copy whose AccountingStoragePort has nobody
listening, so sbatch and squeue work and every sacct fails as it does when
slurmdbd is down; Slurm's tools read the file at each run, so putting the
port back ends the outage. The operator must see it once (a warning, an
event, a metric, a ``b300ctl status`` note), not a debug line per cycle.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import DaemonHandle, make_daemon, wait_for, write_spec

pytestmark = pytest.mark.slurm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def _log_events(handle: DaemonHandle, event: str) -> list[dict[str, object]]:
    out = []
    for line in handle.log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == event:
            out.append(rec)
    return out


@pytest.fixture
def conf_copy(slurm_conf: str, tmp_path: Path) -> Path:
    dst = tmp_path / "etc"
    shutil.copytree(Path(slurm_conf).parent, dst)
    return dst / "slurm.conf"


@pytest.fixture
def daemon_without_accounting(tmp_path: Path, conf_copy: Path) -> Iterator[tuple[DaemonHandle, int, str]]:
    good = conf_copy.read_text()
    conf_copy.write_text(re.sub(r"^AccountingStoragePort=\d+", "AccountingStoragePort=9", good, flags=re.M))
    handle = make_daemon(tmp_path, str(conf_copy), log_level="info")
    port = _free_port()
    handle.config.write_text(handle.config.read_text() + f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    handle.start()
    yield handle, port, good
    handle.cleanup()


def test_accounting_outage_is_reported_once_and_its_end_too(
        daemon_without_accounting: tuple[DaemonHandle, int, str], conf_copy: Path, tmp_path: Path) -> None:
    handle, port, good = daemon_without_accounting
    run_id = handle.submit(write_spec(tmp_path / "spec.toml", "acct-outage", "exit 3"))
    # The job ends; every cycle from then on asks sacct, and every ask fails.
    wait_for(lambda: _scrape(port).get("b300_accounting_failures_total", 0) >= 5, 90,
             "five failed accounting queries")
    assert _scrape(port)["b300_accounting_up"] == 0
    warnings = _log_events(handle, "accounting.unavailable")
    assert len(warnings) == 1 and warnings[0]["level"] == "warning", warnings
    status = handle.ctl_raw("status")
    assert status.returncode == 0
    assert "note: Slurm accounting (sacct/slurmdbd) has not answered since" in status.stdout
    one = handle.ctl_raw("status", run_id)
    assert "note: Slurm accounting" in one.stdout
    assert handle.run(run_id)["attempts"][0]["exit_code"] is None

    conf_copy.write_text(good)
    wait_for(lambda: _scrape(port)["b300_accounting_up"] == 1, 60, "accounting to answer again")
    assert len(_log_events(handle, "accounting.unavailable")) == 1
    assert len(_log_events(handle, "accounting.restored")) == 1
    assert "note: Slurm accounting" not in handle.ctl_raw("status").stdout
    attempt = wait_for(lambda: (a := handle.run(run_id)["attempts"][0])["exit_code"] is not None and a,
                       60, "the exit code from accounting")
    assert (attempt["exit_code"], attempt["signal"]) == (3, 0)
