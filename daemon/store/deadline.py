"""A client-side deadline for database calls, whatever the network does.

``statement_timeout`` is enforced by the server, so it cannot end a call whose
bytes never reach the server: a path that stops forwarding while keeping the
sockets open (a hung proxy, a partition behind a middlebox that still ACKs)
leaves the client blocked in ``recv`` for the kernel's TCP timeouts (hours
with the defaults). Keepalives and ``tcp_user_timeout`` do not help when
something on the path acknowledges the packets.

:class:`SocketWatchdog` arms a deadline on a connection's socket before a
call and disarms it after; a call still running at its deadline has its
socket shut down (``shutdown(SHUT_RDWR)`` on a duplicate of the descriptor),
which wakes the blocked driver with an error at once. One thread serves
every armed deadline.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time

import structlog

log = structlog.get_logger(__name__)


class SocketWatchdog:
    """Shuts down the socket of a call that outlives its deadline."""

    def __init__(self, name: str = "db-deadline") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, int] = {}  # token -> fd, while the call runs
        self._fired: set[int] = set()
        self._tokens = itertools.count(1)
        self._thread: threading.Thread | None = None

    def arm(self, fd: int, timeout_s: float) -> int:
        """Watch ``fd`` for ``timeout_s``; the token is for :meth:`disarm`."""
        with self._cond:
            token = next(self._tokens)
            self._armed[token] = fd
            heapq.heappush(self._heap, (time.monotonic() + timeout_s, token))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
            return token

    def disarm(self, token: int) -> bool:
        """Stop watching; True if the deadline had passed and the socket was shut down."""
        with self._cond:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, token = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                fd = self._armed.get(token)
                if fd is None:
                    continue
                # Still under the lock: the call cannot disarm and close (and so
                # free the descriptor number for reuse) while we shut it down.
                self._fired.add(token)
                _shutdown(fd)
                log.warning("db.call_timed_out", fd=fd,
                            why="no answer from the database in time; connection shut down")


def _shutdown(fd: int) -> None:
    with contextlib.suppress(OSError):
        dup = os.dup(fd)
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            return
        with sock:
            sock.shutdown(socket.SHUT_RDWR)
