"""The schema: created by the Alembic migration only, matching the models, append-only."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from ledger_kit import draft, ledger, migrated

from migrations.runner import MigrationError, alembic_config, current, upgrade
from receipts.store import APPEND_ONLY_TABLES, Base


def test_migration_creates_exactly_the_models(db_url: str) -> None:
    assert current(db_url) is None
    upgrade(db_url)
    upgrade(db_url)  # idempotent
    assert current(db_url) is not None
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_name": lambda name, kind, _parent: (
                        kind != "table" or name in Base.metadata.tables
                    ),
                },
            )
            assert compare_metadata(ctx, Base.metadata) == []
            assert set(Base.metadata.tables) <= set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_migration_0001_is_the_ledger_revision(fresh_sqlite_url: str) -> None:
    upgrade(fresh_sqlite_url, "0001_ledger")
    assert current(fresh_sqlite_url) == "0001_ledger"
    revision = ScriptDirectory.from_config(alembic_config()).get_revision("0001_ledger")
    assert revision.module.APPEND_ONLY == APPEND_ONLY_TABLES


def test_database_refuses_update_and_delete(db_url: str) -> None:
    migrated(db_url)
    with ledger(db_url, checkpoint_every=1) as led:
        led.append(draft(links=[{"tool_call_id": "call_" + "0" * 24, "receipt_id": None}]))
        led.append(draft())  # completes a Merkle node
    engine = sa.create_engine(db_url)
    try:
        for table in APPEND_ONLY_TABLES:
            column = next(iter(Base.metadata.tables[table].columns)).name
            for statement in (f"UPDATE {table} SET {column} = {column}", f"DELETE FROM {table}"):
                with engine.connect() as conn:
                    rows = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
                    assert rows > 0, table
                    with pytest.raises(sa.exc.DatabaseError, match="append-only") as caught:
                        conn.execute(sa.text(statement))
                    if conn.dialect.name == "postgresql":
                        assert caught.value.orig.sqlstate == "42501"  # insufficient_privilege
    finally:
        engine.dispose()


def test_postgres_refuses_truncate(fresh_postgres_url: str) -> None:
    migrated(fresh_postgres_url)
    with ledger(fresh_postgres_url) as led:
        led.append(draft())
    engine = sa.create_engine(fresh_postgres_url)
    try:
        with engine.connect() as conn, pytest.raises(sa.exc.DatabaseError, match="append-only"):
            conn.execute(sa.text("TRUNCATE receipts CASCADE"))
    finally:
        engine.dispose()


def test_postgres_connections_give_up_unless_the_url_says_otherwise() -> None:
    from receipts.store import connect_args

    args = connect_args("postgresql+psycopg://u@db:5432/ledger?connect_timeout=30")
    assert "connect_timeout" not in args  # the operator's value stays
    assert args["keepalives"] == 1 and args["tcp_user_timeout"] > 0
    assert connect_args("sqlite:///ledger.db") == {}


def test_migrating_a_database_that_never_answers_fails_in_bounded_time() -> None:
    """`serve` migrates first: a Postgres that accepts TCP and says nothing (a frozen server)
    must stop it with an error within the 5 s connect timeout, not hang it."""
    import socket
    import threading
    import time

    failures: list[BaseException] = []

    def migrate(url: str) -> None:
        try:
            upgrade(url)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failures.append(exc)

    with socket.create_server(("127.0.0.1", 0)) as silent:  # connects, never answers
        url = f"postgresql+psycopg://callproof@127.0.0.1:{silent.getsockname()[1]}/ledger"
        started = time.monotonic()
        worker = threading.Thread(target=migrate, args=(url,), daemon=True)
        worker.start()
        worker.join(20)
        assert not worker.is_alive(), "the migration still waits on a silent server"
    assert time.monotonic() - started < 15
    assert len(failures) == 1 and isinstance(failures[0], sa.exc.OperationalError)
    assert "timeout" in str(failures[0])


def test_replicas_migrating_together_take_turns(db_url: str) -> None:
    """Every `serve` migrates at start: replicas rolled out together raced on
    alembic_version and one failed with a UniqueViolation (Postgres), or on the first
    CREATE TABLE, "table chains already exists" (gateways started on a new SQLite data dir)."""
    import threading

    failures: list[BaseException] = []

    def migrate() -> None:
        try:
            upgrade(db_url)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failures.append(exc)

    replicas = [threading.Thread(target=migrate) for _ in range(4)]
    for replica in replicas:
        replica.start()
    for replica in replicas:
        replica.join(60)
    assert failures == []
    assert current(db_url) == ScriptDirectory.from_config(alembic_config()).get_current_head()


def test_a_database_at_an_unknown_revision_is_one_clear_error(fresh_sqlite_url: str) -> None:
    upgrade(fresh_sqlite_url)
    engine = sa.create_engine(fresh_sqlite_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0099_future'"))
    engine.dispose()
    with pytest.raises(MigrationError, match="0099_future.*newer callproof"):
        upgrade(fresh_sqlite_url)
