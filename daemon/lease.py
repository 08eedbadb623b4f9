"""Who may act: one active b300d per cluster.

- :class:`FileLease`: an exclusive ``flock`` on ``<state_dir>/b300d.lock``;
  one daemon per state directory (and so per SQLite store).
- :class:`PostgresLease`: a session-level advisory lock in the shared
  PostgreSQL database, held on a connection of its own for the daemon's life.
  Two daemons on two login nodes share the database; the one holding the lock
  acts, the other waits (standby) and takes over as soon as the lock is free.
  PostgreSQL frees it the moment the holder's connection ends (the process
  died, its host went away and TCP keepalive noticed, or it was fenced), so a
  standby polling every ``poll_s`` takes over within that time.

The active daemon checks :meth:`healthy` every cycle; a lease that is no
longer certain means another daemon may act, so the daemon stops acting at
once (fencing) and exits for systemd to restart it as a standby.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from typing import IO, Any, Protocol

import structlog

from .errors import ConfigError, StoreError

log = structlog.get_logger(__name__)


class Lease(Protocol):
    def acquire(self, stop: threading.Event) -> bool:
        """Block until held (True) or ``stop`` is set (False)."""
        ...

    def healthy(self) -> bool:
        """Still held, as far as can be known right now."""
        ...

    def release(self) -> None: ...


class FileLease:
    """One daemon per state directory (``flock``; freed by the kernel on exit)."""

    def __init__(self, state_dir: str) -> None:
        self._dir = state_dir
        self._file: IO[str] | None = None

    def acquire(self, stop: threading.Event) -> bool:
        if self._file is not None:
            return True
        os.makedirs(self._dir, mode=0o750, exist_ok=True)
        path = os.path.join(self._dir, "b300d.lock")
        f = open(path, "a+")  # noqa: SIM115 - held open until release()
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise ConfigError(f"another b300d already runs with state_dir {self._dir} "
                              f"(pid {holder})") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f
        return True

    def healthy(self) -> bool:
        return self._file is not None

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def lease_key(name: str) -> int:
    """A signed 64-bit advisory-lock key from a lease name."""
    digest = hashlib.sha256(f"b300d-lease:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PostgresLease:
    """A PostgreSQL advisory lock held on a dedicated connection."""

    def __init__(self, url: str, name: str = "default", *, poll_s: float = 2.0) -> None:
        self._url = url.replace("postgresql+psycopg://", "postgresql://", 1)
        self._key = lease_key(name)
        self._poll = poll_s
        self._conn: Any = None

    def _connect(self) -> Any:
        import psycopg

        # Keepalives: a holder whose host vanished loses the lock in ~30 s.
        return psycopg.connect(self._url, autocommit=True, connect_timeout=10,
                               keepalives=1, keepalives_idle=10, keepalives_interval=5,
                               keepalives_count=3, application_name="b300d-lease")

    def acquire(self, stop: threading.Event) -> bool:
        import psycopg

        waiting_logged = False
        while not stop.is_set():
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                got = self._conn.execute("SELECT pg_try_advisory_lock(%s)",
                                         (self._key,)).fetchone()[0]
            except psycopg.Error as exc:
                self._drop()
                log.warning("lease.unavailable", error=str(exc).splitlines()[0][:200])
                got = False
            if got:
                log.info("lease.acquired", key=self._key)
                return True
            if not waiting_logged:
                log.info("lease.standby", why="another b300d holds the lease", poll_s=self._poll)
                waiting_logged = True
            stop.wait(self._poll)
        return False

    def healthy(self) -> bool:
        import psycopg

        if self._conn is None or self._conn.closed:
            return False
        try:
            held = self._conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND pid = pg_backend_pid() AND objsubid = 1 "
                "AND objid::text::bigint = (%s::bigint & 4294967295) "
                "AND classid::text::bigint = ((%s::bigint >> 32) & 4294967295)",
                (self._key, self._key)).fetchone()[0]
        except psycopg.Error:
            return False
        return bool(held)

    def release(self) -> None:
        import psycopg

        if self._conn is not None and not self._conn.closed:
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
            except psycopg.Error as exc:
                raise StoreError(f"could not release the lease: {exc}") from None
            finally:
                self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                self._conn.close()
            self._conn = None
