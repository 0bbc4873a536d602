"""The receipt ledger: chains, receipts, call and link index, schemas, keys, checkpoints,
Merkle nodes, and the triggers that make every table but ``chains`` append-only.

Revision ID: 0001_ledger
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001_ledger"
down_revision: str | None = None
branch_labels = None
depends_on = None

HASH = sa.String(64)
CHAIN = sa.String(128)

# A frozen copy of receipts.store.APPEND_ONLY_TABLES: a revision must not change when the
# application code does (test_store checks the two agree).
APPEND_ONLY = (
    "receipts",
    "receipt_calls",
    "receipt_links",
    "schemas",
    "signing_keys",
    "key_ranges",
    "checkpoints",
    "merkle_nodes",
)


def upgrade() -> None:
    op.create_table(
        "chains",
        sa.Column("chain", CHAIN, primary_key=True),
        sa.Column("head_seq", sa.BigInteger, nullable=False),
        sa.Column("head_hash", HASH, nullable=False),
        sa.Column("frontier", sa.Text, nullable=False),
        sa.Column("key_id", sa.String(64), nullable=True),
        sa.Column("checkpoint_size", sa.BigInteger, nullable=False),
        sa.Column("checkpoint_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "receipts",
        sa.Column("chain", CHAIN, primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("id", sa.String(32), nullable=False, unique=True),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("tenant", CHAIN, nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("manifest_hash", HASH, nullable=False),
        sa.Column("schema_hash", HASH, nullable=True),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("output_kind", sa.String(16), nullable=False),
        sa.Column("finish_reason", sa.String(32), nullable=False),
        sa.Column("prev_hash", HASH, nullable=False),
        sa.Column("entry_hash", HASH, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )
    op.create_index("ix_receipts_chain_created_at", "receipts", ["chain", "created_at"])
    op.create_index("ix_receipts_chain_model_seq", "receipts", ["chain", "model", "seq"])
    op.create_index(
        "ix_receipts_chain_schema_hash_seq", "receipts", ["chain", "schema_hash", "seq"]
    )
    op.create_table(
        "receipt_calls",
        sa.Column("chain", CHAIN, primary_key=True),
        sa.Column("call_id", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("tool_name", sa.String(256), nullable=False),
    )
    op.create_index(
        "ix_receipt_calls_chain_tool_seq", "receipt_calls", ["chain", "tool_name", "seq"]
    )
    op.create_table(
        "receipt_links",
        sa.Column("chain", CHAIN, primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("tool_call_id", sa.String(64), nullable=False),
        sa.Column("receipt_id", sa.String(32), nullable=True),
    )
    op.create_index("ix_receipt_links_chain_call", "receipt_links", ["chain", "tool_call_id"])
    op.create_table(
        "schemas",
        sa.Column("hash", HASH, primary_key=True),
        sa.Column("body", sa.Text, nullable=False),
    )
    op.create_table(
        "signing_keys",
        sa.Column("key_id", sa.String(64), primary_key=True),
        sa.Column("public_key_pem", sa.Text, nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
    )
    op.create_table(
        "key_ranges",
        sa.Column("chain", CHAIN, primary_key=True),
        sa.Column("first_seq", sa.BigInteger, primary_key=True),
        sa.Column("key_id", sa.String(64), sa.ForeignKey("signing_keys.key_id"), nullable=False),
    )
    op.create_table(
        "checkpoints",
        sa.Column("chain", CHAIN, primary_key=True),
        sa.Column("tree_size", sa.BigInteger, primary_key=True),
        sa.Column("root_hash", HASH, nullable=False),
        sa.Column("timestamp", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )
    op.create_table(
        "merkle_nodes",
        sa.Column("chain", CHAIN, primary_key=True),
        sa.Column("level", sa.Integer, primary_key=True),
        sa.Column("idx", sa.BigInteger, primary_key=True),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        _postgres_triggers()
    else:
        _sqlite_triggers()


def _postgres_triggers() -> None:
    op.execute("""
        CREATE FUNCTION callproof_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'callproof ledger is append-only: % on % is forbidden',
                TG_OP, TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege';
        END
        $$
    """)
    for table in APPEND_ONLY:
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION callproof_append_only()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION callproof_append_only()"
        )


def _sqlite_triggers() -> None:
    for table in APPEND_ONLY:
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, 'callproof ledger is append-only: {action} on "
                f"{table} is forbidden'); END"
            )


def downgrade() -> None:
    for table in reversed(("chains",) + APPEND_ONLY):
        op.drop_table(table)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION callproof_append_only()")
