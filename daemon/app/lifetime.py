"""What every part of the daemon may ask of its lifetime: stopping, its HA role, its lease.

One :class:`Lifetime` per process, built first by the composition root and passed
to the parts that need it (the fence tells it when the lease is lost; the control
router asks it for the role; the upkeep stops early when it is stopping).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import structlog

from .. import __version__
from ..errors import StoreError
from ..ha.lease import DbLease

log = structlog.get_logger(__name__)
#: The exit code of a daemon that lost its lease: systemd restarts it as a standby.
EXIT_FENCED = 75


def sd_notify(message: str) -> bool:
    """Tell systemd (Type=notify) how we are; a no-op outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), addr)
        except OSError:
            return False
    return True


class Lifetime:
    """Stop flag, exit code and HA role of this b300d (thread-safe)."""

    def __init__(self, lease: DbLease | None) -> None:
        self.lease = lease
        self.exit_code = 0
        self.stop_event = threading.Event()

    def stopping(self) -> bool:
        return self.stop_event.is_set()

    def stop(self) -> None:
        self.stop_event.set()

    def role(self) -> str:
        """``active``, ``standby`` (waiting for the lease) or ``fenced`` (lost it; stopping)."""
        if self.lease is None:
            return "active"
        if self.lease.lost or self.exit_code == EXIT_FENCED:
            return "fenced"
        return "active" if self.lease.epoch is not None else "standby"

    def lease_lost(self, why: str) -> None:
        """The lease is gone or cannot be proven: act no more, exit for a restart as standby."""
        if self.exit_code != EXIT_FENCED:
            log.error("lease.lost", why=why, epoch=self.lease.epoch if self.lease else None,
                      action="stopping; systemd restarts us as a standby")
        self.exit_code = EXIT_FENCED
        self.stop_event.set()

    def ping(self) -> dict[str, Any]:
        """The ``ping`` answer: who this daemon is and its role (also from a standby)."""
        result: dict[str, Any] = {"pid": os.getpid(), "version": __version__, "role": self.role()}
        if self.lease is not None:
            result["identity"] = self.lease.identity
            result["epoch"] = self.lease.epoch
        return result

    def active_holder(self) -> str:
        """``"; the active daemon is HOLDER (epoch N)"`` for a refusal, or '' when unknown."""
        if self.lease is None:
            return ""
        try:
            info = self.lease.read()
        except StoreError:
            return ""
        if info is not None and info.live:
            return f"; the active daemon is {info.holder} (epoch {info.epoch})"
        return ""
