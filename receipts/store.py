"""SQLAlchemy 2 models of the ledger tables (Postgres and SQLite).

The models describe the tables; migrations/versions/0001_ledger.py is what creates them (a
test compares the two). Every table except ``chains`` is append-only: the migration installs
triggers that reject UPDATE and DELETE, so the only mutable row is a chain's head.

The full signed receipt is kept as JSON text in ``receipts.body`` (sorted keys, compact,
lossless: the verifier re-derives its RFC 8785 form to check the entry hash); the other
columns of ``receipts`` (and the ``receipt_calls`` / ``receipt_links`` rows) are copies that
exist only so the audit queries can use indexes. The verifier trusts the body and checks
that the copies agree with it.

``created_at`` is stored as the receipt's own fixed-width RFC 3339 UTC string
(``2026-11-21T23:15:00.123456Z``): it is byte-identical to the signed value, sorts
chronologically as text, and behaves the same in both databases.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy import BigInteger, ForeignKey, Index, Integer, LargeBinary, String, Text, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from receipts.canonical import sorted_json
from receipts.errors import LedgerUnavailable
from receipts.record import Receipt
from receipts.signing import Signer
from receipts.times import utc_now

HASH = String(64)
"""A SHA-256 digest in lowercase hex."""


class Base(DeclarativeBase):
    pass


class ChainRow(Base):
    """One row per chain (= tenant): the head that appends lock to stay serialised.

    ``frontier`` is the Merkle tree's right edge at ``head_seq`` (the roots of its perfect
    subtrees, largest first, hex, comma-separated), so a batch can extend the tree and sign
    a checkpoint without reading any receipt back.
    """

    __tablename__ = "chains"

    chain: Mapped[str] = mapped_column(String(128), primary_key=True)
    head_seq: Mapped[int] = mapped_column(BigInteger)
    head_hash: Mapped[str] = mapped_column(HASH)
    frontier: Mapped[str] = mapped_column(Text)
    key_id: Mapped[str | None] = mapped_column(String(64))
    checkpoint_size: Mapped[int] = mapped_column(BigInteger)
    checkpoint_at: Mapped[int] = mapped_column(BigInteger)
    """Unix time in milliseconds of the latest checkpoint; 0 before the first."""


class ReceiptRow(Base):
    __tablename__ = "receipts"

    chain: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    id: Mapped[str] = mapped_column(String(32), unique=True)
    created_at: Mapped[str] = mapped_column(String(32))
    tenant: Mapped[str] = mapped_column(String(128))
    key_id: Mapped[str] = mapped_column(String(64))
    manifest_hash: Mapped[str] = mapped_column(HASH)
    schema_hash: Mapped[str | None] = mapped_column(HASH)
    model: Mapped[str] = mapped_column(String(256))
    output_kind: Mapped[str] = mapped_column(String(16))
    finish_reason: Mapped[str] = mapped_column(String(32))
    prev_hash: Mapped[str] = mapped_column(HASH)
    entry_hash: Mapped[str] = mapped_column(HASH)
    body: Mapped[str] = mapped_column(Text)
    """The whole signed receipt as JSON (the authoritative copy; see receipt_text)."""

    __table_args__ = (
        Index("ix_receipts_chain_created_at", "chain", "created_at"),
        Index("ix_receipts_chain_model_seq", "chain", "model", "seq"),
        Index("ix_receipts_chain_schema_hash_seq", "chain", "schema_hash", "seq"),
    )


class CallRow(Base):
    """One row per tool call a receipt issued: serves lookups by call id and by tool name."""

    __tablename__ = "receipt_calls"

    chain: Mapped[str] = mapped_column(String(128), primary_key=True)
    call_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    tool_name: Mapped[str] = mapped_column(String(256))

    __table_args__ = (Index("ix_receipt_calls_chain_tool_seq", "chain", "tool_name", "seq"),)


class LinkRow(Base):
    """A receipt answering an earlier tool call (``tool_call_id``), resolved or not."""

    __tablename__ = "receipt_links"

    chain: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    tool_call_id: Mapped[str] = mapped_column(String(64))
    receipt_id: Mapped[str | None] = mapped_column(String(32))

    __table_args__ = (Index("ix_receipt_links_chain_call", "chain", "tool_call_id"),)


class SchemaRow(Base):
    """Content-addressed schemas: sha256(JCS(schema)) -> the canonical JSON that hashed."""

    __tablename__ = "schemas"

    hash: Mapped[str] = mapped_column(HASH, primary_key=True)
    body: Mapped[str] = mapped_column(Text)


class SigningKeyRow(Base):
    __tablename__ = "signing_keys"

    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    public_key_pem: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(String(32))


class KeyRangeRow(Base):
    """From ``first_seq`` on, a chain's receipts are signed by ``key_id`` (until the next row).

    One row per switch of signer, written in the batch that made the switch; the range's end
    is the next row's first_seq - 1, or the chain head.
    """

    __tablename__ = "key_ranges"

    chain: Mapped[str] = mapped_column(String(128), primary_key=True)
    first_seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("signing_keys.key_id"))


class CheckpointRow(Base):
    __tablename__ = "checkpoints"

    chain: Mapped[str] = mapped_column(String(128), primary_key=True)
    tree_size: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    root_hash: Mapped[str] = mapped_column(HASH)
    timestamp: Mapped[str] = mapped_column(String(32))
    key_id: Mapped[str] = mapped_column(String(64))
    body: Mapped[str] = mapped_column(Text)
    """The signed checkpoint as canonical JSON."""


class MerkleNodeRow(Base):
    """Hash of the perfect subtree covering leaves [idx * 2**level, (idx + 1) * 2**level).

    Stored for level >= 1 as each subtree completes (level 0 is the receipts' entry hashes),
    so an inclusion or consistency proof at any size reads O(log n) rows.
    """

    __tablename__ = "merkle_nodes"

    chain: Mapped[str] = mapped_column(String(128), primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    hash: Mapped[bytes] = mapped_column(LargeBinary(32))


APPEND_ONLY_TABLES: tuple[str, ...] = (
    "receipts",
    "receipt_calls",
    "receipt_links",
    "schemas",
    "signing_keys",
    "key_ranges",
    "checkpoints",
    "merkle_nodes",
)
"""Tables whose rows the database refuses to UPDATE or DELETE (migration triggers)."""


def insert_ignore(table: sa.Table, dialect: sa.Dialect) -> sa.Insert:
    """INSERT ... ON CONFLICT DO NOTHING, for rows another writer may have inserted first."""
    insert = postgresql.insert if dialect.name == "postgresql" else sqlite.insert
    return insert(table).on_conflict_do_nothing()


# Postgres connections that give up instead of hanging: a connect attempt after 5 s; a peer
# gone (a partition, a dead host) after about 25 s of keepalives when idle, or 30 s of
# unacknowledged data when busy. The operator's own values in the URL's query win.
_POSTGRES_CONNECT_ARGS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


def connect_args(url: str) -> dict[str, object]:
    """The driver arguments `url` needs beyond its own (none outside Postgres)."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return {}
    return {k: v for k, v in _POSTGRES_CONNECT_ARGS.items() if k not in parsed.query}


def create_engine(url: str, *, writer: bool = False, snapshots: bool = False) -> sa.Engine:
    """An engine tuned for the ledger.

    Postgres: pre-ping so a restarted server is noticed on checkout instead of failing the
    first append after it. With ``snapshots`` (the ledger's reader), transactions are
    REPEATABLE READ READ ONLY: a verification, export or proof reads the head, the receipts
    and the index rows in several statements, and at READ COMMITTED it saw appends committed
    in between (a verify under load named a receipt "beyond the chain head"). SQLite: WAL
    (readers never block the writer, and a read transaction is one snapshot), FULL sync (a
    commit is on disk when it returns), a busy timeout, and transactions that start with
    ``BEGIN IMMEDIATE`` on the writer engine, which takes the database write lock up front:
    that lock is what serialises appends across processes on SQLite.
    """
    if not url.startswith("sqlite"):
        engine = sa.create_engine(
            url,
            pool_pre_ping=True,
            pool_size=4,
            max_overflow=8,
            connect_args=connect_args(url),
        )
        if writer:
            _bound_writer_waits(engine)
        if not snapshots:
            return engine
        return engine.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
    engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
    begin = "BEGIN IMMEDIATE" if writer else "BEGIN"

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see below)
        cursor = dbapi_conn.cursor()
        for pragma in (
            "journal_mode=WAL",
            "synchronous=FULL",
            "foreign_keys=ON",
            "busy_timeout=30000",
        ):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(begin)

    return engine


