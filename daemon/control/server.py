"""The daemon's control socket: b300ctl's mutating commands go through here.

One JSON object per line each way over a Unix stream socket. The daemon
learns who is asking from the kernel (SO_PEERCRED), not from the request,
and allows changes only to root, its own user and members of the configured
admin group. The client side (b300ctl's) is :mod:`b300.control.client`.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import select
import socket
import socketserver
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from ..errors import UsageError
from .client import MAX_REQUEST_BYTES, ask_daemon, call_daemon

__all__ = ["ControlServer", "Peer", "ask_daemon", "call_daemon", "client_connected", "is_admin", "peer_of"]
log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    uid: int
    gid: int

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return f"uid:{self.uid}"


Handler = Callable[[dict[str, Any], Peer, Callable[[], bool]], dict[str, Any]]


def client_connected(sock: socket.socket) -> bool:
    """False once the client closed its end (it gave up, was killed, timed out).

    The client sends one request line and then only waits for the answer, so
    anything readable now is its end-of-file (or a hang-up).
    """
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLRDHUP)
    for _fd, events in poller.poll(0):
        if events & (select.POLLHUP | select.POLLRDHUP | select.POLLERR):
            return False
        if events & select.POLLIN:
            try:
                return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
            except BlockingIOError:
                return True
            except OSError:
                return False
    return True


def peer_of(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


def is_admin(peer: Peer, admin_group: str) -> bool:
    """Root, the daemon's own user, or a member of ``admin_group``."""
    if peer.uid in (0, os.geteuid()):
        return True
    if not admin_group:
        return False
    try:
        group = grp.getgrnam(admin_group)
    except KeyError:
        return False
    return peer.gid == group.gr_gid or peer.user in group.gr_mem


class _Server(socketserver.ThreadingUnixStreamServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr; one log line instead.
        exc = sys.exc_info()[1]
        log.error("control.request_failed", error=f"{type(exc).__name__}: {exc}"[:300])


class ControlServer:
    """Serves ``handler`` on a Unix socket in a background thread."""

    def __init__(self, path: str, handler: Handler, *, admin_group: str = "") -> None:
        self.path = path
        outer_handler = handler

        class _Req(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                peer = peer_of(self.connection)
                op = None
                try:
                    line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
                except OSError as exc:
                    log.warning("control.client_gone", op=op, error=type(exc).__name__)
                    return
                try:
                    if len(line) > MAX_REQUEST_BYTES:
                        raise UsageError("request too large")
                    request = json.loads(line)
                    if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                        raise UsageError("request must be a JSON object with an 'op'")
                    op = request["op"][:64]
                    conn = self.connection
                    reply = outer_handler(request, peer, lambda: client_connected(conn))
                except (ValueError, UsageError) as exc:
                    reply = {"ok": False, "error": str(exc), "exit_code": 2}
                try:
                    self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")
                    self.wfile.flush()
                except OSError as exc:  # BrokenPipe/ConnectionReset: the client left
                    log.warning("control.client_gone", op=op, error=type(exc).__name__,
                                why="the client left before the answer")

            def finish(self) -> None:
                # The base class flushes again: a client that left is not a traceback.
                with contextlib.suppress(OSError):
                    super().finish()

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)  # stale from a crash; the daemon's lock file says we own it
        self._server = _Server(path, _Req)
        self._server.daemon_threads = True
        os.chmod(path, 0o660)
        if admin_group:
            try:
                os.chown(path, -1, grp.getgrnam(admin_group).gr_gid)
            except (KeyError, PermissionError) as exc:
                log.warning("control.group", group=admin_group, error=str(exc))
        self._thread = threading.Thread(target=self._server.serve_forever, name="control",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def set_group(self, admin_group: str) -> None:
        """Give the socket to a new admin group (config reload)."""
        if not admin_group:
            return
        try:
            os.chown(self.path, -1, grp.getgrnam(admin_group).gr_gid)
        except (KeyError, PermissionError) as exc:
            log.warning("control.group", group=admin_group, error=str(exc))

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
