"""Alembic environment: runs the revisions online against one database URL.

The URL comes from (first found) a connection handed over by migrations.runner, `-x db=URL`
on the alembic command line, $CALLPROOF_DB (as for serve), or
sqlalchemy.url in alembic.ini.
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import context

config = context.config


def _url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("db")
        or os.environ.get("CALLPROOF_DB")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise SystemExit("no database URL: pass -x db=URL or set CALLPROOF_DB")
    return url


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=None,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = sa.create_engine(_url(), poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) mode is not supported: the triggers are per dialect")
run_migrations_online()
