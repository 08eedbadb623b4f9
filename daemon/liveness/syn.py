"""A half-open TCP probe (one SYN) to every target in one batch: no application sees it.

One raw socket (``SOCK_RAW, IPPROTO_TCP``: needs CAP_NET_RAW) for the round. Each
target gets one SYN to its port (the node's slurmd port by default) from a random
source port of the round, with a random sequence number; the source address comes
from a route lookup (a UDP socket connected to the target: no packet is sent). A
SYN-ACK or a RST from the target's address and port, for our port, acknowledging our
sequence + 1, is ``OK``: the host's kernel answered. Our own kernel knows no such
connection and resets it at once, so the node's kernel never hands it to a process:
slurmd (or whatever listens) logs nothing, unlike a full connect.

What it sees: a powered-off host, a dead link, a kernel panic (silence), a host
whose ICMP is filtered. A closed port (slurmd dead) answers RST: alive. What it
cannot see: slurmd dead or frozen. ICMP errors for our SYNs are not read (the raw
TCP socket does not get them): an unreachable host is silence, unless the send
itself fails with EHOSTUNREACH. IPv4 only: an IPv6 target is ``NOT_CHECKED``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import socket
import struct
import time
from collections.abc import Callable, Sequence

from .batch import (
    JEQ,
    LD_HALF_AT_X,
    LDX_IP_HEADER_LEN,
    RET,
    Answer,
    attach_filter,
    checksum,
    run_batch,
    send_each,
)
from .verdicts import CheckOutcome, CheckResult, Target

_SYN, _RST, _ACK = 0x02, 0x04, 0x10
_WINDOW = 1024
_HEADER = struct.Struct("!HHIIBBHHH")


def open_syn_socket() -> socket.socket:
    """The raw TCP socket; raises OSError (EPERM) without CAP_NET_RAW."""
    return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)


def tcp_segment(src: str, dst: str, sport: int, dport: int, seq: int, ack: int, flags: int) -> bytes:
    """A 20-byte TCP header with its checksum over the IPv4 pseudo-header (pure)."""
    def header(check: int) -> bytes:
        return struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, _WINDOW, check, 0)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, socket.IPPROTO_TCP, 20)
    return header(checksum(pseudo + header(0)))


class SynProber:
    """Checks a batch of targets by a half-open TCP handshake; see the module docstring."""

    def __init__(self, *, timeout_s: float, max_in_flight: int = 4096, port: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if timeout_s <= 0 or max_in_flight < 1:
            raise ValueError("timeout_s must be > 0 and max_in_flight >= 1")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"bad port {port}")
        self._timeout = timeout_s
        self._max = max_in_flight
        self._port = port
        self._clock = clock

    def check(self, targets: Sequence[Target], budget_s: float) -> list[CheckResult]:
        """One result per target, in the targets' order, within ``budget_s`` seconds."""
        if not targets:
            return []
        if self._port is not None:
            targets = [Target(t.node, t.host, self._port) for t in targets]
        try:
            sock = open_syn_socket()
        except OSError as exc:
            why = "raw socket needs CAP_NET_RAW" if exc.errno in (errno.EPERM, errno.EACCES) else exc.strerror
            return [CheckResult(t.node, CheckOutcome.NOT_CHECKED, 0.0, f"syn: {why}") for t in targets]
        with sock:
            probe = _SynSocket(sock, targets)
            try:
                return run_batch(probe, targets, budget_s, timeout_s=self._timeout,
                                 max_in_flight=self._max, clock=self._clock)
            finally:
                probe.close()


class _SynSocket:
    """One round's raw TCP socket: SYNs out, SYN-ACK/RST in, matched by position."""

    def __init__(self, sock: socket.socket, targets: Sequence[Target]) -> None:
        self._sock = sock
        self._targets = targets
        self._sport = 32768 + int.from_bytes(os.urandom(2), "big") % 28000
        self._expect: dict[tuple[str, int, int], int] = {}  # (addr, port, our seq + 1) -> position
        self._sources: dict[str, str] = {}
        self._sums: dict[str, int] = {}
        # Sequence numbers only match answers to probes: a generator seeded from the OS per
        # round is as unguessable from outside as os.urandom per probe, at no syscall each.
        self._rng = random.Random(os.urandom(16))  # noqa: S311 (seeded from the OS each round)
        self._route = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        # Only segments to our source port reach us (not every TCP packet of the host).
        attach_filter(sock, [(LDX_IP_HEADER_LEN, 0, 0, 0), (LD_HALF_AT_X, 0, 0, 2),
                             (JEQ, 0, 1, self._sport), (RET, 0, 0, 0xFFFF), (RET, 0, 0, 0)])
        self._drain()  # what arrived before the filter

    def _drain(self) -> None:
        for _ in range(100_000):
            try:
                self._sock.recv(2048)
            except OSError:
                return

    def fileno(self) -> int:
        return self._sock.fileno()

    def _source(self, host: str) -> str:
        """Our address on the route to ``host`` (connecting a UDP socket sends nothing)."""
        src = self._sources.get(host)
        if src is None:
            self._route.connect((host, 9))
            src = self._sources[host] = self._route.getsockname()[0]
        return src

    def _fixed_sum(self, host: str) -> int:
        """The one's-complement sum of everything in a SYN to ``host`` but the port and the
        sequence number: the pseudo-header's addresses, protocol and length, our port,
        the offset, flags and window. Once per address a round."""
        total = self._sums.get(host)
        if total is None:
            src = self._source(host)
            words = socket.inet_aton(src) + socket.inet_aton(host) + struct.pack(
                "!BBHHBBH", 0, socket.IPPROTO_TCP, 20, self._sport, 5 << 4, _SYN, _WINDOW)
            total = self._sums[host] = sum(struct.unpack("!9H", words))
        return total

    def send_run(self, start: int, count: int) -> tuple[int, int | None]:
        return send_each(self.send, self._targets, start, count)

    def send(self, position: int, target: Target) -> int | None:
        if ":" in target.host:
            return errno.EAFNOSUPPORT
        try:
            fixed = self._fixed_sum(target.host)
        except OSError as exc:
            return exc.errno or errno.EIO
        seq = self._rng.getrandbits(32)
        total = fixed + target.port + (seq >> 16) + (seq & 0xFFFF)
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        segment = _HEADER.pack(self._sport, target.port, seq, 0, 5 << 4, _SYN, _WINDOW, ~total & 0xFFFF, 0)
        try:
            self._sock.sendto(segment, (target.host, 0))
        except OSError as exc:
            return exc.errno or errno.EIO
        self._expect[(target.host, target.port, (seq + 1) & 0xFFFFFFFF)] = position
        return None

    def receive(self) -> list[Answer]:
        out: list[Answer] = []
        for _ in range(100_000):  # bounded by what the socket holds
            try:
                data, addr = self._sock.recvfrom(2048)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if len(data) < 20:
                continue
            tcp = data[(data[0] & 0x0F) * 4:]
            if len(tcp) < 14:
                continue
            sport, dport, _seq, ack = struct.unpack("!HHII", tcp[:12])
            flags = tcp[13]
            if dport != self._sport or not (flags & _RST or flags & (_SYN | _ACK) == _SYN | _ACK):
                continue
            position = self._expect.pop((addr[0], sport, ack), None)
            if position is None:
                continue
            out.append((position, CheckOutcome.OK, "rst" if flags & _RST else "syn-ack"))
        return out

    def close(self) -> None:
        self._route.close()
