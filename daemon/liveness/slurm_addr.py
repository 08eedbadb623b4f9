"""Where each node's slurmd listens, from ``scontrol show node`` (pure parsing) to check targets.

``scontrol show node [-o] NODES`` prints ``NodeAddr=`` (an IP or a host name; the
node name when slurm.conf sets none) and ``Port=`` beside it, but only for a node whose
port differs from the cluster's ``SlurmdPort`` (measured on 22.05: a node on it prints no
``Port=``); that one is read from ``scontrol show config`` (:func:`parse_slurmd_port`),
never assumed to be 6818.
Both come before the free-text fields (``Reason=``, ``Comment=``, ``Extra=``), and
nothing after those is read, so a reason that spells ``NodeAddr=`` or ``Port=``
cannot move a check.

:meth:`b300.interfaces.SlurmClient.node_addresses` is one ``scontrol show node -o
<hostlist>``, parsed here, asked once per change of the set of nodes in use.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Mapping

from ..model import NodeAddress
from .verdicts import Target, check_node

# A record starts a line (multi-line and -o output alike); a reason cannot start one.
_RECORD = re.compile(r"^NodeName=(\S+)", re.MULTILINE)
# Free-text fields: Slurm prints them after NodeAddr/Port; nothing after them is read.
_FREE_TEXT = re.compile(r"(?:^|\s)(?:Reason|Comment|Extra)=")
_ADDR = re.compile(r"(?:^|\s)NodeAddr=(\S+)")
_PORT = re.compile(r"Port=(\d{1,5})")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})")
DEFAULT_SLURMD_PORT = 6818  # slurm.conf's SlurmdPort when it sets none


def parse_node_addresses(text: str) -> dict[str, NodeAddress]:
    """Every node record in ``scontrol show node`` output (multi-line or ``-o``).

    Records without a usable NodeAddr (absent, ``(null)``, not a host name or IP)
    are left out: a node we cannot address is not checked, never guessed at.
    """
    out: dict[str, NodeAddress] = {}
    starts = [m for m in _RECORD.finditer(text)]
    for i, m in enumerate(starts):
        body = text[m.end(): starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        free = _FREE_TEXT.search(body)
        body = body[: free.start()] if free else body
        node = m.group(1)
        addr = _ADDR.search(body)
        if addr is None:
            continue
        try:
            check_node(node)
        except ValueError:
            continue
        host = addr.group(1)
        if not (_is_ip(host) or _HOST.fullmatch(host)):
            continue
        # Port, when printed, is among the next few fields: "NodeHostName=h Port=6818 Version=...".
        port = next((p for p in (_PORT.fullmatch(tok) for tok in body[addr.end():].split(None, 3)[:3])
                     if p), None)
        number = int(port.group(1)) if port else None
        out[node] = NodeAddress(node, host, number if number and number < 65536 else None)
    return out


_SLURMD_PORT = re.compile(r"^SlurmdPort\s*=\s*(\d{1,5})\s*$", re.MULTILINE)


def parse_slurmd_port(text: str) -> int | None:
    """The cluster's ``SlurmdPort`` from ``scontrol show config`` output, or None."""
    m = _SLURMD_PORT.search(text)
    port = int(m.group(1)) if m else 0
    return port if 0 < port < 65536 else None


def with_default_port(addresses: Mapping[str, NodeAddress], port: int) -> dict[str, NodeAddress]:
    """``addresses`` with ``port`` (the cluster's SlurmdPort) for every node that printed none."""
    return {n: a if a.port is not None else NodeAddress(a.node, a.addr, port) for n, a in addresses.items()}


Resolver = Callable[[str], str]


def resolve_ipv4_or_6(host: str) -> str:
    """The first address ``host`` resolves to (blocking: call it once per change of the
    nodes in use, not in every round)."""
    info = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return str(info[0][4][0])


def targets_for(nodes: Iterable[str], addresses: Mapping[str, NodeAddress], *,
                default_port: int = DEFAULT_SLURMD_PORT,
                resolve: Resolver = resolve_ipv4_or_6) -> tuple[list[Target], dict[str, str]]:
    """Check targets for ``nodes`` (in order, each once), and why any node has none."""
    targets: list[Target] = []
    missing: dict[str, str] = {}
    for node in dict.fromkeys(nodes):
        a = addresses.get(node)
        if a is None:
            missing[node] = "no NodeAddr in scontrol show node"
            continue
        try:
            host = a.addr if _is_ip(a.addr) else resolve(a.addr)
            targets.append(Target(node, host, a.port or default_port))
        except (OSError, ValueError, IndexError) as exc:
            missing[node] = f"cannot resolve NodeAddr {a.addr!r}: {exc}"
    return targets, missing


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
