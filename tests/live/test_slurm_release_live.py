"""Which Slurm b300d talks to: logged at start, shown by ``b300ctl status RUN --json``,
and a release older than the oldest tested one refused with one line (exit 3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from b300.slurm.release import parse_release
from helpers import DaemonHandle, make_daemon, slurm_cmd, write_spec


@pytest.mark.slurm
def test_daemon_logs_and_records_the_release_it_talks_to(
    tmp_path: Path, slurm_conf: str, daemon: DaemonHandle
) -> None:
    expected = parse_release(slurm_cmd(slurm_conf, "sinfo", "-V"))
    started = [json.loads(line) for line in daemon.log.read_text().splitlines()
               if '"slurm.release"' in line]
    assert [(e["version"], e["release"], e["backend"]) for e in started] == [
        (expected.text, expected.release, "cli")]
    run_id = daemon.submit(write_spec(tmp_path / "r.toml", "release", "true"))
    shown = daemon.ctl("status", run_id)["slurm"]
    assert (shown["version"], shown["release"], shown["backend"]) == (
        expected.text, expected.release, "cli")


def test_release_older_than_oldest_tested_is_refused(tmp_path: Path) -> None:
    # Slurm 21.08 is not installable on this machine: a stand-in sinfo prints what
    # 21.08's `sinfo -V` prints. Everything else is the real daemon.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'slurm 21.08.8'\n")
    (bin_dir / "sinfo").chmod(0o755)
    d = make_daemon(tmp_path, str(tmp_path / "slurm.conf"))
    d.config.write_text(d.config.read_text() + f'bin_dir = "{bin_dir}"\n')
    proc = subprocess.run([sys.executable, "-m", "b300.app.main", "--config", str(d.config)],
                          capture_output=True, text=True, env=d.env, timeout=60, check=False)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "Slurm 21.08.8 is older than 22.05" in proc.stderr
    assert not (tmp_path / "state" / "slurm.json").exists()
