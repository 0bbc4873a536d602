"""API keys of the gateway: hashed secrets with a role and a tenant.

Revision ID: 0002_api_keys
Revises: 0001_ledger
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_api_keys"
down_revision = "0001_ledger"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("role IN ('agent', 'auditor', 'admin')", name="ck_api_keys_role"),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
