"""The daemon's durable state (:class:`b300.interfaces.Store`) on SQLite or PostgreSQL.

:func:`open_store` is the way in: it builds the engine (SQLite pragmas and
locking, PostgreSQL timeouts), migrates the database to the newest schema
and returns a :class:`SqlStore`. :func:`open_store_for_reading` is b300ctl's:
it never migrates (nor imports Alembic) and refuses a schema other than its
own. Table classes never leave this package.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import PoolProxiedConnection

from ..errors import AccessError, ConfigError, StoreError
from . import (
    checkpoint_tables,  # noqa: F401 - registers the checkpoint tables in METADATA
    drift_tables,  # noqa: F401 - registers the drift tables in METADATA
    lease_tables,  # noqa: F401 - registers the lease table in METADATA
)
from .schema_revision import SCHEMA_HEADS, SCHEMA_REVISIONS
from .sessions import WRITE_OPTION, masked, store_errors
from .sql_store import SqlStore

if TYPE_CHECKING:
    from alembic.config import Config

    from .deadline import SocketWatchdog

__all__ = ["SqlStore", "create_engine", "open_store", "open_store_for_reading"]

# How long a writer waits for SQLite's lock before failing with "database is locked".
_SQLITE_BUSY_TIMEOUT_S = 10
_PG_CONNECT_TIMEOUT_S = 10
_LIBPQ_DRIVERS = ("psycopg", "psycopg2")
# Every PostgreSQL statement of the store: the server ends it after this long
# (and a lock wait sooner); the client shuts the socket down a little later,
# for a path that lost the bytes (see b300.store.deadline).
STORE_STATEMENT_TIMEOUT_S = 30.0
STORE_LOCK_TIMEOUT_S = 10.0
# pg_advisory_xact_lock key serializing migrations ("b300" in ASCII, then 1).
_MIGRATION_LOCK = 0x62333030_0001


def open_store(url: str) -> SqlStore:
    """Open the store at ``url``, migrated to the newest schema.

    ``url`` is a SQLAlchemy URL: ``sqlite:////var/lib/b300/state.db`` (the
    directory is created if missing) or
    ``postgresql+psycopg://user@host:5432/db``. Safe to call from several
    processes at once. Raises ConfigError for a URL that cannot be used and
    StoreError when the database cannot be reached or migrated.
    """
    engine = create_engine(url)
    try:
        _migrate(engine)
    except BaseException:
        engine.dispose()
        raise
    return SqlStore(engine)


def open_store_for_reading(url: str) -> SqlStore:
    """Open the store at ``url`` as it is, for b300ctl's queries: no migration.

    The schema must be this b300's (:data:`SCHEMA_HEADS`, read from the
    ``alembic_version`` table without importing Alembic): a reader that migrated
    would change the database under a running daemon of another version.
    Raises StoreError (one line) when a SQLite file does not exist, when the
    database has no schema yet, an older one (b300d migrates it when it starts) or
    a newer one (this b300ctl is older than the daemon), and when it cannot be
    reached; ConfigError for a URL that cannot be used.
    """
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError:
        raise ConfigError("state store URL is not a valid database URL") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database and not parsed.query.get("uri"):
        url = _readable_sqlite(parsed.database) or url
    engine = create_engine(url, pool_size=1, read_only=True, application_name="b300ctl")
    try:
        _check_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return SqlStore(engine)


def _readable_sqlite(database: str) -> str | None:
    """Check that this user may read the SQLite store at ``database``; AccessError
    (one line naming the path and the access missing) or StoreError if not.

    Returns a read-only ``immutable`` URL when the daemon is not running (no WAL
    file) and this user may not write the folder: SQLite would otherwise need to
    create the WAL index there just to read (the admin group reads, never writes).
    """
    from ..safety.permissions import unreadable

    try:
        os.stat(database)
    except FileNotFoundError:
        raise StoreError(f"no state store at {database} (has b300d been started?)") from None
    except PermissionError:
        raise AccessError(unreadable(database, "the state store")) from None
    names = (database, *(f"{database}{suffix}" for suffix in ("-wal", "-shm")))
    for name in names:
        if os.path.exists(name) and not os.access(name, os.R_OK):
            raise AccessError(unreadable(name, "the state store"))
    folder = os.path.dirname(database) or "."
    if os.path.exists(f"{database}-wal") or os.access(folder, os.W_OK):
        return None
    return f"sqlite:///file:{quote(database)}?immutable=1&uri=true"


def _check_schema(engine: Engine) -> None:
    with store_errors(engine.url), engine.connect() as connection:
        found: set[str] = set()
        if sa.inspect(connection).has_table("alembic_version"):
            found = {str(r) for r in connection.execute(sa.text("SELECT version_num FROM alembic_version"))
                     .scalars()}
    if found == SCHEMA_HEADS:
        return
    where = masked(engine.url)
    if not found:
        raise StoreError(f"the state store at {where} has no schema yet (has b300d been started?)")
    have, want = ",".join(sorted(found)), ",".join(sorted(SCHEMA_HEADS))
    if found <= SCHEMA_REVISIONS:
        raise StoreError(f"the state store at {where} has an older schema ({have}) than this b300 ({want}); "
                         "b300d migrates it when it starts")
    raise StoreError(f"the state store at {where} has a schema ({have}) this b300 does not know "
                     f"(it knows up to {want}): a newer b300 migrated it; upgrade b300ctl")


def create_engine(
    url: str,
    *,
    statement_timeout_s: float = STORE_STATEMENT_TIMEOUT_S,
    lock_timeout_s: float = STORE_LOCK_TIMEOUT_S,
    connect_timeout_s: int = _PG_CONNECT_TIMEOUT_S,
    pool_size: int = 5,
    pre_ping: bool = False,
    application_name: str = "b300",
    read_only: bool = False,
) -> Engine:
    """An engine for ``url`` (not migrated). On PostgreSQL every session has
    ``statement_timeout``/``lock_timeout``, TCP keepalives and
    ``tcp_user_timeout``, and every statement a client-side deadline of
    ``statement_timeout_s + 2`` s that shuts the socket down. No pre-ping of
    pooled connections (SQLAlchemy's ping is not under that deadline, and hung
    for as long as a cut-off path did): a connection the server dropped fails
    one call with a StoreError, and SQLAlchemy then empties the pool.
    ``read_only``: the database refuses every write on its connections (SQLite
    ``query_only``, PostgreSQL ``default_transaction_read_only``)."""
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError:
        # The message would echo the URL, password included.
        raise ConfigError("state store URL is not a valid database URL") from None
    try:
        if parsed.get_backend_name() == "sqlite":
            return _create_sqlite_engine(parsed, read_only=read_only)
        connect_args: dict[str, Any] = {}
        libpq = parsed.get_driver_name() in _LIBPQ_DRIVERS
        if libpq and "connect_timeout" not in parsed.query:
            # libpq otherwise waits for the OS TCP timeout (minutes) on a dead host.
            connect_args["connect_timeout"] = connect_timeout_s
        if libpq and parsed.get_backend_name() == "postgresql":
            connect_args.update(
                application_name=application_name, keepalives=1, keepalives_idle=5,
                keepalives_interval=2, keepalives_count=3,
                tcp_user_timeout=int(statement_timeout_s * 1000),
                options=(f"-c statement_timeout={int(statement_timeout_s * 1000)}"
                         f" -c lock_timeout={int(lock_timeout_s * 1000)}"
                         f" -c idle_in_transaction_session_timeout="
                         f"{int(statement_timeout_s * 2000)}"
                         + (" -c default_transaction_read_only=on" if read_only else "")))
        engine = sa.create_engine(parsed, pool_pre_ping=pre_ping, connect_args=connect_args,
                                  pool_size=pool_size)
        if libpq and parsed.get_driver_name() == "psycopg":
            _guard_statements(engine, statement_timeout_s + 2.0)
        return engine
    except (sa_exc.NoSuchModuleError, ImportError) as exc:
        raise ConfigError(f"state store URL {masked(parsed)} cannot be used: {exc}") from None


def _guard_statements(engine: Engine, timeout_s: float) -> None:
    """Arm a client-side deadline around every statement (see b300.store.deadline)."""
    from .deadline import SocketWatchdog  # its thread and structlog only where PostgreSQL is used

    watchdog = SocketWatchdog()

    def _before(conn: Connection, cursor: Any, *_args: Any) -> None:
        try:
            fd = cursor.connection.fileno()
        except Exception:  # a closed connection: the driver will say so
            return
        conn.info.setdefault("b300_deadlines", []).append(watchdog.arm(fd, timeout_s))

    def _after(conn: Connection, *_args: Any) -> None:
        tokens = conn.info.get("b300_deadlines")
        if tokens:
            watchdog.disarm(tokens.pop())

    def _error(context: Any) -> None:
        conn = context.connection
        tokens = conn.info.get("b300_deadlines") if conn is not None else None
        while tokens:
            watchdog.disarm(tokens.pop())

    sa.event.listen(engine, "before_cursor_execute", _before)
    sa.event.listen(engine, "after_cursor_execute", _after)
    sa.event.listen(engine, "handle_error", _error)
    _guard_transaction_ends(engine, watchdog, timeout_s)


def _guard_transaction_ends(engine: Engine, watchdog: SocketWatchdog, timeout_s: float) -> None:
    """Put COMMIT and ROLLBACK under the same deadline as statements.

    The driver sends them itself, not through a cursor, so the cursor events above
    never see them; through a path that stopped forwarding, a commit (or the pool's
    rollback when a connection is returned) otherwise blocked until the path closed:
    a daemon that had lost its lease took 90 s to stop. SQLAlchemy has no event
    around them; every commit and rollback, the pool's reset included, goes through
    this engine's own dialect instance, so its two methods are wrapped there.
    """
    dialect = engine.dialect

    def _guarded(inner: Callable[[PoolProxiedConnection], None],
                 ) -> Callable[[PoolProxiedConnection], None]:
        def call(dbapi_connection: PoolProxiedConnection) -> None:
            try:
                token = watchdog.arm(dbapi_connection.fileno(), timeout_s)
            except Exception:  # a closed connection: the driver will say so
                inner(dbapi_connection)
                return
            try:
                inner(dbapi_connection)
            finally:
                watchdog.disarm(token)
        return call

    dialect.do_commit = _guarded(dialect.do_commit)  # type: ignore[method-assign,assignment]
    dialect.do_rollback = _guarded(dialect.do_rollback)  # type: ignore[method-assign,assignment]


def _create_sqlite_engine(url: URL, *, read_only: bool = False) -> Engine:
    database = url.database or ""
    if database in ("", ":memory:") or url.query.get("mode") == "memory":
        raise ConfigError(
            "an in-memory SQLite store cannot be shared by the daemon and b300ctl;"
            " give a file path (sqlite:////var/lib/b300/state.db)"
        )
    if not url.query.get("uri"):
        try:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the state store's directory: {exc}") from exc
    engine = sa.create_engine(url, connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_S})
    sa.event.listen(engine, "connect", _on_sqlite_connect_read_only if read_only else _on_sqlite_connect)
    sa.event.listen(engine, "begin", _on_sqlite_begin)
    return engine


def _on_sqlite_connect_read_only(dbapi_connection: Any, _record: Any) -> None:
    # A reader changes nothing, not even the journal mode (the daemon sets WAL); from
    # here on SQLite refuses any write on this connection.
    dbapi_connection.isolation_level = None
    dbapi_connection.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_TIMEOUT_S * 1000}")
    dbapi_connection.execute("PRAGMA query_only = ON")


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take BEGIN away from pysqlite's legacy transaction control (which
    # starts transactions late, as readers, and fails when they must become
    # writers); _on_sqlite_begin emits it instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_TIMEOUT_S * 1000}")
        _enable_wal(cursor)
        # NORMAL is durable against process crashes in WAL mode, and cheap.
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _enable_wal(cursor: Any) -> None:
    """Switch the database to WAL, so that b300ctl can read while the daemon writes.

    The mode is stored in the file, so this is a read after the first time.
    Switching needs an exclusive lock for which SQLite does not call the busy
    handler: openers racing on a new file get "database is locked" at once,
    so they wait here instead, as busy_timeout would.
    """
    deadline = time.monotonic() + _SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            (mode,) = cursor.execute("PRAGMA journal_mode").fetchone()
            if mode.lower() != "wal":
                # Answers the old mode where WAL is impossible (some network
                # file systems); the store still works there, only readers wait.
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _on_sqlite_begin(connection: Connection) -> None:
    # A write transaction takes the write lock at BEGIN, waiting up to
    # busy_timeout for it; a deferred one that later writes cannot wait (its
    # snapshot may be stale) and fails at once with "database is locked".
    if connection.get_execution_options().get(WRITE_OPTION):
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        connection.exec_driver_sql("BEGIN")


def _migration_config() -> Config:
    from alembic.config import Config  # the migrating path only: readers never import Alembic

    # The installed b300.sql package (not a path in a source tree), so this
    # works from editable and regular installs alike; both are real directories.
    script_dir = str(files("b300.sql"))
    config = Config()
    # ConfigParser interpolates '%' in option values.
    config.set_main_option("script_location", script_dir.replace("%", "%%"))
    return config


def _migrate(engine: Engine) -> None:
    """Upgrade the schema to every head, in one transaction that other openers wait for."""
    from alembic import command
    from alembic.util.exc import CommandError

    config = _migration_config()
    with store_errors(engine.url):
        try:
            with engine.execution_options(**{WRITE_OPTION: True}).begin() as connection:
                if connection.dialect.name == "postgresql":
                    # Released at commit; a second opener then finds head applied.
                    connection.execute(
                        sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK}
                    )
                config.attributes["connection"] = connection
                # "heads": feature branches of the schema (drift, checkpoints, ...) are
                # separate Alembic branches off the initial revision until merged.
                command.upgrade(config, "heads")
        except CommandError as exc:
            # E.g. a database migrated by a newer b300 whose revision we lack.
            raise StoreError(
                f"cannot migrate the state store ({masked(engine.url)}): {exc}"
            ) from exc
