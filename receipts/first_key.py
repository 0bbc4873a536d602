"""A ledger's first signing key: made once for the whole ledger, not once per gateway.

A gateway with no key named generates one on its first start. Replicas that share a
Postgres ledger but not a data directory each found no key file and, before any of them had
signed, nothing in the ledger either: each generated its own, and receipts were signed by
turns under several identities. So the key is generated under a lock on the database and
registered in the same transaction, and only while the ledger lists no signing key.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from receipts.errors import KeyAlreadyListed
from receipts.signing import Signer
from receipts.store import SigningKeyRow, create_engine, register_signing_key, transaction

# Any constant shared by every callproof process (the migrations' lock is another).
_FIRST_KEY_LOCK = 0x63616C6C6B657931  # "callkey1"


def first_signing_key(url: str, generate: Callable[[], Signer]) -> Signer:
    """``generate()``'s key, registered as the ledger's first; KeyAlreadyListed when the
    ledger lists a key (another replica's, or one whose file went missing). Gateways
    starting together take turns: on Postgres an advisory lock, on SQLite the write lock
    taken up front (the writer's BEGIN IMMEDIATE; a read then a write in a deferred
    transaction fails "database is locked" at once when another gateway wrote in between)."""
    # SQLite: the writer's engine, for its BEGIN IMMEDIATE; Postgres: a plain one, since the
    # writer's 5 s lock_timeout would end a wait behind other starting gateways
    engine = create_engine(url, writer=url.startswith("sqlite"))
    try:
        with transaction(engine, "cannot register a signing key") as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_FIRST_KEY_LOCK)))
            listed = list(conn.execute(sa.select(SigningKeyRow.key_id)).scalars())
            if listed:
                raise KeyAlreadyListed(listed)
            signer = generate()
            register_signing_key(conn, signer)
        return signer
    finally:
        engine.dispose()