# A writer holds a chain's row lock for milliseconds (lock, seal, write, commit). One that
# stalls inside (SIGSTOP, a paused VM, a partition) keeps its session open, so the server would
# hold the lock for as long as the stall lasts and every other replica's appends would wait.
WRITER_IDLE_IN_TRANSACTION_S = 5
WRITER_LOCK_TIMEOUT_S = 5
# A stall while a batch's pipelined writes are on their way leaves the session active (the
# server waits for the rest), which idle_in_transaction_session_timeout does not count.
# Postgres 17's transaction_timeout bounds that too; before 17, the server's keepalives end
# the session once the writer's host stops answering (a partition, a paused VM, a dead host:
# about 5 + 5 x 1 s), though not while a stopped process's host still answers for it.
WRITER_TRANSACTION_TIMEOUT_S = 30
WRITER_KEEPALIVES = {
    "tcp_keepalives_idle": 5,
    "tcp_keepalives_interval": 1,
    "tcp_keepalives_count": 5,
}


def _bound_writer_waits(engine: sa.Engine) -> None:
    """The server ends a writer session idle inside a transaction (its lock goes with it,
    and the stalled writer's commit fails closed), one whose host stopped answering, and
    (Postgres 17 on) one whose transaction has run too long; and a writer waits for a lock
    only so long before it fails its batch (a 503) instead of holding every append behind
    it."""
    settings = {
        "idle_in_transaction_session_timeout": f"{WRITER_IDLE_IN_TRANSACTION_S}s",
        "lock_timeout": f"{WRITER_LOCK_TIMEOUT_S}s",
        **{name: str(value) for name, value in WRITER_KEEPALIVES.items()},
    }

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record) -> None:
        with dbapi_conn.cursor() as cursor:
            cursor.execute("; ".join(f"SET {name} = '{value}'" for name, value in settings.items()))
            cursor.execute(
                "SELECT set_config('transaction_timeout', %s, false)"
                " WHERE current_setting('server_version_num')::int >= 170000",
                (f"{WRITER_TRANSACTION_TIMEOUT_S}s",),
            )
        dbapi_conn.commit()


