"""The daemon as a systemd service: the unit file, sd_notify on a real socket, SIGHUP."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from b300.store import open_store
from helpers import REPO, make_daemon, wait_for

pytestmark = pytest.mark.slurm


def test_unit_file_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (deploy/install-deps.sh installs systemd)")
    # verify insists that ExecStart exists: point it at this environment's b300d.
    b300d = shutil.which("b300d")
    assert b300d, "b300d is not on PATH (pip install -e .)"
    unit = tmp_path / "b300d.service"
    text = (REPO / "deploy" / "b300d.service").read_text()
    assert "/opt/b300/venv/bin/b300d" in text
    unit.write_text(text.replace("/opt/b300/venv/bin/b300d", b300d))
    proc = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
    for line in ("Type=notify", "NotifyAccess=main", "WatchdogSec=", "Restart=on-failure",
                 "User=b300", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                 "PrivateTmp=yes", "ReadWritePaths=-/var/lib/b300 /run/b300", "RuntimeDirectory=b300",
                 "UMask=0027", "ExecReload=/bin/kill -HUP $MAINPID"):
        assert line in text


def test_install_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(REPO / "deploy" / "install.sh")], check=True, timeout=30)


def _recv_all(sock: socket.socket, until: float) -> list[str]:
    got: list[str] = []
    while time.monotonic() < until:
        sock.settimeout(max(0.01, until - time.monotonic()))
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            break
    return got


def test_ready_watchdog_stopping_arrive_on_a_real_notify_socket(tmp_path: Path, slurm_conf: str) -> None:
    # A long poll interval: the watchdog pings must not depend on cycles.
    handle = make_daemon(tmp_path, slurm_conf, poll_interval="1h")
    addr = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(addr)
    try:
        handle.start(extra_env={"NOTIFY_SOCKET": addr, "WATCHDOG_USEC": "600000"})  # ping every 0.3 s
        messages = _recv_all(sock, time.monotonic() + 2.5)
        assert messages and messages[0].startswith("READY=1"), messages
        pings = [m for m in messages if m == "WATCHDOG=1"]
        assert len(pings) >= 4, messages  # ~8 expected in 2.5 s
        handle.kill(signal.SIGTERM)
        assert handle.proc is not None and handle.proc.returncode == 0
        rest = _recv_all(sock, time.monotonic() + 0.5)
        assert "STOPPING=1" in messages + rest
    finally:
        sock.close()
        handle.cleanup()


def _ts(record: dict[str, object]) -> float:
    return datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00")).timestamp()


def _log_records(path: Path) -> list[dict[str, object]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_sighup_refuses_a_broken_config_and_applies_a_valid_one(tmp_path: Path, slurm_conf: str) -> None:
    handle = make_daemon(tmp_path, slurm_conf, poll_interval="0.5s")
    handle.start()
    try:
        assert handle.proc is not None
        good = handle.config.read_text()
        handle.config.write_text(good.replace('poll_interval = "0.5s"', 'poll_interval = "banana"'))
        handle.proc.send_signal(signal.SIGHUP)
        refused = wait_for(lambda: [r for r in _log_records(handle.log) if r.get("event") == "config.refused"],
                           20, "config.refused in the log")
        assert "poll_interval must be a duration" in str(refused[0]["reason"])
        assert handle.ping()  # the old config keeps running

        # A valid change: a slower poll (live) and a new submit_grace (needs a restart).
        handle.config.write_text(good.replace('poll_interval = "0.5s"', 'poll_interval = "4s"')
                                 .replace('submit_grace = "3s"', 'submit_grace = "9s"'))
        handle.proc.send_signal(signal.SIGHUP)
        reloaded = wait_for(lambda: [r for r in _log_records(handle.log)
                                     if r.get("event") == "config.reloaded"], 20, "config.reloaded")
        assert reloaded[0]["changed"] == ["poll_interval_s"]
        assert reloaded[0]["needs_restart"] == ["submit_grace_s"]
        # The new interval, read off the cycles that follow the reload (awaited, not slept):
        # at 0.5 s they would come ~0.5 s apart, at 4 s they are about 4 s apart.
        seen = len(_log_records(handle.log))
        cycles = wait_for(lambda: (c := [r for r in _log_records(handle.log)[seen:]
                                        if r.get("event") == "cycle.done"])[2:] and c, 40,
                          "three cycles after the reload")
        gap = _ts(cycles[2]) - _ts(cycles[1])
        assert gap >= 3.5, gap
        store = open_store(handle.database_url)
        try:
            kinds = [e.kind for e in store.events(kinds=["config.refused", "config.reloaded"])]
        finally:
            store.close()
        assert kinds == ["config.refused", "config.reloaded"]
    finally:
        handle.cleanup()
