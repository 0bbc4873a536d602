"""Alembic migrations: the only way callproof's tables are created (tests included)."""
