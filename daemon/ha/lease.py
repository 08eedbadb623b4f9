"""Who may act: one active b300d per lease name, with a fencing token.

- :class:`FileLease`: an exclusive ``flock`` on ``<state_dir>/b300d.lock``;
  one daemon per state directory (and so per SQLite store).
- :class:`DbLease`: a row of the ``daemon_lease`` table in the store's
  database: holder (identity, host, pid), ``epoch`` and ``expires_at``. The
  holder renews it (``expires_at = now + ttl``) every cycle and from a
  heartbeat thread; another daemon takes it over only once ``expires_at`` has
  passed, and the takeover adds one to ``epoch``. Expiry is judged by the
  database's clock alone (``clock_timestamp()`` on the server in every
  statement; on SQLite, which is one host, the local clock), so no two hosts'
  clocks are compared. The one assumption about the daemon's own clock is
  that its *rate* matches the server's within a few percent: after a renewal
  sent at local monotonic time ``t`` the holder trusts its lease only until
  ``t + ttl * (1 - margin)``.

A lease expires by time, not by TCP: a frozen (SIGSTOP), partitioned or
vanished holder stops renewing and a standby takes over within ``ttl`` plus
one standby poll, whatever its sockets do. Every statement runs under
``statement_timeout``/``lock_timeout`` and a client-side deadline that shuts
the socket down (:mod:`b300.store.deadline`), so the holder itself learns in
seconds that it can no longer prove its lease.

**Fencing** (:meth:`DbLease.prove`): before any action that changes the world
the daemon renews its lease *conditionally on its epoch* (``UPDATE ... WHERE
holder = me AND epoch = E AND expires_at > now``) and acts only if that
succeeded and its local validity has not run out. A daemon that cannot prove
it (database unreachable, row taken over, frozen past its validity) raises
:class:`FencedError` and does nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO, Any, Protocol

import sqlalchemy as sa
import structlog
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from ..errors import B300Error, ConfigError, StoreError
from ..store.deadline import SocketWatchdog
from ..store.lease_tables import LeaseRow
from ..store.sessions import WRITE_OPTION

log = structlog.get_logger(__name__)
_LEASE = LeaseRow.__table__  # type: ignore[attr-defined]
#: Fraction of the TTL the holder keeps in hand for clock-rate differences and
#: for the action it is about to take.
SAFETY_MARGIN = 0.2


class FencedError(B300Error):
    """This daemon cannot prove that it holds the lease: it must not act."""

    exit_code = 5


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """The lease row as the database has it, and the database's time of reading."""

    name: str
    holder: str
    host: str
    pid: int
    epoch: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    db_now: datetime

    @property
    def live(self) -> bool:
        return self.expires_at > self.db_now and bool(self.holder)

    def describe(self) -> dict[str, Any]:
        return {"holder": self.holder, "host": self.host, "pid": self.pid, "epoch": self.epoch,
                "since": self.acquired_at.isoformat(), "renewed_at": self.renewed_at.isoformat(),
                "expires_at": self.expires_at.isoformat(), "live": self.live}


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


