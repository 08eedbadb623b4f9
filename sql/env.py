"""Alembic environment of the state store.

Two ways in:

* ``b300.store.open_store`` passes its own open connection (already inside
  a transaction, holding the migration lock) as
  ``config.attributes["connection"]``; migrations run on it and it is left
  for the caller to commit.
* The ``alembic`` CLI (``sql/alembic.ini``) connects to the URL given with
  ``-x url=...`` or, failing that, the ini file's ``sqlalchemy.url``.

SQLite cannot ALTER most things in place, so its migrations run in batch mode
(copy-and-move tables).
"""

from __future__ import annotations

from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool


def _run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        # No target metadata: revisions are written by hand (see README.md).
        target_metadata=None,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _cli_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    url = url or context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("give the store URL: alembic -c sql/alembic.ini -x url=URL ...")
    return url


def _main() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    # Only the CLI gets logging set up here; the daemon configures its own.
    if config.config_file_name is not None:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    if context.is_offline_mode():
        context.configure(url=_cli_url(), literal_binds=True, target_metadata=None)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = sa.create_engine(_cli_url(), poolclass=NullPool)
    try:
        with engine.connect() as cli_connection:
            _run_on(cli_connection)
    finally:
        engine.dispose()


_main()
