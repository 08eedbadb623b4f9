"""The batch loop of the host-level probes (ICMP echo, TCP SYN): one socket, every target.

A :class:`ProbeSocket` sends one probe per target and turns what comes back into
``(position, outcome, detail)`` answers; :func:`run_batch` drives it: at most
``max_in_flight`` probes waiting at once, each one a miss (``TIMEOUT``: silence)
``timeout_s`` after it was sent, the whole round within ``budget_s``. No thread, no
shell, no DNS (targets are IP literals).

Guarantees (as :class:`b300.liveness.tcp.TcpProber`): one result per target, in order;
never raises for a node's trouble; a probe the round's end cuts before its timeout, or
never sent, is ``NOT_CHECKED``; a round whose loop woke up later than it asked by more
than half the timeout (the daemon starved of CPU) reports its silences as
``NOT_CHECKED`` (the silence was ours).
"""

from __future__ import annotations

import ctypes
import errno
import os
import selectors
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from .verdicts import CheckOutcome, CheckResult, Target

#: The socket buffer is full: wait for room, the probe is sent later in the round.
RETRY_LATER = frozenset({errno.EAGAIN, errno.ENOBUFS})
#: The route or the neighbour is gone: the kernel's word that the host cannot be reached.
UNREACHABLE = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN})

Answer = tuple[int, CheckOutcome, str]


class ProbeSocket(Protocol):
    """One socket that probes many targets. ``send`` returns None (sent) or an errno;
    ``receive`` drains what is readable now (never blocks) into answers by position."""

    def fileno(self) -> int: ...

    def send(self, position: int, target: Target) -> int | None: ...

    def receive(self) -> list[Answer]: ...


def run_batch(sock: ProbeSocket, targets: Sequence[Target], budget_s: float, *, timeout_s: float,
              max_in_flight: int, clock: Callable[[], float] = time.monotonic) -> list[CheckResult]:
    """One result per target, in the targets' order, within ``budget_s`` (plus one select tick)."""
    start = clock()
    deadline = start + budget_s
    queue = deque(range(len(targets)))
    results: dict[int, CheckResult] = {}
    sent: dict[int, float] = {}
    by_send: deque[tuple[float, int]] = deque()
    late = 0.0
    blocked = False  # the last send found the socket buffer full
    with selectors.DefaultSelector() as sel:
        sel.register(sock.fileno(), selectors.EVENT_READ)
        for _ in range(10_000_000):  # bounded: the deadline ends it long before
            now = clock()
            if now >= deadline or not (queue or sent):
                break
            blocked = False
            while queue and len(sent) < max_in_flight:
                position = queue[0]
                rc = sock.send(position, targets[position])
                if rc in RETRY_LATER:
                    blocked = True
                    break
                queue.popleft()
                if rc is None:
                    sent[position] = now
                    by_send.append((now, position))
                else:
                    results[position] = _send_failed(targets[position], rc)
            _collect(sock.receive(), targets, sent, results, now)
            while by_send and (by_send[0][1] not in sent or now - by_send[0][0] >= timeout_s):
                at, position = by_send.popleft()
                if sent.pop(position, None) is not None:
                    results[position] = CheckResult(targets[position].node, CheckOutcome.TIMEOUT,
                                                    now - at, "silent")
            if not sent and not queue:
                break
            oldest = by_send[0][0] + timeout_s if by_send else now + 0.005
            wait = min(max(0.0, min(oldest, deadline) - now), 0.005 if blocked else 0.05)
            ready = sel.select(wait)
            woke = clock()
            late = max(late, woke - now - wait)
            if ready:
                _collect(sock.receive(), targets, sent, results, woke)
        end = clock()
        _collect(sock.receive(), targets, sent, results, end)  # what answered in time still counts
    for position, at in sent.items():
        results[position] = CheckResult(targets[position].node, CheckOutcome.NOT_CHECKED, end - at,
                                        "the round ended before its timeout")
    return round_results(targets, results, late=late, timeout_s=timeout_s,
                         unsent="not sent within this round's budget", missed="silence")


def round_results(targets: Sequence[Target], results: dict[int, CheckResult], *, late: float,
                  timeout_s: float, unsent: str, missed: str) -> list[CheckResult]:
    """One result per target, in order: a target with none is NOT_CHECKED (``unsent``), and
    a round whose loop woke up later than asked by more than half the timeout (the daemon
    starved of CPU, stopped) reports its timeouts as NOT_CHECKED: the silence was ours."""
    stalled = late > timeout_s / 2
    out = []
    for i, t in enumerate(targets):
        r = results.get(i) or CheckResult(t.node, CheckOutcome.NOT_CHECKED, 0.0, unsent)
        if stalled and r.outcome is CheckOutcome.TIMEOUT:
            r = CheckResult(t.node, CheckOutcome.NOT_CHECKED, r.latency_s,
                            f"prober held up {late:.2f} s: {missed} not counted")
        out.append(r)
    return out


def _collect(answers: list[Answer], targets: Sequence[Target], sent: dict[int, float],
             results: dict[int, CheckResult], now: float) -> None:
    for position, outcome, detail in answers:
        at = sent.pop(position, None)
        if at is not None:  # a late or duplicate answer of a probe already decided is ignored
            results[position] = CheckResult(targets[position].node, outcome, now - at, detail)


def _send_failed(t: Target, rc: int) -> CheckResult:
    name = errname(rc)
    if rc in UNREACHABLE:
        return CheckResult(t.node, CheckOutcome.UNREACHABLE, 0.0, name)
    return CheckResult(t.node, CheckOutcome.NOT_CHECKED, 0.0, f"send: {name}")


def errname(rc: int | None) -> str:
    if rc is None:
        return "unknown error"
    return f"{errno.errorcode.get(rc, str(rc))} ({os.strerror(rc)})"


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``, as a number to pack big-endian.

    Summed in the machine's byte order (16-bit words through a memoryview: no Python loop)
    and swapped at the end: the one's-complement sum does not depend on the order."""
    if len(data) % 2:
        data += b"\0"
    total = sum(memoryview(data).cast("H"))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    result = ~total & 0xFFFF
    return result if sys.byteorder == "big" else ((result >> 8) | (result << 8)) & 0xFFFF


_SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)
# Classic BPF opcodes, for a raw socket's packet (it starts at the IP header).
LDX_IP_HEADER_LEN = 0xB1   # X = 4 * (packet[0] & 0xf)
LD_BYTE_AT_X = 0x50        # A = packet[X + k] (1 byte)
LD_HALF_AT_X = 0x48        # A = packet[X + k : X + k + 2] (network order)
JEQ = 0x15                 # if A == k: skip jt, else skip jf
RET = 0x06                 # accept k bytes (0: drop)
Instruction = tuple[int, int, int, int]


def attach_filter(sock: socket.socket, program: Sequence[Instruction]) -> bool:
    """Let the kernel drop what ``sock`` need not read (a raw socket gets a copy of every
    packet of its protocol on the host); False when it refused (every packet is then read
    and matched here, which is slower, not wrong)."""
    code = b"".join(struct.pack("=HBBI", op, jt, jf, k) for op, jt, jf, k in program)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("HP", len(program), ctypes.addressof(buf))  # struct sock_fprog, native layout
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, prog)
    except OSError:
        return False
    return True
