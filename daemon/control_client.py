"""The client side of the daemon's control socket (b300ctl's): one request, one reply.

Standard library only, so that b300ctl pays for nothing more than a socket to ask
the daemon (the server side, :mod:`b300.control`, logs through structlog).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from typing import Any

from .errors import DaemonUnavailableError

MAX_REQUEST_BYTES = 4 << 20


def call_daemon(path: str, request: dict[str, Any], timeout: float = 180.0) -> dict[str, Any]:
    """Send one request to the daemon and return its reply object.

    The request carries ``deadline`` (Unix time, now + ``timeout``): the
    daemon drops it unexecuted once that has passed, as b300ctl has given up.
    """
    request = {**request, "deadline": time.time() + timeout}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise _unavailable(path, exc) from None
    try:
        with sock, sock.makefile("rwb") as f:
            f.write(json.dumps(request).encode() + b"\n")
            f.flush()
            line = f.readline(MAX_REQUEST_BYTES)
    except TimeoutError:
        raise DaemonUnavailableError(f"b300d did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise DaemonUnavailableError(f"lost the connection to b300d: {exc}") from None
    if not line:
        raise DaemonUnavailableError("b300d closed the connection without an answer")
    try:
        reply = json.loads(line)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise DaemonUnavailableError("b300d sent a malformed answer")
    return reply


def ask_daemon(
    path: str, request: dict[str, Any], *, timeout: float = 180.0
) -> tuple[int, dict[str, Any]]:
    """For b300ctl: send a request; ``(0, result)``, or ``(exit code, {})`` after
    printing the daemon's one-line refusal on stderr."""
    reply = call_daemon(path, request, timeout=timeout)
    if not reply.get("ok"):
        print(f"b300ctl: {reply.get('error', 'the daemon refused')}", file=sys.stderr)
        code = reply.get("exit_code", 1)
        return (code if isinstance(code, int) and code else 1), {}
    result = reply.get("result")
    return 0, result if isinstance(result, dict) else {}


def _unavailable(path: str, exc: OSError) -> DaemonUnavailableError:
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
        return DaemonUnavailableError(f"b300d is not running (no daemon at {path})")
    if isinstance(exc, PermissionError):
        return DaemonUnavailableError(f"not allowed to talk to b300d at {path}")
    return DaemonUnavailableError(f"cannot reach b300d at {path}: {exc}")
