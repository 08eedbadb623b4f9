"""Typed, immutable records of drift: its configuration and a scan (plain data, no I/O).

The ``[drift]`` table's grammar, with an example, is :mod:`b300.config.tables.drift`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


class NodeStatus(enum.StrEnum):
    """How probing one node went. Only ``OK`` nodes can show drift."""

    OK = "ok"
    UNREACHABLE = "unreachable"  # no TCP connection, refused, DNS, jump host down
    TIMEOUT = "timeout"  # connected, but a probe did not finish within command_timeout
    HOSTKEY = "hostkey"  # host key unknown or changed: refused, never trusted
    AUTH = "auth"  # the node refused our key


class ProbeStatus(enum.StrEnum):
    OK = "ok"
    UNPARSEABLE = "unparseable"
    FAILED = "failed"  # the command exited non-zero (tool missing, driver not loaded)
    TIMEOUT = "timeout"


class FindingKind(enum.StrEnum):
    DRIFT = "drift"  # a value differs from the baseline
    UNPARSEABLE = "unparseable"
    FAILED = "failed"
    SPLIT = "split"  # no majority in the partition and nothing pinned: no baseline


class Policy(enum.StrEnum):
    DRAIN = "drain"
    WARN = "warn"


@dataclass(frozen=True, slots=True)
class CommandResult:
    """One command's end on one node; ``exit_code`` is None when it timed out."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""


@dataclass(frozen=True, slots=True)
class NodeRun:
    """Every command's result on one node, or why none could run."""

    node: str
    status: NodeStatus
    error: str = ""
    results: dict[str, CommandResult] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProbeValue:
    """One probe's parsed answer on one node (``value`` is "" unless ``status`` is OK)."""

    status: ProbeStatus
    value: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node in the matrix: its status and each probe's value."""

    node: str
    partition: str
    status: NodeStatus
    error: str = ""
    values: dict[str, ProbeValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Finding:
    """A difference worth a person's attention; ``(node, probe)`` identifies it."""

    node: str
    probe: str
    kind: FindingKind
    expected: str
    found: str
    policy: Policy

    @property
    def key(self) -> tuple[str, str]:
        return (self.node, self.probe)


@dataclass(frozen=True, slots=True)
class OpenFinding:
    """A finding as the store keeps it while it is open."""

    id: int
    finding: Finding
    opened_at: datetime


@dataclass(frozen=True, slots=True)
class Plan:
    """What one scan changes: findings to open and close, nodes to drain and resume."""

    open: tuple[Finding, ...] = ()
    close: tuple[OpenFinding, ...] = ()
    drain: tuple[tuple[str, str], ...] = ()  # (node, reason)
    resume: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What a scan saw and did."""

    started_at: datetime
    wall_s: float
    reports: tuple[NodeReport, ...]
    findings: tuple[Finding, ...]
    opened: tuple[Finding, ...] = ()
    closed: tuple[Finding, ...] = ()
    drained: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


# -- configuration ([drift]) --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to reach a node (or the jump host) over SSH."""

    host: str
    port: int = 22


@dataclass(frozen=True, slots=True)
class SshSettings:
    """How to reach nodes. ``key_file`` None means: use the ssh-agent."""

    user: str
    known_hosts: str
    key_file: str | None = None
    jump: Endpoint | None = None
    jump_user: str | None = None
    concurrency: int = 64
    connect_timeout_s: float = 5.0
    command_timeout_s: float = 20.0


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
