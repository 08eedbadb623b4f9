"""The ``[drift]`` table, validated into a frozen :class:`~b300.drift.scan_records.DriftConfig`.

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

    [drift.policy]                             # drain | warn, per probe; default warn
    nccl = "drain"                             # (a drain needs [daemon] mode = "act")

    [drift.pinned]                             # the golden values; else the partition majority
    nccl = "2.23.4"

    [drift.nodes]                              # Slurm node name -> SSH address
    gpu01 = { host = "10.0.0.1", port = 22, partition = "batch" }
    gpu02 = "10.0.0.2:22"
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, PlainValidator

from ...drift.scan_records import DriftConfig, DriftNode, Endpoint, Policy, SshSettings
from ...errors import ConfigError
from ...grammar.duration import DurationError, duration_seconds, is_off, short_repr
from ...grammar.types import (
    HOST,
    NAME,
    AbsPath,
    Duration,
    NodeName,
    Port,
    ProbeName,
    Table,
    expected,
    matches,
    one_of,
    problem,
    validate,
)

# Paths that reach a remote shell: a strict character set, quoted as well.
_REMOTE_PATH = r"/[A-Za-z0-9._+/-]{1,255}"
#: An SSH address: a host name, an IPv6 address in brackets, or a bare IPv6 address.
_SSH_HOST = re.compile(f"{HOST}|[0-9A-Fa-f:]*:[0-9A-Fa-f:]*")
_USER = r"[a-z_][a-z0-9_.-]{0,31}"
_VERSION = r"[^\x00-\x1f]{1,200}"

User = Annotated[str, matches(_USER, "a user name")]
RemotePath = Annotated[str, matches(_REMOTE_PATH, "an absolute path of letters, digits and ._+-/", empty=True)]


def endpoint(text: str, port: int = 22) -> tuple[str, int]:
    """``host`` or ``host:port`` (one colon; an IPv6 address takes the default port)."""
    host, sep, port_text = text.rpartition(":") if text.count(":") == 1 else ("", "", "")
    if sep:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise problem(f"port {short_repr(port_text)} is not a port number")
        text, port = host, int(port_text)
    if not _SSH_HOST.fullmatch(text):
        raise problem(f"{short_repr(text)} is not a host name or address")
    return text, port


def _ssh_host(value: str) -> str:
    if not _SSH_HOST.fullmatch(value):
        raise expected("a host name or address")
    return value


def _jump_host(value: object) -> Endpoint | None:
    if not isinstance(value, str):
        raise expected("a string")
    if not value:
        return None
    host, port = endpoint(value)
    return Endpoint(host.strip("[]"), port)


def _interval(value: object) -> float | None:
    """Scheduled scans: a duration of at least 10 s, or 0 / "0" / "" for "on demand only"."""
    if is_off(value) or value == "":
        return None
    try:
        seconds = duration_seconds(value)
    except DurationError as exc:
        raise problem(str(exc)) from None
    if seconds < 10:
        raise problem(f"must be at least 10 s, got {seconds:g} s")
    return seconds


def _node_address(value: object) -> object:
    """``gpu01 = "10.0.0.1:22"`` is ``gpu01 = { host = "10.0.0.1", port = 22 }``."""
    if isinstance(value, str):
        host, port = endpoint(value)
        return {"host": host, "port": port}
    if not isinstance(value, dict):
        raise problem(f'must be "host[:port]" or a table, got {short_repr(value)}')
    return value


def _some_nodes(nodes: dict[str, Any]) -> dict[str, Any]:
    if not nodes:
        raise problem("must name at least one node")
    return nodes


class DriftNodeTable(Table):
    host: Annotated[str, AfterValidator(_ssh_host)] = Field(description="the node's SSH address")
    port: Port = 22
    partition: Annotated[str, matches(NAME, "a partition name")] = "default"


class DriftTable(Table):
    #: SSH user on the nodes.
    user: User = "root"
    known_hosts: AbsPath = Field(description="host keys are never trusted blindly")
    #: SSH private key; not set: the ssh-agent.
    key_file: AbsPath | None = None  # None: the ssh-agent
    #: Reach the nodes through this host (ssh -J), host or host:port.
    jump_host: Annotated[Endpoint | None, PlainValidator(_jump_host)] = None
    #: User on the jump host (default: user).
    jump_user: User | None = None
    #: Nodes probed at once.
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 64
    #: SSH connect timeout per node.
    connect_timeout: Duration = 5.0
    #: All probes of one node together.
    command_timeout: Duration = 20.0
    #: Scheduled scans; 0 or absent: on demand only (b300ctl drift scan).
    interval: Annotated[float | None, PlainValidator(_interval)] = None
    #: Rescan a node before a (re)submission when its last scan is older.
    max_age: Duration = 6 * 3600.0
    #: Probes to run; not set: every probe plugin loaded.
    probes: list[ProbeName] | None = None  # None: every probe plugin loaded
    #: The training image file (squashfs or SIF) whose checksum the image probe compares.
    image: RemotePath = ""
    #: The NCCL library the nccl probe reads; "": libnccl.so.2 via LD_LIBRARY_PATH.
    nccl_library: RemotePath = ""
    #: Per probe, drain or warn (default: the probe's own).
    policy: dict[ProbeName, Annotated[str, one_of("drain", "warn")]] = Field(default_factory=dict)
    #: Per probe, the golden value; else the partition's majority.
    pinned: dict[ProbeName, Annotated[str, matches(_VERSION, "a version string")]] = Field(default_factory=dict)
    nodes: Annotated[dict[NodeName, Annotated[DriftNodeTable, BeforeValidator(_node_address)]],
                     AfterValidator(_some_nodes)] = Field(description="Slurm node name -> SSH address")


def drift_config(t: DriftTable) -> DriftConfig:
    ssh = SshSettings(user=t.user, known_hosts=t.known_hosts, key_file=t.key_file, jump=t.jump_host,
                      jump_user=t.jump_user, concurrency=t.concurrency, connect_timeout_s=t.connect_timeout,
                      command_timeout_s=t.command_timeout)
    nodes = tuple(DriftNode(name, Endpoint(n.host.strip("[]"), n.port), n.partition)
                  for name, n in sorted(t.nodes.items()))
    return DriftConfig(
        ssh=ssh, nodes=nodes, probes=None if t.probes is None else tuple(t.probes),
        policies={probe: Policy(value) for probe, value in t.policy.items()}, pinned=dict(t.pinned),
        settings={k: v for k, v in (("image", t.image), ("nccl_library", t.nccl_library)) if v},
        interval_s=t.interval, max_age_s=t.max_age)


def parse_drift_config(table: object, where: str) -> DriftConfig:
    """A ``[drift]`` table of the file ``where``, validated alone (tests, tools)."""
    return drift_config(validate(DriftTable, table, where, ConfigError, prefix=("drift",)))
