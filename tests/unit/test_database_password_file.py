"""``[daemon] database_password_file``: the config rules, and the password it puts in the URL."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from b300.config import load_config
from b300.errors import AccessError, ConfigError
from b300.store import open_store
from b300.store.credentials import store_url

PG = "postgresql+psycopg://b300@127.0.0.1:5432/test"
SECRET_PATH = "/etc/b300/db.pass"  # noqa: S105 - a file name, not a password


def _config(tmp_path: Path, url: str, password_file: str) -> str:
    cfg = tmp_path / "b300.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\ndatabase_url = "{url}"\n'
                   f'database_password_file = "{password_file}"\n')
    return str(cfg)


def test_the_file_name_reaches_the_config(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, PG, SECRET_PATH))
    assert cfg.database_password_file == SECRET_PATH


@pytest.mark.parametrize(("url", "message"), [
    ("postgresql+psycopg://b300:s3cret@db/b300", "[daemon] database_url carries a password and "
     "database_password_file is set: remove the password from the URL"),
    ("sqlite:////var/lib/b300/state.db", "[daemon] database_password_file needs a postgresql:// database_url"),
])
def test_one_place_for_the_password(tmp_path: Path, url: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, url, "/etc/b300/db.pass"))
    assert str(err.value) == f"{tmp_path / 'b300.toml'}: {message}"
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize(("text", "password"), [("s3cret\n", "s3cret"), ("s3cret", "s3cret"),
                                                 ("s3cret\n\n", "s3cret\n"), ("p@ss:/w d\n", "p@ss:/w d")])
def test_one_trailing_newline_is_stripped(tmp_path: Path, text: str, password: str) -> None:
    secret = tmp_path / "db.pass"
    secret.write_text(text)
    secret.chmod(0o640)
    for reader in (True, False):
        url = make_url(store_url(PG, str(secret), reader=reader))
        assert (url.password, url.username, url.host, url.database) == (password, "b300", "127.0.0.1", "test")


def test_the_daemon_refuses_a_file_others_can_read(tmp_path: Path) -> None:
    secret = tmp_path / "db.pass"
    secret.write_text("s3cret\n")
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match=r"database_password_file .* is readable or writable by others"):
        store_url(PG, str(secret), reader=False)
    assert make_url(store_url(PG, str(secret), reader=True)).password == secret.read_text().strip()


def test_missing_empty_and_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"db.pass: not found$"):
        store_url(PG, str(tmp_path / "db.pass"), reader=True)
    (tmp_path / "db.pass").write_text("\n")
    with pytest.raises(ConfigError, match=r"db.pass is empty$"):
        store_url(PG, str(tmp_path / "db.pass"), reader=True)
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match=r"folder: cannot read: Is a directory$"):
        store_url(PG, str(tmp_path / "folder"), reader=True)
    assert not issubclass(AccessError, ConfigError) and AccessError.exit_code == ConfigError.exit_code == 2


@pytest.mark.postgres
def test_the_store_opens_with_the_url_and_the_file(tmp_path: Path, pg_url: str) -> None:
    # The server trusts 127.0.0.1 (any password passes): this proves the URL built
    # from the file reaches the database and the store works through it.
    secret = tmp_path / "db.pass"
    secret.write_text("unused-by-trust\n")
    secret.chmod(0o600)
    url = store_url(pg_url, str(secret), reader=False)
    assert make_url(url).password == secret.read_text()[:-1]
    store = open_store(url)
    try:
        store.create_run("r-pass", "password file", "a = 1\n", datetime.now(UTC))
        assert [r.id for r in store.list_runs()] == ["r-pass"]
    finally:
        store.close()
