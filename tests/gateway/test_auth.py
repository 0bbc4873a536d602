"""API keys: stored as their secret's hash with checked fields, and the key cache (concurrent
requests share one lookup when an entry is missing or expired, and a revoked key stops working
once its entry expires)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from contextlib import closing

import pytest
import sqlalchemy as sa

from gateway.apikeys import InvalidKeyField, KeyStore
from gateway.auth import Authenticator, KeyCall
from gateway.errors import APIError
from migrations.runner import upgrade


def test_the_database_holds_the_secrets_hash_never_the_secret(fresh_sqlite_url: str) -> None:
    upgrade(fresh_sqlite_url)
    with closing(KeyStore.open(fresh_sqlite_url)) as store:
        key, secret = store.create("agent", "acme")
    engine = sa.create_engine(fresh_sqlite_url)
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM api_keys WHERE id = :i"), {"i": key.id}).one()
    engine.dispose()
    assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert all(secret not in str(value) for value in row)


def test_the_key_store_refuses_a_bad_name_or_role_itself(fresh_sqlite_url: str) -> None:
    """`callproof keys create --name` reaches the store with no other check: a newline would
    forge a line of `keys list`."""
    upgrade(fresh_sqlite_url)
    with closing(KeyStore.open(fresh_sqlite_url)) as store:
        for fields, param in (({"name": "ops\nforged"}, "name"), ({"role": "root"}, "role")):
            with pytest.raises(InvalidKeyField) as refused:
                store.create(**{"role": "agent", "tenant": "acme", **fields})
            assert refused.value.param == param


def test_concurrent_misses_share_one_lookup_and_revocation_applies_after_ttl(
    fresh_sqlite_url: str,
) -> None:
    upgrade(fresh_sqlite_url)
    store = KeyStore.open(fresh_sqlite_url)
    try:
        key, secret = store.create("agent", "acme")
        lookups = 0
        lock = threading.Lock()
        real_lookup = store.lookup

        def counted(value: str):  # the real lookup, counted
            nonlocal lookups
            with lock:
                lookups += 1
            time.sleep(0.05)  # a slow database makes the herd visible
            return real_lookup(value)

        store.lookup = counted  # type: ignore[method-assign]
        auth = Authenticator(store, ttl_s=1.5, call=KeyCall(10))  # room for a slow machine
        header = f"Bearer {secret}"

        async def burst() -> list[str]:
            found = await asyncio.gather(*(auth.authenticate(header) for _ in range(20)))
            return [k.id for k in found]

        assert asyncio.run(burst()) == [key.id] * 20 and lookups == 1
        assert asyncio.run(burst()) == [key.id] * 20 and lookups == 1  # cached
        time.sleep(1.55)
        assert asyncio.run(burst()) == [key.id] * 20 and lookups == 2  # expired: one lookup
        store.revoke(key.id)
        time.sleep(1.55)
        with pytest.raises(APIError) as err:
            asyncio.run(auth.authenticate(header))
        assert err.value.status == 401
    finally:
        store.close()


def test_a_ttl_of_zero_checks_every_request_so_a_revocation_elsewhere_applies_at_once(
    fresh_sqlite_url: str,
) -> None:
    """key_cache_ttl_s = 0 is no cache (docs/configuration.md): a key another process
    revoked (here the store, as `callproof keys revoke` does) is refused on the next request."""
    upgrade(fresh_sqlite_url)
    store = KeyStore.open(fresh_sqlite_url)
    try:
        key, secret = store.create("agent", "acme")
        auth = Authenticator(store, ttl_s=0, call=KeyCall(10))
        header = f"Bearer {secret}"
        assert asyncio.run(auth.authenticate(header)).id == key.id
        store.revoke(key.id)
        with pytest.raises(APIError) as err:
            asyncio.run(auth.authenticate(header))
        assert err.value.status == 401
    finally:
        store.close()


def test_a_lookup_in_flight_when_its_key_is_revoked_is_not_cached(fresh_sqlite_url: str) -> None:
    """A lookup that read the key just before the admin API revoked it must not put it back
    in the cache after `forget`, where it would work for another TTL."""
    upgrade(fresh_sqlite_url)
    store = KeyStore.open(fresh_sqlite_url)
    try:
        key, secret = store.create("agent", "acme")
        read, release = threading.Event(), threading.Event()
        real_lookup = store.lookup

        def read_then_wait(value: str):
            found = real_lookup(value)
            read.set()
            release.wait(5)
            return found

        store.lookup = read_then_wait  # type: ignore[method-assign]
        auth = Authenticator(store, ttl_s=60, call=KeyCall(10))

        async def scenario() -> None:
            in_flight = asyncio.ensure_future(auth.authenticate(f"Bearer {secret}"))
            await asyncio.to_thread(read.wait, 5)
            store.revoke(key.id)
            auth.forget(key.id)
            release.set()
            assert (await in_flight).id == key.id  # the request already under way
            with pytest.raises(APIError) as refused:
                await auth.authenticate(f"Bearer {secret}")
            assert refused.value.status == 401

        asyncio.run(scenario())
    finally:
        store.close()