def daemon_identity() -> str:
    """``host:pid:random``: unique per daemon process, also across pid reuse."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class DbLease:
    """The lease row in the store's database (see the module docstring).

    ``engine`` is the lease's own engine (:func:`b300.store.create_engine`
    with short timeouts), not the store's, so a store call stuck on a lock
    never delays a renewal. ``call_timeout_s`` bounds every lease call on the
    client side (PostgreSQL).
    """

    def __init__(
        self,
        engine: Engine,
        name: str = "default",
        *,
        ttl_s: float = 15.0,
        poll_s: float | None = None,
        call_timeout_s: float | None = None,
        identity: str | None = None,
    ) -> None:
        self._base = engine
        # Write transactions (BEGIN IMMEDIATE on SQLite, see b300.store).
        self._engine = engine.execution_options(**{WRITE_OPTION: True})
        self._pg = engine.dialect.name == "postgresql"
        self.name = name
        self.ttl_s = ttl_s
        self.poll_s = poll_s if poll_s is not None else max(0.2, min(2.0, ttl_s / 5))
        self._timeout = call_timeout_s if call_timeout_s is not None else max(1.0, ttl_s / 4)
        self.identity = identity or daemon_identity()
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.epoch: int | None = None
        self.acquired_at: datetime | None = None
        self.previous: LeaseInfo | None = None  # the holder we took over from
        self._valid_until = 0.0  # local monotonic time the lease is trusted until
        self._lost = False
        self._lock = threading.Lock()  # one lease call at a time
        self._watchdog = SocketWatchdog("lease-deadline")
        self._heartbeat: threading.Thread | None = None

    # -- time --------------------------------------------------------------

    def _now(self) -> Any:
        if self._pg:
            return sa.func.clock_timestamp()
        return sa.literal(datetime.now(UTC), LeaseRow.__table__.c.expires_at.type)  # type: ignore[attr-defined]

    def _later(self) -> Any:
        if self._pg:
            return sa.func.clock_timestamp() + sa.literal(timedelta(seconds=self.ttl_s), sa.Interval())
        return sa.literal(datetime.now(UTC) + timedelta(seconds=self.ttl_s),
                          LeaseRow.__table__.c.expires_at.type)  # type: ignore[attr-defined]

    # -- calls -------------------------------------------------------------

    @contextlib.contextmanager
    def _call(self, what: str) -> Iterator[Connection]:
        """One transaction on the lease engine, bounded by the client-side deadline."""
        token = None
        try:
            with self._engine.begin() as conn:
                if self._pg:
                    fd = conn.connection.dbapi_connection.fileno()  # type: ignore[union-attr]
                    token = self._watchdog.arm(fd, self._timeout)
                yield conn
        except sa_exc.SQLAlchemyError as exc:
            fired = token is not None and self._watchdog.disarm(token)
            token = None
            # A connection in an unknown state is not given back to anyone.
            self._base.dispose()
            why = (f"no answer within {self._timeout:g} s" if fired
                   else str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:200])
            raise StoreError(f"lease {what}: {why}") from None
        finally:
            if token is not None:
                self._watchdog.disarm(token)

    def read(self) -> LeaseInfo | None:
        """The lease row now (None if no daemon ever held it)."""
        with self._lock, self._call("read") as conn:
            return self._select(conn, for_update=False)

    def _select(self, conn: Connection, *, for_update: bool) -> LeaseInfo | None:
        query = sa.select(_LEASE, self._now().label("db_now")).where(_LEASE.c.name == self.name)
        if for_update and self._pg:
            query = query.with_for_update()
        row = conn.execute(query).mappings().first()
        if row is None:
            return None
        return LeaseInfo(
            name=row["name"], holder=row["holder"], host=row["host"], pid=row["pid"],
            epoch=int(row["epoch"]), acquired_at=_utc(row["acquired_at"]),
            renewed_at=_utc(row["renewed_at"]), expires_at=_utc(row["expires_at"]),
            db_now=_utc(row["db_now"]))

    def try_acquire(self) -> bool:
        """Take the lease if it is free or expired (by the database's clock)."""
        if self._lost:
            return False
        with self._lock:
            sent = time.monotonic()
            with self._call("acquire") as conn:
                current = self._select(conn, for_update=True)
                if current is None:
                    conn.execute(_LEASE.insert().values(
                        name=self.name, holder="", host="", pid=0, epoch=0,
                        acquired_at=self._now(), renewed_at=self._now(), expires_at=self._now()))
                    current = self._select(conn, for_update=True)
                    assert current is not None
                if current.live and current.holder != self.identity \
                        and not self._died_here(current):
                    self.previous = current
                    return False
                epoch = current.epoch + 1
                # On SQLite the write lock is held from BEGIN (IMMEDIATE); on
                # PostgreSQL the row lock: the epoch check makes it exact anyway.
                done = conn.execute(
                    _LEASE.update()
                    .where(_LEASE.c.name == self.name, _LEASE.c.epoch == current.epoch)
                    .values(holder=self.identity, host=self.host, pid=self.pid, epoch=epoch,
                            acquired_at=self._now(), renewed_at=self._now(),
                            expires_at=self._later())).rowcount
                if done != 1:
                    return False
                mine = self._select(conn, for_update=False)
            self.epoch = epoch
            self.acquired_at = mine.acquired_at if mine else None
            self.previous = current if current.holder else None
            self._valid_until = sent + self.ttl_s * (1 - SAFETY_MARGIN)
            return True

    def _died_here(self, holder: LeaseInfo) -> bool:
        """SQLite only (one host): the holder is a process of this host that no longer
        runs, so its lease need not run out first (a restart after a crash). On
        PostgreSQL the holder may be on another host: its lease always runs out."""
        if self._pg or holder.host != self.host or holder.pid <= 0:
            return False
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def acquire(self, stop: threading.Event) -> bool:
        """Wait as a standby until the lease is ours (True) or ``stop`` is set (False)."""
        waiting_logged = False
        while not stop.is_set() and not self._lost:
            try:
                if self.try_acquire():
                    prev = self.previous
                    log.info("lease.acquired", name=self.name, epoch=self.epoch,
                             identity=self.identity,
                             previous=prev.holder if prev else None,
                             previous_epoch=prev.epoch if prev else None)
                    return True
            except StoreError as exc:
                log.warning("lease.unavailable", error=str(exc))
            else:
                if not waiting_logged and self.previous is not None:
                    log.info("lease.standby", why="another b300d holds the lease",
                             active=self.previous.holder, epoch=self.previous.epoch,
                             poll_s=self.poll_s)
                    waiting_logged = True
            stop.wait(self.poll_s)
        return False

    def renew(self) -> bool:
        """Extend the lease if it is still ours under our epoch.

        True: held for another ``ttl``. False: definitely lost (another daemon
        holds it, or it expired); never held again by this process. Raises
        StoreError when the database cannot tell (the lease may still be held
        until the local validity runs out).
        """
        if self.epoch is None or self._lost:
            return False
        with self._lock:
            sent = time.monotonic()
            with self._call("renew") as conn:
                done = conn.execute(
                    _LEASE.update()
                    .where(_LEASE.c.name == self.name, _LEASE.c.holder == self.identity,
                           _LEASE.c.epoch == self.epoch, _LEASE.c.expires_at > self._now())
                    .values(renewed_at=self._now(), expires_at=self._later())).rowcount
            if done == 1:
                self._valid_until = sent + self.ttl_s * (1 - SAFETY_MARGIN)
                return True
            self._lost = True
            self._valid_until = 0.0
            return False

    def prove(self, action: str) -> None:
        """Fencing: prove, right now, that the lease is held with our epoch; else raise.

        Called inside the same critical section (the daemon's action lock) as
        the action, immediately before it. Renews the lease conditionally on
        the epoch, then checks the local validity once more (a freeze between
        the two would show here).
        """
        if self.epoch is None:
            raise FencedError(f"not the active daemon; {action} not done")
        if self._lost:
            raise FencedError(f"lease lost (epoch {self.epoch}); {action} not done")
        try:
            held = self.renew()
        except StoreError as first:
            # A pooled connection the server dropped fails once (the engine is disposed
            # on it); a fresh connection proves or refuses for real. Once only, and only
            # while the lease is still valid here: a proof is still a conditional renewal.
            if time.monotonic() >= self._valid_until:
                raise FencedError(f"cannot prove the lease ({first}); {action} not done") from None
            try:
                held = self.renew()
            except StoreError as exc:
                raise FencedError(f"cannot prove the lease ({exc}); {action} not done") from None
        if not held:
            raise FencedError(f"lease taken over (our epoch {self.epoch}); {action} not done")
        if time.monotonic() >= self._valid_until:
            raise FencedError(f"lease validity ran out during the check; {action} not done")

    def healthy(self) -> bool:
        """Held and within its local validity (no database call)."""
        return self.epoch is not None and not self._lost and time.monotonic() < self._valid_until

    @property
    def lost(self) -> bool:
        return self._lost

    def start_heartbeat(self, stop: threading.Event, on_lost: Callable[[str], None]) -> None:
        """Renew every ``ttl/3`` in a thread; ``on_lost(why)`` once the lease is gone."""

        def beat() -> None:
            while not stop.wait(self.ttl_s / 3):
                try:
                    if not self.renew():
                        on_lost("taken over or expired")
                        return
                except StoreError as exc:
                    log.warning("lease.renew_failed", error=str(exc))
                    if not self.healthy():
                        self._lost = True
                        on_lost(f"could not renew within the lease's validity: {exc}")
                        return

        self._heartbeat = threading.Thread(target=beat, name="lease-heartbeat", daemon=True)
        self._heartbeat.start()

    def release(self) -> None:
        """Give the lease up at once (a clean stop), so a standby need not wait for the TTL."""
        if self.epoch is None or self._lost:
            self._base.dispose()
            return
        try:
            with self._lock, self._call("release") as conn:
                conn.execute(_LEASE.update()
                             .where(_LEASE.c.name == self.name, _LEASE.c.holder == self.identity,
                                    _LEASE.c.epoch == self.epoch)
                             .values(expires_at=self._now()))
        except StoreError as exc:
            log.warning("lease.release_failed", error=str(exc))
        finally:
            self._lost = True
            self._base.dispose()


def read_lease(engine: Engine, name: str) -> LeaseInfo | None:
    """The lease row (for b300ctl status), or None."""
    return DbLease(engine, name, identity="reader").read()


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
