"""b300ctl's way into the store (open_store_for_reading), on SQLite and PostgreSQL: it
reads a store at this b300's schema without migrating it, refuses any other schema in
one line, and cannot write. The schema constants it checks against are the migration
scripts' (read here with Alembic, which the reader itself never imports)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.config import Config
from alembic.script import ScriptDirectory

from b300.errors import StoreError
from b300.store import open_store, open_store_for_reading
from b300.store.schema_revision import SCHEMA_HEADS, SCHEMA_REVISIONS
from store_fixtures import (  # noqa: F401  (fixtures: store_url, pg_database)
    pg_database_fixture,
    store_url_fixture,
)

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def test_the_schema_constants_are_the_migration_scripts() -> None:
    config = Config()
    config.set_main_option("script_location", str(files("b300.sql")))
    scripts = ScriptDirectory.from_config(config)
    heads = set(scripts.get_heads())
    revisions = {r.revision for r in scripts.walk_revisions()}
    assert (set(SCHEMA_HEADS), set(SCHEMA_REVISIONS)) == (heads, revisions), (
        f"a migration was added: set daemon/store/schema_revision.py to SCHEMA_HEADS = "
        f"frozenset({sorted(heads)!r}) and SCHEMA_REVISIONS = frozenset({sorted(revisions)!r})")


def _set_revisions(url: str, revisions: list[str]) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM alembic_version"))
            for rev in revisions:
                conn.execute(sa.text("INSERT INTO alembic_version (version_num) VALUES (:r)"), {"r": rev})
    finally:
        engine.dispose()


def test_reads_a_store_at_this_schema_and_refuses_to_write(store_url: str) -> None:
    with open_store(store_url) as store:
        store.create_run("r-1", "r", "[job]\nnodes = 1\n", NOW)
    with open_store_for_reading(store_url) as reader:
        assert [r.id for r in reader.list_runs()] == ["r-1"]
        with pytest.raises(StoreError, match=r"read-only|readonly") as err:
            reader.create_run("r-2", "r", "[job]\nnodes = 1\n", NOW)
        assert "\n" not in str(err.value)
    with open_store(store_url) as store:
        assert [r.id for r in store.list_runs()] == ["r-1"]


@pytest.mark.parametrize(("revisions", "says"), [
    (["0002"], "an older schema (0002) than this b300 (0301); b300d migrates it"),
    (["9999"], "a schema (9999) this b300 does not know"),
    ([], "has no schema yet"),
])
def test_another_schema_is_refused_in_one_line_and_left_as_it_is(store_url: str, revisions: list[str],
                                                                  says: str) -> None:
    open_store(store_url).close()
    _set_revisions(store_url, revisions)
    with pytest.raises(StoreError) as err:
        open_store_for_reading(store_url)
    assert says in str(err.value) and "\n" not in str(err.value)
    engine = sa.create_engine(store_url)
    try:
        with engine.connect() as conn:
            left = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
            assert sorted(left) == revisions
    finally:
        engine.dispose()


def test_an_empty_sqlite_file_or_none_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"no state store at .*missing\.db \(has b300d been started\?\)"):
        open_store_for_reading(f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(StoreError, match="has no schema yet"):
        open_store_for_reading(f"sqlite:///{tmp_path / 'empty.db'}")


def test_the_reader_imports_no_alembic(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    open_store(url).close()
    code = ("import sys\nfrom b300.store import open_store_for_reading\n"
            f"open_store_for_reading({url!r}).list_runs()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'structlog')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
