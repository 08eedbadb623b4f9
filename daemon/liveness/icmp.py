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

import bisect
import contextlib
import errno
import os
import socket
import struct
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from operator import attrgetter

from . import mmsg
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
    send_each,
)
from .verdicts import CheckOutcome, CheckResult, Target

_ECHO_REQUEST, _ECHO_REPLY, _UNREACH, _TIME_EXCEEDED = 8, 0, 3, 11
_IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
_MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
_SO_EE_ORIGIN_ICMP = 2
_MAX_TARGETS = 65536  # sequence numbers are 16 bits: one per target of a round
_HEADER = struct.Struct("!BBHHH")
_REPLY = struct.Struct("!HH8s")  # an echo reply's identifier, sequence number and our token
_PACKET = 16  # an echo request: the 8-byte header and the round's 8-byte token
_IPV4_NO_OPTIONS = 0x45  # version 4, a 20-byte header
# One slot of a batched read: (raw) the IP header's first byte and the source address,
# then the ICMP type, identifier, sequence number and payload; (datagram) the ICMP header
# starts the slot, the sender is in the slot's sockaddr_in.
_RAW_SLOT = struct.Struct(f"!B11x4s4xBxxxHH8s{mmsg.SLOT_SIZE - 36}x")
_DGRAM_SLOT = struct.Struct(f"!BxxxHH8s{mmsg.SLOT_SIZE - 16}x")
_NAME = struct.Struct("4x4s8x")
_IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
_HOST = attrgetter("host")
_SOL_RAW, _ICMP_FILTER = 255, 1  # linux/icmp.h: the ICMP types a raw socket turns away (a bit each)
_IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)


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
        self._plan: _Plan | None = None

    def check(self, targets: Sequence[Target], budget_s: float) -> list[CheckResult]:
        """One result per target, in the targets' order, within ``budget_s`` seconds."""
        if not targets:
            return []
        try:
            sock, dgram = open_icmp_socket()
        except OSError as exc:
            return [CheckResult(t.node, CheckOutcome.NOT_CHECKED, 0.0, f"icmp: {exc.strerror}")
                    for t in targets]
        hosts = tuple(map(_HOST, targets))
        if self._plan is None or self._plan.hosts != hosts:  # the nodes in use changed
            self._plan = _Plan(hosts)
        with sock:
            probe = _EchoSocket(sock, dgram, targets, self._plan)
            return run_batch(probe, targets, budget_s, timeout_s=self._timeout,
                             max_in_flight=self._max, clock=self._clock)


class _Plan:
    """What stays the same from round to round while the nodes in use do: each target's
    address (4 bytes, or None: not an IPv4 target, or past the 65,536 a round can number),
    and the buffers of the batched send (b300.liveness.mmsg), when the system has it."""

    def __init__(self, hosts: tuple[str, ...]) -> None:
        self.hosts = hosts
        self.addrs: list[bytes | None] = [
            None if ":" in h or i >= _MAX_TARGETS else socket.inet_aton(h) for i, h in enumerate(hosts)]
        self.unsendable = [i for i, a in enumerate(self.addrs) if a is None]
        # Each position's address as the 32-bit word a read slot holds (no address: -1),
        # for every sequence offset a round can have: a reply's offset indexes it as is.
        words = [-1 if a is None else int.from_bytes(a, sys.byteorder) for a in self.addrs[:_MAX_TARGETS]]
        self.words = words + [-1] * (_MAX_TARGETS - len(words))
        self.batch = mmsg.SendBatch([a or bytes(4) for a in self.addrs], _PACKET) if mmsg.available() else None
        self.ring = mmsg.RecvRing() if self.batch is not None else None


def _network_words(values: range) -> array[int]:
    words = array("H", values)
    if sys.byteorder == "little":
        words.byteswap()
    return words


# Every 16-bit value in network byte order, rising (a sequence number) and falling from
# 0xFFFE (a checksum: 0xFFFF is not one): a round's requests take a slice of each.
_RISING = _network_words(range(_MAX_TARGETS))
_FALLING = _network_words(range(0xFFFE, -1, -1))


def echo_packets(count: int, ident: int, base: int, token: bytes) -> bytes:
    """``count`` echo requests of :data:`_PACKET` bytes, request i with sequence number
    ``base + i`` (``base + count`` <= 65,536) and the 8-byte ``token`` as payload, each with
    its checksum (pure)."""
    buf = bytearray(count * _PACKET)
    write_echo_packets(memoryview(buf), count, ident, base, token)
    return bytes(buf)


