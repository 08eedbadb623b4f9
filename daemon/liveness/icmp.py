"""ICMP echo to every target in one batch: is the host's kernel up? No credentials, no log line.

One socket for the round: an unprivileged ICMP datagram socket
(``socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)``, allowed when the process's group is
in ``net.ipv4.ping_group_range``) or, failing that, a raw ICMP socket (needs
CAP_NET_RAW). Each target gets one echo request whose sequence number is its
position in the round (plus a random base) and whose payload carries a random
token of the round; a reply counts only from the target's address with that
sequence and token (and, on a raw socket, our identifier). A "destination
unreachable" or "time exceeded" for one of our requests is ``UNREACHABLE``.

What it sees: a powered-off host, a dead link, a kernel panic (silence). What it
cannot see: slurmd dead or frozen (the kernel answers), a site that drops ICMP
(silence from a live host: pair it with the SYN probe, b300.liveness.syn). IPv4
only: an IPv6 target is ``NOT_CHECKED``.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence

from .batch import (
    JEQ,
    LD_BYTE_AT_X,
    LD_HALF_AT_X,
    LDX_IP_HEADER_LEN,
    RET,
    Answer,
    attach_filter,
    checksum,
    errname,
    run_batch,
)
from .verdicts import CheckOutcome, CheckResult, Target

_ECHO_REQUEST, _ECHO_REPLY, _UNREACH, _TIME_EXCEEDED = 8, 0, 3, 11
_IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
_MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
_SO_EE_ORIGIN_ICMP = 2
_MAX_TARGETS = 65536  # sequence numbers are 16 bits: one per target of a round
_HEADER = struct.Struct("!BBHHH")


def _ones_sum(data: bytes) -> int:
    """The folded one's-complement sum of ``data`` (its checksum is ``~sum``)."""
    return ~checksum(data) & 0xFFFF


def open_icmp_socket() -> tuple[socket.socket, bool]:
    """An ICMP socket and whether it is a datagram (ping) socket. Raises OSError with
    the reason when neither kind may be opened here."""
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP), True
    except OSError as dgram:
        try:
            return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), False
        except OSError as raw:
            raise OSError(raw.errno, "ICMP datagram socket refused "
                          f"({errname(dgram.errno)}: the daemon's group is outside "
                          "net.ipv4.ping_group_range) and raw socket refused "
                          f"({errname(raw.errno)}: needs CAP_NET_RAW)") from None


