"""The [drift] config section: valid tables and one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from b300.config import load_config
from b300.config.tables.drift import parse_drift_config
from b300.drift.scan_records import Endpoint, Policy
from b300.errors import ConfigError

BASE: dict[str, Any] = {"known_hosts": "/etc/b300/known_hosts", "nodes": {"gpu01": "10.0.0.1"}}


def test_full_table() -> None:
    cfg = parse_drift_config({
        **BASE, "user": "b300", "key_file": "/etc/b300/id", "jump_host": "login01:2222", "concurrency": 8,
        "connect_timeout": "3s", "command_timeout": "1m", "interval": "1h", "max_age": "2h",
        "probes": ["nccl", "driver"], "image": "/lustre/img/train.sqsh", "policy": {"kernel": "warn"},
        "pinned": {"nccl": "2.23.4"},
        "nodes": {"gpu01": "10.0.0.1", "gpu02": {"host": "10.0.0.2", "port": 2222, "partition": "b300"}},
    }, "b300.toml")
    assert cfg.ssh.jump == Endpoint("login01", 2222) and cfg.ssh.command_timeout_s == 60
    assert cfg.endpoints() == {"gpu01": Endpoint("10.0.0.1", 22), "gpu02": Endpoint("10.0.0.2", 2222)}
    assert cfg.partitions() == {"gpu01": "default", "gpu02": "b300"}
    assert cfg.policies == {"kernel": Policy.WARN} and cfg.pinned == {"nccl": "2.23.4"}
    assert cfg.settings == {"image": "/lustre/img/train.sqsh"} and cfg.interval_s == 3600
    assert cfg.probes == ("nccl", "driver")


@pytest.mark.parametrize(("change", "message"), [
    ({"known_hosts": None}, r"\[drift\] known_hosts is missing \(host keys are never trusted blindly\)"),
    ({"nodes": {}}, "at least one node"),
    ({"nodes": {"gpu01": "10.0.0.1; rm -rf /"}}, "not a host name"),
    ({"nodes": {"bad name": "h"}}, "not a node name"),
    ({"image": "/img/$(reboot).sqsh"}, "image"),
    ({"image": "relative.sqsh"}, "image"),
    ({"policy": {"nccl": "ignore"}}, "policy.nccl"),
    ({"pinned": {"nccl": 2}}, "pinned.nccl"),
    ({"jump_host": "login:99999"}, "port"),
    ({"concurrency": 0}, "concurrency"),
    ({"interval": "1s"}, "at least 10 s"),
    ({"bogus": 1}, "unknown key 'bogus'"),
])
def test_errors_are_one_line_naming_the_key(change: dict[str, Any], message: str) -> None:
    table = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=message) as err:
        parse_drift_config(table, "b300.toml")
    assert "\n" not in str(err.value) and "[drift]" in str(err.value)


def test_the_daemon_config_keeps_the_section(tmp_path: Path) -> None:
    path = tmp_path / "b300.toml"
    path.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[drift]\nknown_hosts = "/k"\n[drift.nodes]\n'
                    'gpu01 = "127.0.0.1:22201"\n')
    cfg = load_config(str(path))
    assert cfg.drift is not None and cfg.drift.endpoints() == {"gpu01": Endpoint("127.0.0.1", 22201)}
    path.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n')
    assert load_config(str(path)).drift is None