def write_echo_packets(buf: memoryview, count: int, ident: int, base: int, token: bytes) -> None:
    """:func:`echo_packets` written over the first ``count * 16`` bytes of ``buf`` in place
    (a round writes them into the send buffers kept from round to round).

    Written without a Python step per packet, a field at a time for all packets: the
    requests differ only in the sequence number and the checksum; as the sequence grows by
    one the one's-complement sum grows by one and the checksum (its complement) falls by
    one, wrapping from 0 to 0xFFFE."""
    if base < 0 or base + count > _MAX_TARGETS or len(token) != 8:
        raise ValueError(f"{count} requests from sequence {base} with a token of {len(token)} bytes")
    if count == 0:
        return
    template = _HEADER.pack(_ECHO_REQUEST, 0, 0, ident, 0) + token
    first = (_ones_sum(template) + base - 1) % 0xFFFF  # the sum of request 0, less one, mod 0xFFFF
    sums = _FALLING[first:first + count]  # 0xFFFE - first, one less each, and on from 0xFFFE
    if len(sums) < count:
        sums.extend(_FALLING[:count - len(sums)])
    seqs = _RISING[base:base + count]
    buf[:count * _PACKET] = template * count  # what every request shares
    words = buf[:count * _PACKET].cast("H")
    words[1::_PACKET // 2] = sums
    words[3::_PACKET // 2] = seqs


_SEQUENCES = list(range(_MAX_TARGETS))


def _offsets(base: int) -> list[int]:
    """For each sequence number, its offset from ``base`` (mod 65,536): the position it names."""
    return _SEQUENCES[_MAX_TARGETS - base:] + _SEQUENCES[:_MAX_TARGETS - base]


class _EchoSocket:
    """One round's ICMP socket: sends echo requests, reads replies and errors by position."""

    def __init__(self, sock: socket.socket, dgram: bool, targets: Sequence[Target], plan: _Plan) -> None:
        self._sock = sock
        self._dgram = dgram
        self._targets = targets
        self._plan = plan
        self._ident = int.from_bytes(os.urandom(2), "big")  # a ping socket's kernel sets its own
        count = min(len(targets), _MAX_TARGETS)
        # Sequence numbers base .. base + count - 1: no wrap inside a round.
        self._base = int.from_bytes(os.urandom(3), "big") % (_MAX_TARGETS - count + 1)
        self._token = os.urandom(8)
        if plan.batch is not None:  # written in place over the last round's
            write_echo_packets(plan.batch.packets(), count, self._ident, self._base, self._token)
            self._packets = b""
        else:
            self._packets = echo_packets(count, self._ident, self._base, self._token)
        # What every slot of a batched read of echo replies holds, column by column (_batch_ok).
        slots = mmsg.RING_SLOTS
        self._lead = bytes([_IPV4_NO_OPTIONS]) * slots
        self._ident_high = bytes([self._ident >> 8]) * slots
        self._ident_low = bytes([self._ident & 0xFF]) * slots
        self._token_bytes = [bytes([b]) * slots for b in self._token]
        self._offsets = _offsets(self._base)
        self._oks = [CheckOutcome.OK] * slots
        self._oks_detail = ["echo reply"] * slots
        sock.setblocking(False)
        for size in (1 << 22, 1 << 20):  # room for a round's replies (the kernel may cap it)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
                break
            except OSError:
                continue
        # Don't fragment: a 36-byte request never needs it, and the kernel then skips
        # choosing an IP identification for each one.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)
        if dgram:
            sock.setsockopt(socket.IPPROTO_IP, _IP_RECVERR, 1)
        else:
            # A raw socket gets every ICMP packet of the host: keep echo replies with our
            # identifier and the errors (unreachable, time exceeded), nothing else. The
            # kernel's ICMP type filter turns the other types away before it copies them
            # for the socket; the program below then checks the identifier.
            with contextlib.suppress(OSError):
                sock.setsockopt(_SOL_RAW, _ICMP_FILTER, struct.pack(
                    "=I", ~((1 << _ECHO_REPLY) | (1 << _UNREACH) | (1 << _TIME_EXCEEDED)) & 0xFFFFFFFF))
            attach_filter(sock, [
                (LDX_IP_HEADER_LEN, 0, 0, 0), (LD_BYTE_AT_X, 0, 0, 0),
                (JEQ, 0, 2, _ECHO_REPLY), (LD_HALF_AT_X, 0, 0, 4), (JEQ, 2, 3, self._ident),
                (JEQ, 1, 0, _UNREACH), (JEQ, 0, 1, _TIME_EXCEEDED), (RET, 0, 0, 0xFFFF), (RET, 0, 0, 0)])
            for _ in range(100_000):  # what arrived before the filter
                try:
                    sock.recv(2048)
                except OSError:
                    break

    def fileno(self) -> int:
        return self._sock.fileno()

    def send_run(self, start: int, count: int) -> tuple[int, int | None]:
        unsendable = self._plan.unsendable
        stop = bisect.bisect_left(unsendable, start)
        if stop < len(unsendable):
            if unsendable[stop] == start:
                return 0, errno.EAFNOSUPPORT if start < _MAX_TARGETS else errno.E2BIG
            count = min(count, unsendable[stop] - start)
        if self._plan.batch is not None:
            return self._plan.batch.send(self._sock.fileno(), start, count)
        return send_each(self._send, self._targets, start, count)

    def _send(self, position: int, target: Target) -> int | None:
        try:
            self._sock.sendto(self._packets[position * _PACKET:(position + 1) * _PACKET], (target.host, 0))
        except OSError as exc:
            return exc.errno or errno.EIO
        return None

    def receive(self) -> list[Answer]:
        out: list[Answer] = []
        ring = self._plan.ring
        for _ in range(100_000 if ring is None else 1 + 100_000 // mmsg.RING_SLOTS):  # bounded
            if ring is not None:
                got, err, blob, lens, names = ring.recv(self._sock.fileno())
                if got:
                    self._slots(got, blob, lens, names, out)
                    if got < mmsg.RING_SLOTS:
                        break
                    continue
                if err is None or err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR) or not self._dgram:
                    break
                out.extend(self._errors())  # an error on a datagram socket: read its error queue
                continue
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

    def _slots(self, got: int, blob: bytes, lens: list[int], names: bytes, out: list[Answer]) -> None:
        """The packets of one batched read (b300.liveness.mmsg.RecvRing).

        First for the whole read at once, with no Python step per packet: when every slot
        is a whole echo reply (no IP options) of this round (type, token and, on a raw
        socket, identifier) from the address its sequence number names, all are answers.
        Else slot by slot: the fields of an echo reply read for every slot at once
        (``iter_unpack``); a slot that is not one (an ICMP error, an IP header with
        options) goes through :meth:`_parse`."""
        if self._batch_ok(got, blob, lens, names, out):
            return
        addrs, count, base = self._plan.addrs, len(self._targets), self._base
        token, ident = self._token, self._ident
        raw = not self._dgram
        if raw:
            fields = _RAW_SLOT.iter_unpack(blob)
        else:
            fields = ((kind, src, kind, i, seq, t) for (kind, i, seq, t), (src,)
                      in zip(_DGRAM_SLOT.iter_unpack(blob), _NAME.iter_unpack(names), strict=True))
        lead, reply_len = (_IPV4_NO_OPTIONS, 36) if raw else (_ECHO_REPLY, 16)
        for j, (first, src, kind, got_ident, seq, got_token) in enumerate(fields):
            if first == lead and kind == _ECHO_REPLY and lens[j] >= reply_len:
                position = (seq - base) & 0xFFFF
                if position < count and got_token == token and addrs[position] == src \
                        and (got_ident == ident or not raw):
                    out.append((position, CheckOutcome.OK, "echo reply"))
            elif raw:
                o = j * mmsg.SLOT_SIZE
                size = min(lens[j], mmsg.SLOT_SIZE)
                if size >= 20:
                    answer = self._parse(blob[o:o + size], socket.inet_ntoa(blob[o + 12:o + 16]))
                    if answer is not None:
                        out.append(answer)

    def _batch_ok(self, got: int, blob: bytes, lens: list[int], names: bytes, out: list[Answer]) -> bool:
        """:meth:`_slots` for a read of this round's echo replies only: True when every slot
        is one (their answers are added to ``out``), False (nothing added) otherwise."""
        size = mmsg.SLOT_SIZE
        if self._dgram:
            header = 0  # the ICMP header starts the slot; the sender is in its sockaddr_in
            sources = memoryview(names).cast("I")[1::4].tolist()
            if min(lens) < 16:
                return False
        else:
            header = 20  # the IP header (20 bytes: no options) and the sender's address in it
            if min(lens) < 36 or blob[0::size] != self._lead[:got]:
                return False
            sources = memoryview(blob).cast("I")[3::size // 4].tolist()
            if blob[header + 4::size] != self._ident_high[:got] \
                    or blob[header + 5::size] != self._ident_low[:got]:
                return False
        if blob[header::size] != bytes(got):  # type 0: echo reply
            return False
        for k in range(8):  # the round's token, byte by byte across the slots
            if blob[header + 8 + k::size] != self._token_bytes[k][:got]:
                return False
        seqs = array("H", memoryview(blob).cast("H")[(header + 6) // 2::size // 2].tobytes())
        if sys.byteorder == "little":
            seqs.byteswap()
        positions = list(map(self._offsets.__getitem__, seqs))
        if max(positions) >= len(self._targets) \
                or list(map(self._plan.words.__getitem__, positions)) != sources:
            return False
        out.extend(zip(positions, self._oks[:got], self._oks_detail[:got], strict=True))
        return True

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
