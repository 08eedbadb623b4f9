"""The ``[drift]`` section of the daemon's config, validated into a frozen ``DriftConfig``.

::

    [drift]
    user = "root"                              # SSH user on the nodes
    key_file = "/etc/b300/drift_ed25519"       # default: the ssh-agent
    known_hosts = "/etc/b300/known_hosts"      # required; unknown/changed keys are refused
    jump_host = "login01:22"                   # optional: reach nodes through it (ssh -J)
    jump_user = "b300"                         # default: user
    concurrency = 64                           # nodes probed at once
    connect_timeout = "5s"
    command_timeout = "20s"                    # all probes of one node together
    interval = "1h"                            # scheduled scans (0 or absent: on demand only)
    max_age = "6h"                             # rescan before a (re)submission when older
    probes = ["driver", "nccl"]                # default: every probe plugin loaded
    image = "/lustre/images/train.sqsh"        # training image file (squashfs or SIF)
    nccl_library = ""                          # default: libnccl.so.2 via LD_LIBRARY_PATH

    [drift.policy]                             # drain | warn, per probe
    kernel = "warn"

    [drift.pinned]                             # the golden values; else the partition majority
    nccl = "2.23.4"

    [drift.nodes]                              # Slurm node name -> SSH address
    gpu01 = { host = "10.0.0.1", port = 22, partition = "batch" }
    gpu02 = "10.0.0.2:22"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..validate import get_int, get_str, get_table, parse_duration, reject_unknown
from .records import Endpoint, Policy, SshSettings  # not from .ssh: b300ctl reads the config without paramiko

_ABS = re.compile(r"/[^\x00\n]*")
# Paths that reach a remote shell: a strict character set, quoted as well.
_REMOTE_PATH = re.compile(r"/[A-Za-z0-9._+/-]{1,255}")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[?[0-9A-Fa-f:]+\]?")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
_PROBE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_VALUE = re.compile(r"[^\x00-\x1f]{1,200}")
_KEYS = {"user", "key_file", "known_hosts", "jump_host", "jump_user", "concurrency", "connect_timeout",
         "command_timeout", "interval", "max_age", "probes", "image", "nccl_library", "policy", "pinned",
         "nodes"}


@dataclass(frozen=True, slots=True)
class DriftNode:
    name: str
    endpoint: Endpoint
    partition: str = "default"


@dataclass(frozen=True, slots=True)
class DriftConfig:
    ssh: SshSettings
    nodes: tuple[DriftNode, ...]
    probes: tuple[str, ...] | None = None  # None: every loaded probe
    policies: Mapping[str, Policy] = field(default_factory=dict)
    pinned: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, str] = field(default_factory=dict)  # image, nccl_library
    interval_s: float | None = None
    max_age_s: float = 6 * 3600.0

    def endpoints(self) -> dict[str, Endpoint]:
        return {n.name: n.endpoint for n in self.nodes}

    def partitions(self) -> dict[str, str]:
        return {n.name: n.partition for n in self.nodes}


def parse_drift_config(table: Mapping[str, Any], where: str) -> DriftConfig:
    """Validate a ``[drift]`` table; every problem is one ConfigError line naming the key."""
    w = f"{where}: [drift]"
    reject_unknown(table, _KEYS, w, ConfigError)
    user = get_str(table, "user", w, ConfigError, default="root", pattern=_USER, what="a user name")
    known = get_str(table, "known_hosts", w, ConfigError, pattern=_ABS, what="an absolute path")
    if known is None:
        raise ConfigError(f"{w}: known_hosts is required (host keys are never trusted blindly)")
    key = get_str(table, "key_file", w, ConfigError, pattern=_ABS, what="an absolute path")
    jump_text = get_str(table, "jump_host", w, ConfigError)
    jump = _endpoint(jump_text, "jump_host", w) if jump_text else None
    jump_user = get_str(table, "jump_user", w, ConfigError, pattern=_USER, what="a user name")
    concurrency = get_int(table, "concurrency", w, ConfigError, default=64, lo=1, hi=1024)
    assert user is not None and concurrency is not None
    ssh = SshSettings(
        user=user, known_hosts=known, key_file=key, jump=jump, jump_user=jump_user,
        concurrency=concurrency,
        connect_timeout_s=parse_duration(table.get("connect_timeout", 5), "connect_timeout", w, ConfigError),
        command_timeout_s=parse_duration(table.get("command_timeout", 20), "command_timeout", w, ConfigError),
    )
    interval: float | None = None
    if table.get("interval") not in (None, 0, "0", ""):
        interval = parse_duration(table["interval"], "interval", w, ConfigError)
        if interval < 10:
            raise ConfigError(f"{w}: interval must be at least 10 s, got {interval:g} s")
    probes = table.get("probes")
    if probes is not None:
        if not isinstance(probes, list) or not all(isinstance(p, str) and _PROBE.fullmatch(p) for p in probes):
            raise ConfigError(f"{w}: probes must be a list of probe names")
        probes = tuple(probes)
    settings: dict[str, str] = {}
    for name in ("image", "nccl_library"):
        value = get_str(table, name, w, ConfigError, default="", pattern=re.compile(f"|{_REMOTE_PATH.pattern}"),
                        what="an absolute path of letters, digits and ._+-/")
        if value:
            settings[name] = value
    return DriftConfig(
        ssh=ssh,
        nodes=_nodes(get_table(table, "nodes", w, ConfigError), w),
        probes=probes,
        policies=_policies(get_table(table, "policy", w, ConfigError), w),
        pinned=_pinned(get_table(table, "pinned", w, ConfigError), w),
        settings=settings,
        interval_s=interval,
        max_age_s=parse_duration(table.get("max_age", 6 * 3600), "max_age", w, ConfigError),
    )


def _endpoint(text: str, key: str, w: str, port: int = 22) -> Endpoint:
    host, sep, port_text = text.rpartition(":") if text.count(":") == 1 else ("", "", "")
    if sep:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(f"{w}: {key} port {port_text!r} is not a port number")
        text, port = host, int(port_text)
    if not _HOST.fullmatch(text):
        raise ConfigError(f"{w}: {key} {text!r} is not a host name or address")
    return Endpoint(text.strip("[]"), port)


def _nodes(table: Mapping[str, Any], w: str) -> tuple[DriftNode, ...]:
    if not table:
        raise ConfigError(f"{w}: [drift.nodes] must name at least one node")
    nodes = []
    for name, value in sorted(table.items()):
        if not _NODE.fullmatch(name):
            raise ConfigError(f"{w}: nodes: {name!r} is not a node name")
        key = f"nodes.{name}"
        if isinstance(value, str):
            nodes.append(DriftNode(name, _endpoint(value, key, w)))
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(f"{w}: {key} must be \"host[:port]\" or a table")
        reject_unknown(value, {"host", "port", "partition"}, f"{w} {key}", ConfigError)
        host = get_str(value, "host", f"{w} {key}", ConfigError, pattern=_HOST, what="a host name or address")
        port = get_int(value, "port", f"{w} {key}", ConfigError, default=22, lo=1, hi=65535)
        part = get_str(value, "partition", f"{w} {key}", ConfigError, default="default", pattern=_NODE,
                       what="a partition name")
        if host is None:
            raise ConfigError(f"{w}: {key} needs a host")
        assert port is not None and part is not None
        nodes.append(DriftNode(name, Endpoint(host.strip("[]"), port), part))
    return tuple(nodes)


def _policies(table: Mapping[str, Any], w: str) -> dict[str, Policy]:
    out = {}
    for probe, value in table.items():
        if not _PROBE.fullmatch(probe) or value not in ("drain", "warn"):
            raise ConfigError(f"{w}: policy.{probe} must be \"drain\" or \"warn\", got {value!r}")
        out[probe] = Policy(value)
    return out


def _pinned(table: Mapping[str, Any], w: str) -> dict[str, str]:
    out = {}
    for probe, value in table.items():
        if not _PROBE.fullmatch(probe) or not isinstance(value, str) or not _VALUE.fullmatch(value):
            raise ConfigError(f"{w}: pinned.{probe} must be a version string, got {value!r}")
        out[probe] = value
    return out
