"""High availability: two real b300d processes on one PostgreSQL, one active.

The second daemon waits on the lease (an advisory lock) as a standby; when the
active one is killed with SIGKILL it takes over within 30 s, adopts the run
and finishes tracking it, and nothing reaches Slurm twice.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from helpers import make_daemon, slurm_cmd, wait_for, write_spec

pytestmark = [pytest.mark.slurm, pytest.mark.postgres]


def _log_has(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text()


def test_standby_takes_over_within_30s(tmp_path: Path, slurm_conf: str, pg_url: str) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_daemon(tmp_path / "a", slurm_conf, database_url=pg_url)
    b = make_daemon(tmp_path / "b", slurm_conf, database_url=pg_url)
    try:
        a.start()
        b.start(wait=False)
        wait_for(lambda: _log_has(b.log, "lease.standby"), 60, "b300d B to wait as a standby")
        assert not (b.state_dir / "b300d.sock").exists()
        run_id = a.submit(write_spec(tmp_path / "ha.toml", "ha", "sleep 15"))
        a.wait_run(run_id, {"RUNNING"}, timeout=60)
        a.kill(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(b.ping, 30, "the standby to take over")
        took = time.monotonic() - killed
        status = b.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=90)
        assert status["run"]["state"] == "COMPLETED"
        [attempt] = status["attempts"]
        jobs = slurm_cmd(slurm_conf, "sacct", "-X", "-n", "-P", "--format=JobID",
                         f"--name={attempt['tag']}", "-S", "now-1hour").split()
        assert jobs == [str(attempt["job_id"])]
        assert took < 30
        # The old active comes back as the standby.
        a.start(wait=False)
        wait_for(lambda: _log_has(a.log, "lease.standby"), 60, "b300d A to come back as standby")
        assert a.proc is not None and a.proc.poll() is None
    finally:
        for d in (a, b):
            d.cleanup()
