"""Pure parts of operating the daemon: config sections, reload plan, watchdog health."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest

from b300.app.reloader import plan_reload
from b300.config import load_config
from b300.errors import ConfigError
from b300.ops.health import CycleHealth, Watchdog, watchdog_interval_s


def _cfg(tmp_path: Path, extra: str = "", daemon: str = "") -> Path:
    path = tmp_path / "b300.toml"
    path.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n{daemon}{extra}')
    return path


@pytest.mark.parametrize(("extra", "message"), [
    ('[alerts]\nwebhook_url = "file:///etc/passwd"\n', "webhook_url must be an http(s) URL"),
    ('[alerts]\nwebhook_url = "http://"\n', "webhook_url must be an http(s) URL"),
    ('[alerts]\nmail_to = ["a@example.com"]\n', "needs the SMTP settings of [report]"),
    ('[alerts]\nscan_interval = "5m"\n', "at most 60 s"),
    ('[report]\nto = ["a@example.com"]\n', "smtp_host is required"),
    ('[report]\nsmtp_host = "mx"\nsmtp_user = "b300"\n', "needs password_file"),
    ('[report]\nsmtp_host = "mx"\npassword = "hunter2"\n', "unknown key 'password'"),
    ('[report]\ntimezone = "Mars/Olympus"\n', "not a known IANA time zone"),
    ('[report]\nday = "someday"\n', "day must be one of"),
    ('[metrics]\nlisten = "9300"\n', "listen must be HOST:PORT"),
])
def test_bad_ops_sections_are_one_line_errors(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_config(str(_cfg(tmp_path, extra)))
    assert "\n" not in str(err.value)


def test_reload_applies_live_fields_and_reports_the_rest(tmp_path: Path) -> None:
    old = load_config(str(_cfg(tmp_path, daemon='poll_interval = "15s"\n')))
    new = load_config(str(_cfg(tmp_path, '[recovery]\nsettle = "2m"\n[metrics]\nlisten = "127.0.0.1:9300"\n'
                               '[spares]\nenabled = true\n[[spares.pool]]\npartition = "batch"\nnodes = 1\n',
                               daemon='poll_interval = "30s"\nlog_level = "debug"\n'
                                      'database_url = "sqlite:////tmp/other.db"\n')))
    change = plan_reload(old, new)
    assert set(change.applied) == {"poll_interval_s", "log_level", "recovery", "spares"}
    assert [p.partition for p in change.config.spares.pools] == ["batch"]
    assert set(change.needs_restart) == {"database_url", "metrics"}
    assert change.config.poll_interval_s == 30 and change.config.recovery.settle_s == 120
    assert change.config.database_url == old.database_url and change.config.metrics == old.metrics
    disabled = dataclasses.replace(new, recovery=dataclasses.replace(new.recovery, enabled=False))
    assert "recovery.enabled" in plan_reload(old, disabled).needs_restart
    assert plan_reload(old, disabled).config.recovery.enabled is True


def test_watchdog_interval_and_stuck_cycle() -> None:
    assert watchdog_interval_s("30000000") == 15.0
    assert watchdog_interval_s(None) is None and watchdog_interval_s("x") is None
    t = [100.0]
    health = CycleHealth(clock=lambda: t[0], wall=lambda: 1e9)
    health.begin()
    t[0] += 50
    assert not health.stuck(60)
    t[0] += 20
    assert health.stuck(60)
    health.end(ok=False)
    snap = health.snapshot()
    assert (snap.cycles_total, snap.failures_total, snap.last_duration_s) == (1, 1, 70.0)
    assert not health.stuck(60)


def test_watchdog_pings_only_while_healthy() -> None:
    import threading

    sent: list[str] = []
    healthy = threading.Event()
    healthy.set()
    got_one = threading.Event()

    def notify(msg: str) -> None:
        sent.append(msg)
        got_one.set()

    dog = Watchdog(0.01, healthy.is_set, notify)
    dog.start()
    assert got_one.wait(5)
    healthy.clear()
    count = len(sent)
    time.sleep(0.2)  # twenty intervals: at most the one in flight may still arrive
    dog.stop()
    assert len(sent) <= count + 1 and set(sent) == {"WATCHDOG=1"}
