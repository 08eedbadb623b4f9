"""The primary check: a TCP connect to each node's slurmd, all nodes in one batch, one thread.

Non-blocking ``connect()`` on every target (at most ``max_in_flight`` at once),
one ``selectors`` loop waiting for them, each socket closed as soon as the
handshake is done or refused. No shell, no DNS (targets are IP literals), no
thread per node. What the outcomes mean, and what a TCP connect cannot see (a
frozen slurmd: the kernel still completes the handshake on its listen
backlog), is measured in docs/benchmarks.md ("Liveness checks").

Guarantees: :meth:`TcpProber.check` returns one result per target, never
raises for a node's trouble, and returns within ``budget_s`` (plus one
``select`` tick). Every check starts as soon as a slot is free; one the round's
end cuts before its own timeout, or that never started, is ``NOT_CHECKED`` (a
silence shorter than the timeout is no miss). A round whose loop woke up later
than it asked by more than half the timeout (the daemon starved of CPU,
stopped) reports its timeouts as ``NOT_CHECKED`` too: the silence was ours.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .batch import errname, round_results
from .verdicts import CheckOutcome, CheckResult, Target

_REFUSED = {errno.ECONNREFUSED, errno.ECONNRESET}
_UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN}
# Our own shortage, not the node's: no evidence either way.
_OURS = {errno.EMFILE, errno.ENFILE, errno.EADDRNOTAVAIL, errno.ENOBUFS, errno.ENOMEM}


@dataclass(slots=True)
class _Pending:
    position: int  # in the caller's list (the same target may be listed twice)
    target: Target
    sock: socket.socket
    started: float


class TcpProber:
    """Checks a batch of targets by TCP connect; see the module docstring for the contract."""

    def __init__(self, *, timeout_s: float, max_in_flight: int = 512,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if timeout_s <= 0 or max_in_flight < 1:
            raise ValueError("timeout_s must be > 0 and max_in_flight >= 1")
        self._timeout = timeout_s
        self._max = max_in_flight
        self._clock = clock

    def check(self, targets: Sequence[Target], budget_s: float) -> list[CheckResult]:
        """One result per target, in the targets' order, within ``budget_s`` seconds."""
        start = self._clock()
        deadline = start + budget_s
        queue = deque(enumerate(targets))
        results: dict[int, CheckResult] = {}
        pending: dict[int, _Pending] = {}
        by_start: deque[tuple[float, int, _Pending]] = deque()  # started in order: oldest first
        late = 0.0  # how much later than asked the loop woke up, at worst (its own stall)
        with selectors.DefaultSelector() as sel:
            try:
                while queue or pending:
                    now = self._clock()
                    if now >= deadline:
                        for key, _ in sel.select(0):  # what answered in time still counts
                            p = pending.pop(key.fd)
                            sel.unregister(p.sock)
                            results[p.position] = _finish(p, now)
                        break
                    while queue and len(pending) < self._max and now < deadline:
                        position, t = queue.popleft()
                        done = self._start(position, t, sel, pending, by_start, now)
                        if done is not None:
                            results[position] = done
                        now = self._clock()
                    while by_start and pending.get(by_start[0][1]) is not by_start[0][2]:
                        by_start.popleft()  # finished already (its fd may be reused by now)
                    while by_start and now - by_start[0][0] >= self._timeout:
                        _, fd, p = by_start.popleft()
                        if pending.get(fd) is not p:
                            continue
                        del pending[fd]
                        sel.unregister(p.sock)
                        p.sock.close()
                        results[p.position] = CheckResult(
                            p.target.node, CheckOutcome.TIMEOUT, now - p.started, "no answer")
                    if not pending:
                        continue
                    wait = max(0.0, min(by_start[0][0] + self._timeout, deadline) - now, 0.0)
                    wait = min(wait, 0.05)
                    ready = sel.select(wait)
                    woke = self._clock()
                    late = max(late, woke - now - wait)
                    for key, _ in ready:
                        p = pending.pop(key.fd)
                        sel.unregister(p.sock)
                        results[p.position] = _finish(p, woke)
            finally:
                end = self._clock()
                for p in pending.values():
                    p.sock.close()
                    # Cut by the round's end before its own timeout: a silence too short to count.
                    results[p.position] = CheckResult(
                        p.target.node, CheckOutcome.NOT_CHECKED, end - p.started,
                        "the round ended before its timeout")
        return round_results(targets, results, late=late, timeout_s=self._timeout,
                             unsent="not started within this round's budget", missed="timeout")

    def _start(self, position: int, t: Target, sel: selectors.BaseSelector, pending: dict[int, _Pending],
               by_start: deque[tuple[float, int, _Pending]], now: float) -> CheckResult | None:
        family = socket.AF_INET6 if ":" in t.host else socket.AF_INET
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            return CheckResult(t.node, CheckOutcome.NOT_CHECKED, 0.0, f"socket: {errname(exc.errno)}")
        sock.setblocking(False)
        rc = sock.connect_ex((t.host, t.port))
        if rc in (errno.EINPROGRESS, errno.EAGAIN):
            p = pending[sock.fileno()] = _Pending(position, t, sock, now)
            by_start.append((now, sock.fileno(), p))
            sel.register(sock, selectors.EVENT_WRITE)
            return None
        sock.close()
        return _outcome(t, rc, self._clock() - now)


def _finish(p: _Pending, now: float) -> CheckResult:
    try:
        rc = p.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    except OSError as exc:
        rc = exc.errno or errno.EIO
    finally:
        # A plain close (FIN): slurmd logs one line per check either way, a reset two.
        p.sock.close()
    return _outcome(p.target, rc, now - p.started)


def _outcome(t: Target, rc: int, latency: float) -> CheckResult:
    if rc == 0:
        return CheckResult(t.node, CheckOutcome.OK, latency)
    name = errname(rc)
    if rc in _REFUSED:
        return CheckResult(t.node, CheckOutcome.REFUSED, latency, name)
    if rc in _UNREACHABLE:
        return CheckResult(t.node, CheckOutcome.UNREACHABLE, latency, name)
    if rc == errno.ETIMEDOUT:
        return CheckResult(t.node, CheckOutcome.TIMEOUT, latency, name)
    if rc in _OURS:
        return CheckResult(t.node, CheckOutcome.NOT_CHECKED, latency, name)
    return CheckResult(t.node, CheckOutcome.ERROR, latency, name)
