"""Fixtures running the store tests against every backend: SQLite and PostgreSQL.

``store_url`` is parametrized over both backends and gives the URL of an
empty database (nothing migrated yet); ``store`` is an opened store on it.
Test modules import the ``*_fixture`` functions (``from store_fixtures import
store_fixture  # noqa: F401``); the fixtures themselves are named without it,
so test arguments do not shadow the import.

PostgreSQL is the server on 127.0.0.1:5432 (trust auth, user ``postgres`` or
``root``, database ``test``). Each test module gets a database of its own,
``b300_test_<hex>``, dropped afterwards; each test starts from an empty
``public`` schema. When the server cannot be reached the PostgreSQL tests
FAIL, unless ``B300_SKIP_POSTGRES=1`` says that is expected.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from b300.store import SqlStore, open_store

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_USERS = ("postgres", "root")
PG_ADMIN_DATABASE = "test"


def _admin_connection() -> psycopg.Connection[tuple[object, ...]]:
    errors = []
    for user in PG_USERS:
        try:
            return psycopg.connect(
                host=PG_HOST,
                port=PG_PORT,
                user=user,
                dbname=PG_ADMIN_DATABASE,
                autocommit=True,
                connect_timeout=5,
            )
        except psycopg.OperationalError as exc:
            errors.append(f"{user}: {str(exc).strip().splitlines()[0]}")
    pytest.fail(
        f"PostgreSQL at {PG_HOST}:{PG_PORT} not reachable ({'; '.join(errors)});"
        " set B300_SKIP_POSTGRES=1 to skip the PostgreSQL tests",
        pytrace=False,
    )


@pytest.fixture(name="pg_database", scope="module")
def pg_database_fixture() -> Iterator[str]:
    """A fresh PostgreSQL database for this test module; yields its SQLAlchemy URL."""
    if os.environ.get("B300_SKIP_POSTGRES") == "1":
        pytest.skip("B300_SKIP_POSTGRES=1")
    name = f"b300_test_{secrets.token_hex(6)}"
    with _admin_connection() as admin:
        user = admin.info.user
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"postgresql+psycopg://{user}@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        with _admin_connection() as admin:
            # FORCE: a store a failing test left open must not keep it alive.
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _reset_pg_schema(url: str) -> None:
    conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")


@pytest.fixture(
    name="store_url",
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
)
def store_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty database on each backend."""
    if request.param == "sqlite":
        # A directory that does not exist yet: open_store must create it.
        return f"sqlite:///{tmp_path / 'state' / 'b300.db'}"
    url: str = request.getfixturevalue("pg_database")
    _reset_pg_schema(url)
    return url


@pytest.fixture(name="store")
def store_fixture(store_url: str) -> Iterator[SqlStore]:
    """A store opened (and migrated) on an empty database of each backend."""
    with open_store(store_url) as opened:
        yield opened
