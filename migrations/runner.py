"""Run the migrations from Python: ``upgrade(url)`` is what tests, `callproof ledger migrate`
and the gateway call; it works from an installed package (no alembic.ini in the cwd)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.util import CommandError

from receipts.store import connect_args

HERE = Path(__file__).resolve().parent


def alembic_config() -> Config:
    """The packaged alembic.ini, with paths resolved against the installed package."""
    cfg = Config(str(HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(HERE))
    cfg.set_main_option("version_locations", str(HERE / "versions"))
    return cfg


# Any constant shared by every callproof process: replicas starting together on a new
# revision take turns instead of racing on alembic_version (the loser saw a UniqueViolation).
_MIGRATION_LOCK = 0x63616C6C70726F66  # "callprof"


class MigrationError(Exception):
    """The database cannot be brought to this release's schema (an unknown revision)."""


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` up to ``revision`` (idempotent; one process at a time)."""
    cfg = alembic_config()
    engine = _engine(url)
    try:
        with _one_at_a_time(url), engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK}
                )
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    except CommandError as exc:
        raise MigrationError(
            f"cannot migrate the database: {exc} (was it migrated by a newer callproof?)"
        ) from None
    finally:
        engine.dispose()


def known_revisions() -> tuple[str, ...]:
    """This release's revisions, oldest first: the last is the schema it writes."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    return tuple(reversed([rev.revision for rev in script.walk_revisions()]))


def current(url: str) -> str | None:
    """The revision the database is at (None before the first migration)."""
    from alembic.runtime.migration import MigrationContext

    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def _engine(url: str) -> sa.Engine:
    """One connection, with the ledger's connect timeout and keepalives: a Postgres that does
    not answer stops `serve` at startup with an error instead of hanging it."""
    return sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args=connect_args(url))


@contextmanager
def _one_at_a_time(url: str) -> Iterator[None]:
    """On SQLite, an exclusive lock on a file beside the database for the whole upgrade:
    gateways started together on a new data dir raced on CREATE TABLE ("table chains already
    exists"), and SQLite's own locks answered "database is locked" to some of them. Postgres
    takes an advisory lock inside the migration's transaction instead."""
    parsed = sa.make_url(url)
    database = parsed.database or ""
    if database.startswith("file:"):  # a URI filename (sqlite:///file:PATH?...&uri=true)
        database = database.removeprefix("file:").split("?", 1)[0]
    in_memory = database in ("", ":memory:") or "mode=memory" in str(parsed)
    if parsed.get_backend_name() != "sqlite" or in_memory or not Path(database).parent.is_dir():
        yield  # Postgres, a database in memory, or a directory SQLite itself will refuse
        return
    fd = os.open(f"{database}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o600)  # owner only
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