class IcmpProber:
    """Checks a batch of targets by ICMP echo; see the module docstring for the contract."""

    def __init__(self, *, timeout_s: float, max_in_flight: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if timeout_s <= 0 or max_in_flight < 1:
            raise ValueError("timeout_s must be > 0 and max_in_flight >= 1")
        self._timeout = timeout_s
        self._max = max_in_flight
        self._clock = clock

    def check(self, targets: Sequence[Target], budget_s: float) -> list[CheckResult]:
        """One result per target, in the targets' order, within ``budget_s`` seconds."""
        if not targets:
            return []
        try:
            sock, dgram = open_icmp_socket()
        except OSError as exc:
            return [CheckResult(t.node, CheckOutcome.NOT_CHECKED, 0.0, f"icmp: {exc.strerror}")
                    for t in targets]
        with sock:
            probe = _EchoSocket(sock, dgram, targets)
            return run_batch(probe, targets, budget_s, timeout_s=self._timeout,
                             max_in_flight=self._max, clock=self._clock)


class _EchoSocket:
    """One round's ICMP socket: sends echo requests, reads replies and errors by position."""

    def __init__(self, sock: socket.socket, dgram: bool, targets: Sequence[Target]) -> None:
        self._sock = sock
        self._dgram = dgram
        self._targets = targets
        self._ident = int.from_bytes(os.urandom(2), "big")  # a ping socket's kernel sets its own
        self._base = int.from_bytes(os.urandom(2), "big")
        self._token = os.urandom(8)
        sock.setblocking(False)
        for size in (1 << 22, 1 << 20):  # room for a round's replies (the kernel may cap it)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
                break
            except OSError:
                continue
        if dgram:
            sock.setsockopt(socket.IPPROTO_IP, _IP_RECVERR, 1)
        else:
            # A raw socket gets every ICMP packet of the host: keep echo replies with our
            # identifier and the errors (unreachable, time exceeded), nothing else.
            attach_filter(sock, [
                (LDX_IP_HEADER_LEN, 0, 0, 0), (LD_BYTE_AT_X, 0, 0, 0),
                (JEQ, 0, 2, _ECHO_REPLY), (LD_HALF_AT_X, 0, 0, 4), (JEQ, 2, 3, self._ident),
                (JEQ, 1, 0, _UNREACH), (JEQ, 0, 1, _TIME_EXCEEDED), (RET, 0, 0, 0xFFFF), (RET, 0, 0, 0)])
            for _ in range(100_000):  # what arrived before the filter
                try:
                    sock.recv(2048)
                except OSError:
                    break
        # The checksum of a request is the fixed part's sum plus the sequence number's.
        self._fixed = _ones_sum(struct.pack("!BBHH", _ECHO_REQUEST, 0, 0, self._ident) + self._token)

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, position: int, target: Target) -> int | None:
        if ":" in target.host:
            return errno.EAFNOSUPPORT
        if position >= _MAX_TARGETS:
            return errno.E2BIG
        seq = (self._base + position) & 0xFFFF
        total = self._fixed + seq
        total = (total & 0xFFFF) + (total >> 16)
        packet = _HEADER.pack(_ECHO_REQUEST, 0, ~total & 0xFFFF, self._ident, seq) + self._token
        try:
            self._sock.sendto(packet, (target.host, 0))
        except OSError as exc:
            return exc.errno or errno.EIO
        return None

    def receive(self) -> list[Answer]:
        out: list[Answer] = []
        for _ in range(100_000):  # bounded by what the socket holds
            try:
                data, addr = self._sock.recvfrom(2048)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # an error on a datagram socket: read from its error queue
                if self._dgram:
                    out.extend(self._errors())
                continue
            answer = self._parse(data, addr[0])
            if answer is not None:
                out.append(answer)
        if self._dgram:
            out.extend(self._errors())
        return out

    def _position(self, seq: int, token: bytes, host: str | None) -> int | None:
        position = (seq - self._base) & 0xFFFF
        if position >= len(self._targets) or token != self._token:
            return None
        if host is not None and self._targets[position].host != host:
            return None
        return position

    def _parse(self, data: bytes, source: str) -> Answer | None:
        if not self._dgram:  # a raw socket reads the IP header too
            if len(data) < 20:
                return None
            data = data[(data[0] & 0x0F) * 4:]
        if len(data) < 16:
            return None
        kind, _code, _sum, ident, seq = struct.unpack("!BBHHH", data[:8])
        if kind == _ECHO_REPLY:
            if not self._dgram and ident != self._ident:
                return None
            position = self._position(seq, data[8:16], source)
            return None if position is None else (position, CheckOutcome.OK, "echo reply")
        if kind in (_UNREACH, _TIME_EXCEEDED) and not self._dgram:
            inner = data[8:]
            if len(inner) < 20:
                return None
            dest = socket.inet_ntoa(inner[16:20])
            echo = inner[(inner[0] & 0x0F) * 4:]
            if len(echo) < 8:
                return None
            ikind, _c, _s, iident, iseq = struct.unpack("!BBHHH", echo[:8])
            if ikind != _ECHO_REQUEST or iident != self._ident:
                return None
            # The quoted request may be cut to 8 bytes: the address and sequence identify it.
            position = (iseq - self._base) & 0xFFFF
            if position >= len(self._targets) or self._targets[position].host != dest:
                return None
            return position, CheckOutcome.UNREACHABLE, f"icmp type {kind} code {_code} from {source}"
        return None

    def _errors(self) -> list[Answer]:
        """ICMP errors queued on a datagram socket (IP_RECVERR): the request they quote."""
        out: list[Answer] = []
        for _ in range(100_000):
            try:
                data, ancdata, _flags, addr = self._sock.recvmsg(2048, 512, _MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if len(data) < 16:
                continue
            kind, _c, _s, _i, seq = struct.unpack("!BBHHH", data[:8])
            position = self._position(seq, data[8:16], addr[0] if addr else None)
            if kind != _ECHO_REQUEST or position is None:
                continue
            detail = "icmp error"
            for level, ctype, cdata in ancdata:
                if level == socket.IPPROTO_IP and ctype == _IP_RECVERR and len(cdata) >= 16:
                    ee_errno, origin, etype, ecode = struct.unpack("=IBBB", cdata[:7])
                    if origin == _SO_EE_ORIGIN_ICMP:
                        detail = f"icmp type {etype} code {ecode} ({errname(ee_errno)})"
                    else:
                        detail = errname(ee_errno)
            out.append((position, CheckOutcome.UNREACHABLE, detail))
        return out
