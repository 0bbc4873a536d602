"""The hot statements of an append, compiled once per database from the table models and run
on the driver's own cursor inside the ledger's SQLAlchemy transaction.

Why not plain SQLAlchemy Core here: py-spy put about 90% of a single receipt's append CPU in
SQLAlchemy's per-statement execution (cache keys, compiled-statement lookup, result set-up),
about 0.2 ms per statement for the five or six statements of a batch. The SQL text is still
SQLAlchemy's (compiled from store.py's models, so the models stay the one description of the
tables); only its execution moves to the DBAPI cursor. On Postgres the writes and the COMMIT
are pipelined (psycopg pipeline mode): one round trip for all of them.

Driver errors raised here are the DBAPI's own (``dbapi_errors``), not SQLAlchemy's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from receipts.store import ChainRow, SchemaRow, insert_ignore

_ADVANCE_COLUMNS = ("head_seq", "head_hash", "frontier", "key_id")
"""What an append moves. The checkpoint columns are written only by whoever signs one."""
_HEAD_COLUMNS = ("chain", *_ADVANCE_COLUMNS, "checkpoint_size", "checkpoint_at")


@dataclass(frozen=True)
class Statement:
    """Compiled SQL and how to pass it one row: by name, or (for "?" drivers) in order."""

    sql: str
    positional: tuple[str, ...] | None

    @classmethod
    def compile(cls, stmt: sa.ClauseElement, dialect: sa.Dialect) -> Statement:
        compiled = stmt.compile(dialect=dialect)
        order = tuple(compiled.positiontup) if compiled.positional else None
        return cls(str(compiled), order)

    def params(self, row: Mapping[str, Any]) -> Mapping[str, Any] | tuple[Any, ...]:
        return row if self.positional is None else tuple(row[k] for k in self.positional)


class AppendSQL:
    """The append transaction's statements for one database dialect."""

    def __init__(self, dialect: sa.Dialect) -> None:
        self.pipelined = dialect.name == "postgresql"
        chains = ChainRow.__table__
        self._lock = Statement.compile(
            sa.select(*(chains.c[name] for name in _HEAD_COLUMNS))
            .where(chains.c.chain == sa.bindparam("chain"))
            .with_for_update(),
            dialect,
        )
        # head_seq moves only from the head the writer sealed onto (b_from, b_from_hash): a
        # head row that is anywhere else gets NULL, which its NOT NULL refuses, so the batch
        # fails as an IntegrityError and is redone under the lock. A kept head on a chain
        # another writer extended, or that went back (a restore under a pooler, SQLite
        # restored in place) and maybe grew again, is never sealed past a gap or a fork.
        sealed_onto = sa.and_(
            chains.c.head_seq == sa.bindparam("b_from"),
            chains.c.head_hash == sa.bindparam("b_from_hash"),
        )
        moved = sa.case((sealed_onto, sa.bindparam("head_seq")))
        self._save, self._advance = (
            Statement.compile(
                sa.update(chains)
                .where(chains.c.chain == sa.bindparam("b_chain"))
                .values(
                    {name: moved if name == "head_seq" else sa.bindparam(name) for name in columns}
                ),
                dialect,
            )
            for columns in (_HEAD_COLUMNS[1:], _ADVANCE_COLUMNS)
        )
        self._dialect = dialect
        self._inserts: dict[sa.Table, Statement] = {}  # compiled on first use
        self.dbapi_errors = dialect.loaded_dbapi.Error
        self.integrity_errors = dialect.loaded_dbapi.IntegrityError

    def _insert(self, table: sa.Table) -> Statement:
        statement = self._inserts.get(table)
        if statement is None:
            stmt = (
                insert_ignore(table, self._dialect)
                if table is SchemaRow.__table__  # another writer may have stored it first
                else sa.insert(table)
            )
            statement = self._inserts[table] = Statement.compile(stmt, self._dialect)
        return statement

    def lock_head(self, cursor: Any, chain: str) -> dict[str, Any] | None:
        """The chain's head row, locked until the transaction ends (None: no such chain).
        SQLite has no row locks: there the writer's BEGIN IMMEDIATE already holds the
        database write lock."""
        cursor.execute(self._lock.sql, self._lock.params({"chain": chain}))
        row = cursor.fetchone()
        return None if row is None else dict(zip(_HEAD_COLUMNS, row, strict=True))

    def write_and_commit(
        self,
        cursor: Any,
        rows: Mapping[sa.Table, Sequence[Mapping[str, Any]]],
        heads: Sequence[Mapping[str, Any]],
    ) -> None:
        """The transaction's last step: save the chain heads, insert `rows` (table -> row
        dicts) and commit; on Postgres one round trip for all of it. The caller's SQLAlchemy
        transaction then ends with nothing left to commit.

        A head row without the checkpoint columns updates only the columns an append moves;
        its ``b_from`` and ``b_from_hash`` are the head it was sealed onto, which the stored
        head must still be.
        Heads go first, in the order given: an UPDATE takes the row lock, so a writer that
        did not lock its heads beforehand still takes every lock before any insert, in the
        same order as everyone else (no deadlock against a writer holding those locks)."""
        connection = cursor.connection
        with connection.pipeline() if self.pipelined else nullcontext():
            for head in heads:
                save = self._save if "checkpoint_size" in head else self._advance
                cursor.execute(save.sql, save.params({**head, "b_chain": head["chain"]}))
            for table, values in rows.items():
                if values:
                    statement = self._insert(table)
                    cursor.executemany(statement.sql, [statement.params(v) for v in values])
            connection.commit()
