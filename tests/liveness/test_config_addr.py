"""The [liveness] config model and the slurmd addresses parsed from scontrol's real output."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from b300.errors import ConfigError
from b300.liveness.slurm_addr import (
    parse_node_addresses,
    parse_slurmd_port,
    targets_for,
    with_default_port,
)
from b300.liveness.timing import LivenessConfig, load_liveness_config
from b300.liveness.verdicts import Target
from b300.model import NodeAddress

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def test_defaults_are_documented_values() -> None:
    c = load_liveness_config(None)
    assert (c.interval_s, c.timeout_s, c.misses_to_suspect, c.confirm_window_s, c.confirm_timeout_s) == (
        1.0, 0.8, 3, 1.0, 1.5)


@pytest.mark.parametrize(("table", "message"), [
    ({"interval_s": True}, "[liveness] interval_s must be a number, got True"),
    ({"interval_s": "soon"}, "[liveness] interval_s must be a duration"),
    ({"primary": "connect", "confirm": "connect"}, "must differ from primary ('connect')"),
    ({"primary": "ping"}, "[liveness] primary must be 'icmp', 'syn' or 'connect', got 'ping'"),
    ({"misses_to_suspect": 0}, "[liveness] misses_to_suspect must be >= 1, got 0"),
    ({"misses_to_suspect": 2.0}, "[liveness] misses_to_suspect must be an integer, got 2.0"),
    ({"interval": 1}, "[liveness] unknown key 'interval'"),
    ({"interval_s": 1.0, "timeout_s": 1.0}, "timeout_s (1) must be shorter than interval_s (1)"),
])
def test_bad_values_are_one_line_naming_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=r"^config: \[liveness\] ") as exc:
        load_liveness_config(table)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_durations_take_the_project_strings() -> None:
    c = load_liveness_config({"interval_s": "2s", "timeout_s": 1.5, "recheck_s": "1 min"})
    assert (c.interval_s, c.timeout_s, c.recheck_s) == (2.0, 1.5, 60.0)
    assert (c.primary, c.confirm, c.port) == ("icmp", "syn", None)


def test_config_is_frozen() -> None:
    c = LivenessConfig()
    with pytest.raises(ValidationError):
        c.interval_s = 5.0  # type: ignore[misc]


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_parse_real_scontrol_show_node(release: str) -> None:
    text = (FIXTURES / release / "scontrol-show-node-gpu03.txt").read_text()
    assert parse_node_addresses(text) == {"gpu03": NodeAddress("gpu03", "127.0.0.1", 18303)}
    one_line = " ".join(text.split())  # what scontrol show node -o prints
    assert parse_node_addresses(one_line) == {"gpu03": NodeAddress("gpu03", "127.0.0.1", 18303)}


def test_parse_many_records_no_port_and_a_hostile_reason() -> None:
    text = ("NodeName=n1 Arch=x86_64 NodeAddr=10.1.0.1 NodeHostName=n1 Version=24.11 "
            "Reason=fake NodeAddr=6.6.6.6 Port=1 [root@2026]\n"
            "NodeName=n2 NodeAddr=n2.ib.cluster NodeHostName=n2 Port=6820 Version=24.11\n"
            "NodeName=n3 NodeAddr=(null) Port=6818\n"
            "NodeName=bad;rm NodeAddr=10.1.0.4\n"
            "NodeName=n5 NodeAddr=$(reboot)\n")
    assert parse_node_addresses(text) == {
        "n1": NodeAddress("n1", "10.1.0.1", None),
        "n2": NodeAddress("n2", "n2.ib.cluster", 6820),
    }


def test_slurmd_port_from_scontrol_show_config() -> None:
    # Lines as 22.05's `scontrol show config` prints them (local cluster, 2026-12-02).
    text = ("SlurmdPidFile           = /var/tmp/b300-bench14b/run/slurmd-%n.pid\n"
            "SlurmdPort              = 18301\n"
            "SlurmdSpoolDir          = /var/tmp/b300-bench14b/spool/%n\n"
            "SlurmdTimeout           = 300 sec\n")
    assert parse_slurmd_port(text) == 18301
    assert parse_slurmd_port("SlurmdTimeout = 300 sec\n") is None
    assert parse_slurmd_port("SlurmdPort = 70000\n") is None


def test_a_node_without_port_gets_the_clusters_slurmd_port() -> None:
    # 22.05 prints no Port= for a node on the cluster's SlurmdPort (gpu01 of the local
    # cluster: SlurmdPort=18101, gpu01 Port=18101): it must not be checked at 6818.
    found = parse_node_addresses("NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 "
                                 "NodeHostName=localhost Version=22.05.8\n"
                                 "NodeName=gpu02 NodeAddr=127.0.0.1 NodeHostName=localhost Port=18102\n")
    assert found["gpu01"].port is None
    assert with_default_port(found, 18101) == {"gpu01": NodeAddress("gpu01", "127.0.0.1", 18101),
                                               "gpu02": NodeAddress("gpu02", "127.0.0.1", 18102)}


def test_targets_resolve_names_once_and_say_why_a_node_has_none() -> None:
    addresses = {"n1": NodeAddress("n1", "10.1.0.1", None),
                 "n2": NodeAddress("n2", "n2.ib", 6820),
                 "n3": NodeAddress("n3", "gone.ib", None)}
    asked: list[str] = []

    def resolve(host: str) -> str:
        asked.append(host)
        if host == "gone.ib":
            raise OSError("Name or service not known")
        return "10.1.0.2"
    targets, missing = targets_for(["n1", "n2", "n2", "n3", "n4"], addresses, default_port=6818,
                                   resolve=resolve)
    assert targets == [Target("n1", "10.1.0.1", 6818), Target("n2", "10.1.0.2", 6820)]
    assert asked == ["n2.ib", "gone.ib"]
    assert set(missing) == {"n3", "n4"} and "Name or service not known" in missing["n3"]


@pytest.mark.parametrize(("node", "host", "port"), [
    ("a b", "127.0.0.1", 1), ("n1", "host.name", 1), ("n1", "127.0.0.1", 0), ("n1", "127.0.0.1", True),
    ("-n", "127.0.0.1", 1)])
def test_target_refuses_what_it_cannot_check(node: str, host: str, port: int) -> None:
    with pytest.raises(ValueError):
        Target(node, host, port)
