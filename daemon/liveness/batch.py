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
    """One socket that probes many targets. ``send_run(start, count)`` sends probes to
    targets ``start`` .. ``start + count - 1`` in order and returns how many were sent and
    the errno of the first that was not (None: all sent, or stopped early without an
    error: call again); ``receive`` drains what is readable now (never blocks) into
    answers by position."""

    def fileno(self) -> int: ...

    def send_run(self, start: int, count: int) -> tuple[int, int | None]: ...

    def receive(self) -> list[Answer]: ...


def send_each(send: Callable[[int, Target], int | None], targets: Sequence[Target], start: int,
              count: int) -> tuple[int, int | None]:
    """``send_run`` for a socket that sends one probe per call (``send`` returns an errno or None)."""
    for k in range(count):
        rc = send(start + k, targets[start + k])
        if rc is not None:
            return k, rc
    return count, None


#: After a wake-up for answers, the loop reads again no sooner than this (seconds), so that
#: answers trickling in one by one are read in batches, not one wake-up each; it is also
#: the resolution of the latencies reported. Timeouts and the round's end are not delayed.
GATHER_S = 0.002


def run_batch(sock: ProbeSocket, targets: Sequence[Target], budget_s: float, *, timeout_s: float,
              max_in_flight: int, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> list[CheckResult]:
    """One result per target, in the targets' order, within ``budget_s`` (plus one select tick)."""
    start = clock()
    deadline = start + budget_s
    n = len(targets)
    cursor = 0  # the next target to send to: targets are sent in order
    results: dict[int, CheckResult] = {}
    sent: dict[int, float] = {}
    by_send: deque[tuple[float, int, int]] = deque()  # (sent at, first, stop): one per send call
    late = 0.0
    blocked = False  # the last send found the socket buffer full
    with selectors.DefaultSelector() as sel:
        sel.register(sock.fileno(), selectors.EVENT_READ)
        for _ in range(10_000_000):  # bounded: the deadline ends it long before
            now = clock()
            if now >= deadline or not (cursor < n or sent):
                break
            blocked = False
            for _ in range(n + 1):  # bounded: each pass sends at least one probe or stops
                room = min(max_in_flight - len(sent), n - cursor)
                if room <= 0:
                    break
                went, rc = sock.send_run(cursor, room)
                if went:
                    first, cursor = cursor, cursor + went
                    sent.update(dict.fromkeys(range(first, cursor), now))
                    by_send.append((now, first, cursor))
                if rc in RETRY_LATER or (rc is None and not went):
                    blocked = True
                    break
                if rc is not None:
                    results[cursor] = _send_failed(targets[cursor], rc)
                    cursor += 1
            _collect(sock.receive(), targets, sent, results, now)
            while by_send and now - by_send[0][0] >= timeout_s:
                at, first, stop = by_send.popleft()
                for position in range(first, stop):
                    if sent.pop(position, None) is not None:
                        results[position] = CheckResult(targets[position].node, CheckOutcome.TIMEOUT,
                                                        now - at, "silent")
            if not sent:
                by_send.clear()  # every probe sent so far is decided
                if cursor >= n:
                    break
            if not blocked and cursor < n and len(sent) < max_in_flight:
                continue  # answers freed room in the window: send more now
            oldest = by_send[0][0] + timeout_s if by_send else now + 0.005
            wait = min(max(0.0, min(oldest, deadline) - now), 0.005 if blocked else 0.05)
            ready = sel.select(wait)
            woke = clock()
            late = max(late, woke - now - wait)
            if ready:
                # Let the answers of this window gather (bounded by the next timeout and the end).
                pause = min(GATHER_S - (woke - now), oldest - woke, deadline - woke)
                if pause > 0:
                    sleep(pause)
                    woke = clock()
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
    if len(results) == len(targets) and not stalled:  # every target has its result
        return list(map(results.__getitem__, range(len(targets))))
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
    pop = sent.pop
    for position, outcome, detail in answers:
        at = pop(position, None)
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
