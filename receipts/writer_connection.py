"""The ledger writer's one database connection, kept between batches, and what the writer
asks of the driver connection under it (a cursor, whether the link to the server broke).

A pool checkout with its pre-ping costs more than a whole append with a kept head, so the
writer holds its connection; it is pinged first after an idle spell, or at once when the
server has spoken on it unasked, so a database that restarted or cut its sessions meanwhile
costs no failed append.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from receipts.ledger_file import LedgerFile

IDLE_PING_S = 1.0  # the writer pings its connection before using it after this long idle


class WriterConnection:
    """The writer's connection, opened on first use and replaced once dropped. `on_drop`
    runs whenever it is dropped, first: what the writer kept on it (its heads) goes too."""

    def __init__(
        self,
        engine: sa.Engine,
        dbapi_errors: type[Exception],
        file: LedgerFile | None,
        on_drop: Callable[[], None],
    ) -> None:
        self._engine = engine
        self._dbapi_errors = dbapi_errors
        self._file = file  # SQLite: checked before every use of the database
        self._on_drop = on_drop
        self._conn: sa.Connection | None = None
        self._used_at = 0.0

    def get(self) -> sa.Connection:
        """The connection, pinged first after an idle spell or when the server has spoken
        on it unasked (one that fails the ping is dropped and a new one opened)."""
        if self._file is not None:  # before any connection: a new one would create it
            self._file.check()
        now = time.monotonic()
        if self._conn is not None and (
            now - self._used_at > IDLE_PING_S
            or _server_spoke(self._conn.connection.dbapi_connection, self._dbapi_errors)
        ):
            try:
                self._engine.dialect.do_ping(self._conn.connection.dbapi_connection)
            except self._dbapi_errors:
                self.drop()
        if self._conn is None:
            self._conn = self._engine.connect()
        self._used_at = now
        return self._conn

    def drop(self) -> None:
        """Drop the connection, after `on_drop`: whatever made the connection go (a
        restart, a failover, a restore from backup) may have moved the chains back."""
        self._on_drop()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()  # do not hand a possibly broken connection back to the pool
            except (SQLAlchemyError, self._dbapi_errors):
                pass
            conn.close()


def _server_spoke(dbapi_connection: Any, dbapi_errors: type[Exception]) -> bool:
    """Whether an idle client-server connection has something to read (no wait: one poll).

    Between transactions a server sends nothing unasked but the notice that it is ending the
    session (a restart, a failover, ``pg_terminate_backend``) before it closes the socket;
    so data or EOF here means the connection is gone. SQLite has no socket: never.
    """
    fileno = getattr(dbapi_connection, "fileno", None)
    if fileno is None:
        return False
    try:
        if not hasattr(select, "poll"):  # Windows: select() takes sockets, and any fd number
            return bool(select.select([fileno()], [], [], 0)[0])
        poller = select.poll()  # unlike select(), not limited to fd numbers below 1024
        poller.register(fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, dbapi_errors):  # closed or unusable: the ping that follows tells
        return True


def link_broke(conn: sa.Connection | None) -> bool:
    """Whether the connection to the server broke (psycopg's ``broken``), so that a COMMIT
    sent on it may have landed unseen; a server that answered with an error rolled back.
    SQLite commits in-process: its errors are answers."""
    if conn is None:
        return False
    try:
        return conn.invalidated or bool(getattr(conn.connection.dbapi_connection, "broken", 0))
    except SQLAlchemyError:  # closed under it
        return True


def driver_cursor(conn: sa.Connection) -> Any:
    """A cursor of the driver's connection under `conn`, inside the same transaction."""
    return conn.connection.dbapi_connection.cursor()
