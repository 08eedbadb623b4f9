"""Outages of the real services: the daemon keeps running, decides nothing from
missing data, and catches up when the service returns."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers import CLUSTER, make_daemon, wait_for, write_spec

pytestmark = pytest.mark.slurm


def _ctld_pid(slurm_conf: str) -> int:
    run_dir = Path(slurm_conf).parent.parent / "run"
    return int((run_dir / "slurmctld.pid").read_text().strip())


def test_slurmctld_outage_is_unknown_not_failure(tmp_path: Path, slurm_conf: str) -> None:
    d = make_daemon(tmp_path, slurm_conf, poll_interval="0.5s", max_backoff="3s")
    d.start()
    try:
        run_id = d.submit(write_spec(tmp_path / "long.toml", "outage", "sleep 20"))
        d.wait_run(run_id, {"RUNNING"}, timeout=60)
        os.kill(_ctld_pid(slurm_conf), signal.SIGTERM)  # slurmctld saves its state and stops
        try:
            wait_for(lambda: "cycle.failed" in d.log.read_text(), 60, "the daemon to notice")
            time.sleep(8)  # several backed-off cycles without the controller
            status = d.run(run_id)
            assert status["run"]["state"] == "RUNNING"
            assert not [e for e in status["events"] if e["kind"].startswith("recovery.")]
            assert d.proc is not None and d.proc.poll() is None
        finally:
            subprocess.run(["bash", str(CLUSTER), "up"], check=True, capture_output=True,
                           timeout=300)
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
        assert status["run"]["state"] == "COMPLETED"
        assert len(status["attempts"]) == 1
        assert "cycle.recovered" in d.log.read_text()
    finally:
        d.cleanup()


def test_store_locked_for_a_while(tmp_path: Path, slurm_conf: str) -> None:
    """Another process holds the SQLite write lock for longer than the busy timeout:
    cycles fail and back off, b300ctl still reads, and tracking resumes after."""
    d = make_daemon(tmp_path, slurm_conf, poll_interval="0.5s", max_backoff="2s")
    d.start()
    try:
        run_id = d.submit(write_spec(tmp_path / "s.toml", "locked", "sleep 4"))
        d.wait_run(run_id, {"RUNNING"}, timeout=60)
        release = threading.Event()

        def hold_lock() -> None:
            conn = sqlite3.connect(str(d.state_dir / "state.db"), timeout=30)
            conn.execute("BEGIN EXCLUSIVE")
            release.wait(25)
            conn.rollback()
            conn.close()

        holder = threading.Thread(target=hold_lock)
        holder.start()
        try:
            wait_for(lambda: "cycle.failed" in d.log.read_text(), 60,
                     "a cycle to fail on the locked store")
        finally:
            release.set()
            holder.join(30)
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
        assert status["run"]["state"] == "COMPLETED" and len(status["attempts"]) == 1
        assert d.proc is not None and d.proc.poll() is None
    finally:
        d.cleanup()