def receipt_text(receipt: Receipt) -> str:
    """The stored form of a receipt: its JSON with sorted keys, compact and lossless.

    Not re-canonicalized here (RFC 8785 costs a third of an append); every reader parses it
    and the verifier recomputes the entry hash over its RFC 8785 form, so any edit shows.
    """
    return sorted_json(receipt.to_json_obj()).decode()


def register_signing_key(conn: sa.Connection, signer: Signer) -> None:
    """List ``signer``'s key among the ledger's signing keys (if not yet there): a key is
    listed before it signs, so the ledger can hand out every key that signed it."""
    row = {
        "key_id": signer.key_id,
        "public_key_pem": signer.public_key_pem(),
        "created_at": utc_now(),
    }
    conn.execute(insert_ignore(SigningKeyRow.__table__, conn.dialect), [row])


@contextmanager
def transaction(engine: sa.Engine, failing: str) -> Iterator[sa.Connection]:
    """A transaction whose database failures surface as LedgerUnavailable (fail closed)."""
    try:
        with engine.begin() as conn:
            yield conn
    except (SQLAlchemyError, engine.dialect.loaded_dbapi.Error) as exc:  # driver: append_sql
        raise LedgerUnavailable(f"the ledger database {failing}: {short_error(exc)}") from exc


def short_error(exc: BaseException) -> str:
    """First line of a driver error: enough to diagnose, no SQL or parameters (no payloads)."""
    orig = getattr(exc, "orig", None) or exc
    return f"{type(orig).__name__}: {str(orig).splitlines()[0] if str(orig) else ''}"
