"""A host of its own for the probe tests: a network namespace behind a veth pair.

``ip netns add``, a veth pair (one end moved into the namespace), a private /24
(``10.231.<k>.1`` on our side, ``.2`` inside), and a TCP listener inside on
:data:`OPEN_PORT`. The test powers it off (link down), drops its packets (netem) or
stops its ICMP echo (sysctl inside it), and every piece is removed on exit. Root only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

OPEN_PORT = 7777
CLOSED_PORT = 7778
_LISTEN = ("import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
           f"s.bind(('0.0.0.0',{OPEN_PORT}))\ns.listen(64)\ntime.sleep(900)\n")


def unavailable() -> str:
    """Why the namespace tests cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add, veth, tc)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "iproute2 (ip, tc) is not installed"
    return ""


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=check)


@dataclass
class Host:
    """The namespace ``ns``, reached at ``addr`` through our veth end ``outer``."""

    ns: str
    outer: str
    inner: str
    addr: str

    def inside(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.ns, *args, check=check)

    def power_off(self) -> None:
        """The node's own link goes down: nothing it sends or answers leaves it."""
        self.inside("ip", "link", "set", self.inner, "down")

    def netem(self, *spec: str) -> bool:
        """Impair both directions (our egress and the node's) with ``tc netem spec``; False
        when this kernel has no netem qdisc (sch_netem not built or loaded)."""
        if sh("tc", "qdisc", "replace", "dev", self.outer, "root", "netem", *spec, check=False).returncode:
            return False
        self.inside("tc", "qdisc", "replace", "dev", self.inner, "root", "netem", *spec)
        return True

    def drop(self, percent: int) -> None:
        """Drop ``percent`` % of the packets the node receives (nftables inside it, at random)."""
        self.inside("nft", "add", "table", "inet", "b300loss")
        self.inside("nft", "flush", "table", "inet", "b300loss")
        self.inside("nft", "add", "chain", "inet", "b300loss", "in",
                    "{ type filter hook prerouting priority -300 ; }")
        rule = ["drop"] if percent >= 100 else ["numgen", "random", "mod", "100", "<", str(percent), "drop"]
        self.inside("nft", "add", "rule", "inet", "b300loss", "in", *rule)

    def lossy(self, percent: int, jitter_ms: int) -> str:
        """``percent`` % loss and up to ``jitter_ms`` of delay (netem); where the kernel has no
        netem, the loss alone (nftables). Returns what was set."""
        if self.netem("delay", f"{jitter_ms}ms", f"{jitter_ms}ms", "loss", f"{percent}%"):
            return f"netem {percent}% loss, {jitter_ms} ms +- {jitter_ms} ms delay"
        self.drop(percent)
        return f"nftables {percent}% loss (no netem in this kernel: no added delay)"

    def ignore_echo(self) -> None:
        self.inside("sysctl", "-q", "net.ipv4.icmp_echo_ignore_all=1")


@contextlib.contextmanager
def host() -> Iterator[Host]:
    """A fresh namespace host; removed (namespace, veth, listener) whatever happens."""
    tag = secrets.token_hex(3)
    ns, outer, inner = f"b300p-{tag}", f"vp{tag}a", f"vp{tag}b"
    third = 1 + int(tag, 16) % 250
    mine, theirs = f"10.231.{third}.1", f"10.231.{third}.2"
    listener: subprocess.Popen[bytes] | None = None
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", ns)
        sh("ip", "addr", "add", f"{mine}/24", "dev", outer)
        sh("ip", "link", "set", outer, "up")
        h = Host(ns, outer, inner, theirs)
        h.inside("ip", "addr", "add", f"{theirs}/24", "dev", inner)
        h.inside("ip", "link", "set", inner, "up")
        h.inside("ip", "link", "set", "lo", "up")
        listener = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _LISTEN])
        for _ in range(100):  # bounded: the listener binds within a second
            if f":{OPEN_PORT}" in h.inside("ss", "-ltnH", check=False).stdout:
                break
            time.sleep(0.05)
        yield h
    finally:
        if listener is not None:
            listener.kill()
            listener.wait(10)
        sh("ip", "link", "del", outer, check=False)
        sh("ip", "netns", "del", ns, check=False)
