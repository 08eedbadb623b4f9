"""The client side of the daemon's control socket (b300ctl's): one request, one reply.

Standard library only, so that b300ctl pays for nothing more than a socket to ask
the daemon (the server side, :mod:`b300.control.server`, logs through structlog).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from typing import Any

from ..errors import DaemonUnavailableError, UsageError

MAX_REQUEST_BYTES = 4 << 20


class SocketRefusedError(DaemonUnavailableError):
    """The kernel refused the connection: this user may not use the control socket
    (mode 0660, the admin group). A refusal, so exit 2 like the daemon's own."""

    exit_code = UsageError.exit_code


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
    path: str, request: dict[str, Any], *, timeout: float = 180.0, admin_group: str = ""
) -> tuple[int, dict[str, Any]]:
    """For b300ctl: send a request; ``(0, result)``, or ``(exit code, {})`` after
    printing the daemon's one-line refusal on stderr.

    A socket this user may not connect to is the same refusal the daemon gives a
    non-admin (exit 2): ``user alice may not cancel: not in group hpc-admins (...)``.
    """
    try:
        reply = call_daemon(path, request, timeout=timeout)
    except SocketRefusedError:
        raise SocketRefusedError(_socket_refusal(str(request.get("op", "")), admin_group, path)) from None
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
        from ..safety.permissions import unreadable

        return SocketRefusedError(unreadable(path, "the control socket", need="write"))
    return DaemonUnavailableError(f"cannot reach b300d at {path}: {exc}")


def refusal(user: str, op: str, admin_group: str, where: str = "") -> str:
    """The one line of a refused change, the same from the daemon and from b300ctl:
    ``user alice may not cancel: not in group hpc-admins``, then ``where`` in brackets
    (the access to the control socket that is missing) if given."""
    why = f"not in group {admin_group}" if admin_group else \
        "only root and the daemon's user may (no admin_group configured)"
    return f"user {user} may not {op}: {why}" + (f" ({where})" if where else "")


def _socket_refusal(op: str, admin_group: str, socket_path: str) -> str:
    from ..safety.permissions import missing_access, user_name

    return refusal(user_name(), op, admin_group, missing_access(socket_path, "write"))
