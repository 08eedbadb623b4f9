"""b300ctl and b300d on wrong input: one line on stderr, exit code 2, no traceback.

These run the real programs as processes; none needs the Slurm cluster.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _run(*args: str, module: str = "b300.ctl") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    p = tmp_path / "b300.toml"
    p.write_text(f"[daemon]\nstate_dir = '{tmp_path / 'state'}'\n")
    return p


def test_bad_spec(cfg: Path, tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text("name = 'x'\n[job]\ncommand = 'a'\nnodes = -1\n")
    proc = _run("--config", str(cfg), "submit", str(spec))
    assert proc.returncode == 2
    assert "nodes must be >= 1" in _one_line(proc)


def test_bad_config(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text("[daemon]\npoll_interval = 'x'\n")
    for module, args in (("b300.ctl", ["status"]), ("b300.app.main", [])):
        proc = _run("--config", str(p), *args, module=module)
        assert proc.returncode == 2
        assert "poll_interval" in _one_line(proc)


def test_unknown_command_and_option(cfg: Path) -> None:
    for args in (["frobnicate"], ["status", "--bogus"], []):
        proc = _run("--config", str(cfg), *args)
        assert proc.returncode == 2
        _one_line(proc)


def test_no_state_store_yet(cfg: Path) -> None:
    proc = _run("--config", str(cfg), "status")
    assert proc.returncode == 4
    assert "no state store" in _one_line(proc)


def test_unreachable_postgres(tmp_path: Path) -> None:
    p = tmp_path / "pg.toml"
    p.write_text("[daemon]\ndatabase_url = 'postgresql+psycopg://u:secret@127.0.0.1:1/x'\n")
    proc = _run("--config", str(p), "status")
    assert proc.returncode == 4
    line = _one_line(proc)
    assert "secret" not in line


def test_daemon_not_running(cfg: Path, tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text("name = 'x'\n[job]\ncommand = 'true'\nnodes = 1\n")
    proc = _run("--config", str(cfg), "cancel", "some-run")
    assert proc.returncode == 5
    assert "b300d is not running" in _one_line(proc)


def test_unknown_run(cfg: Path) -> None:
    from b300.store import open_store

    open_store(f"sqlite:///{cfg.parent / 'state' / 'state.db'}").close()
    proc = _run("--config", str(cfg), "status", "no-such-run")
    assert proc.returncode == 2
    assert "no-such-run" in _one_line(proc)


def test_daemon_refuses_a_config_others_can_write(tmp_path: Path) -> None:
    p = tmp_path / "open.toml"
    p.write_text(f"[daemon]\nstate_dir = '{tmp_path / 'state'}'\n")
    p.chmod(0o666)
    proc = _run("--config", str(p), module="b300.app.main")
    assert proc.returncode == 2
    assert "writable by group or others" in _one_line(proc)


def test_daemon_refuses_a_world_writable_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    p = tmp_path / "b300.toml"
    p.write_text(f"[daemon]\nstate_dir = '{state}'\n")
    proc = _run("--config", str(p), module="b300.app.main")
    assert proc.returncode == 2
    assert "state directory" in _one_line(proc)
