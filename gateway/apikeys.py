"""API keys: `cp_<random>` secrets, stored only as SHA-256 hashes, each with a role and tenant.

The table is created by migration 0002_api_keys. The secret is shown once at creation and can
never be recovered from the database; a leaked database therefore leaks no usable key.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, get_args

import sqlalchemy as sa

from gateway.shapes import PRINTABLE, TENANT
from receipts.store import create_engine, short_error
from receipts.times import format_timestamp

Role = Literal["agent", "auditor", "admin"]
ROLES: tuple[str, ...] = get_args(Role)

_metadata = sa.MetaData()
api_keys = sa.Table(
    "api_keys",
    _metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("tenant", sa.String(200), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
)


class KeyStoreError(Exception):
    """Base of the key store's errors."""


class KeyNotFound(KeyStoreError, LookupError):
    pass


class InvalidKeyField(KeyStoreError, ValueError):
    """A role, tenant or name a key cannot have; `param` names which."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class KeyStoreUnavailable(KeyStoreError):
    """The database could not be reached: callers fail closed (503), never open."""


@dataclass(frozen=True)
class ApiKey:
    id: str
    name: str
    role: Role
    tenant: str
    created_at: datetime
    revoked_at: datetime | None

    def as_json(self) -> dict[str, str | None]:
        """The key without its secret, times written as receipts write theirs."""
        return {
            "id": self.id,
            "name": self.name,
            "role": self.role,
            "tenant": self.tenant,
            "created_at": format_timestamp(self.created_at),
            "revoked_at": format_timestamp(self.revoked_at) if self.revoked_at else None,
        }


log = logging.getLogger("callproof.gateway")


def log_key_change(what: str, key: ApiKey, by_key_id: str | None) -> None:
    """Who changed which key: an operator's trail of key management (ids, never secrets), the
    same line from /admin/keys and from `callproof keys`; ``by_key_id`` is None for the CLI,
    which acts with the database's own credentials, not an admin key."""
    log.info(
        what,
        extra={
            "event": what.replace(" ", "_"),
            "key_id": key.id,
            "role": key.role,
            "tenant": key.tenant,
            "by_key_id": by_key_id,
        },
    )


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _row_to_key(row: sa.Row) -> ApiKey:
    def utc(value: datetime | None) -> datetime | None:  # SQLite returns naive datetimes
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    return ApiKey(row.id, row.name, row.role, row.tenant, utc(row.created_at), utc(row.revoked_at))


class KeyStore:
    """Create, list, revoke and look up API keys in the ledger's database."""

    def __init__(self, engine: sa.Engine):
        self._engine = engine

    @classmethod
    def open(cls, url: str) -> KeyStore:
        """The ledger's own engine settings: the keys live in the same database (on SQLite the
        same file, so the same WAL mode and busy timeout)."""
        return cls(create_engine(url))

    def close(self) -> None:
        self._engine.dispose()

    def create(
        self,
        role: str,
        tenant: str,
        name: str | None = None,
        *,
        show: Callable[[str], None] | None = None,
    ) -> tuple[ApiKey, str]:
        """A new key and its secret; the secret is not stored and cannot be shown again.
        ``show`` is given the secret before the key is committed: one it fails to show (it
        raises) is not made."""
        if role not in ROLES:
            raise InvalidKeyField(f"role must be one of {', '.join(ROLES)}, not {role!r}", "role")
        if not re.fullmatch(TENANT.pattern, tenant):
            raise InvalidKeyField(f"tenant {tenant!r} must be {TENANT.words}", "tenant")
        if name is not None and not re.fullmatch(PRINTABLE.pattern, name):
            raise InvalidKeyField(f"name must be {PRINTABLE.words}", "name")
        secret = "cp_" + secrets.token_hex(24)
        key = ApiKey(
            id="key_" + secrets.token_hex(8),
            name=name or f"{role}@{tenant}",
            role=role,  # type: ignore[arg-type]
            tenant=tenant,
            created_at=datetime.now(UTC),
            revoked_at=None,
        )
        with self._begin() as conn:
            conn.execute(
                api_keys.insert().values(
                    id=key.id,
                    name=key.name,
                    key_hash=hash_secret(secret),
                    role=key.role,
                    tenant=key.tenant,
                    created_at=key.created_at,
                )
            )
            if show is not None:
                show(secret)
        return key, secret

    def list(self) -> list[ApiKey]:
        with self._begin() as conn:
            rows = conn.execute(sa.select(api_keys).order_by(api_keys.c.created_at)).all()
        return [_row_to_key(row) for row in rows]

    def revoke(self, key_id: str) -> tuple[ApiKey, bool]:
        """The key, revoked, and whether this call revoked it: False when it already was (its
        first ``revoked_at`` kept), so that callers log no revocation that changed nothing."""
        now = datetime.now(UTC)
        with self._begin() as conn:
            changed = conn.execute(
                api_keys.update()
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=now)
            ).rowcount
            row = conn.execute(sa.select(api_keys).where(api_keys.c.id == key_id)).first()
        if row is None:
            raise KeyNotFound(f"no API key with id {key_id!r}")
        return _row_to_key(row), changed == 1

    def lookup(self, secret: str) -> ApiKey | None:
        """The active (not revoked) key with this secret, or None."""
        with self._begin() as conn:
            row = conn.execute(
                sa.select(api_keys).where(
                    api_keys.c.key_hash == hash_secret(secret), api_keys.c.revoked_at.is_(None)
                )
            ).first()
        return _row_to_key(row) if row is not None else None

    def has_admin(self, *, active: bool) -> bool:
        """Whether an admin key exists (``active``: one not revoked)."""
        query = sa.select(api_keys.c.id).where(api_keys.c.role == "admin")
        if active:
            query = query.where(api_keys.c.revoked_at.is_(None))
        with self._begin() as conn:
            return conn.execute(query.limit(1)).first() is not None

    @contextmanager
    def _begin(self) -> Iterator[sa.Connection]:
        try:
            with self._engine.begin() as conn:
                yield conn
        except (sa.exc.SQLAlchemyError, self._engine.dialect.loaded_dbapi.Error) as exc:
            raise KeyStoreUnavailable(f"the API key database failed: {short_error(exc)}") from exc
