"""Bearer-token authentication and role checks, as Litestar guards.

Each controller declares the one role it serves (`guards = [require_role("agent")]`), so an
agent key can never reach /audit and an auditor key never /v1; handlers take the admitted key
as the `principal` dependency. Looked-up keys are cached for a short TTL
(settings.key_cache_ttl_s) to keep the database off the hot path; a revoked key therefore
stops working within that TTL. When the entry expires under load, the requests that find it
missing share one lookup instead of each querying the database.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

from gateway.apikeys import ApiKey, KeyStore, KeyStoreUnavailable, Role, hash_secret
from gateway.deadline import within_db_timeout
from gateway.errors import APIError
from gateway.query import refuse_unknown_query

T = TypeVar("T")
BEARER = [{"apiKey": []}]  # OpenAPI security requirement of every authenticated controller


class KeyCall:
    """Runs a key-store call off the event loop within db_timeout_s: a database that hangs
    fails closed (503) in bounded time, as one that is down does."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        return await within_db_timeout(
            asyncio.to_thread(fn, *args),
            self.timeout_s,
            KeyStoreUnavailable,
            "the API key database",
        )


class Authenticator:
    def __init__(self, store: KeyStore, ttl_s: float, call: KeyCall):
        self._store = store
        self._ttl_s = ttl_s
        self._call = call
        self._cache: dict[str, tuple[ApiKey, float]] = {}
        self._lookups: dict[str, asyncio.Task[ApiKey | None]] = {}  # in flight, by digest
        self._revocations = 0  # a lookup that began before a revocation must not cache

    async def authenticate(self, authorization: str | None) -> ApiKey:
        """The active key named by an `Authorization: Bearer cp_...` header, else 401."""
        scheme, _, secret = (authorization or "").partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise APIError(
                401,
                f"missing API key ({_what_was_sent(authorization, scheme)}): send"
                " Authorization: Bearer cp_...",
                code="invalid_api_key",
            )
        digest = hash_secret(secret)
        cached = self._cache.get(digest)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        lookup = self._lookups.get(digest)
        if lookup is None:
            lookup = asyncio.ensure_future(self._lookup(digest, secret))
            lookup.add_done_callback(_retrieve)  # its callers may all have gone
            self._lookups[digest] = lookup
        key = await asyncio.shield(lookup)  # one caller's cancellation must not fail the rest
        if key is None:
            raise APIError(401, "invalid or revoked API key", code="invalid_api_key")
        return key

    def forget(self, key_id: str) -> None:
        """Drop a key from the cache at once (revoked here; other processes wait the TTL)."""
        self._revocations += 1
        for digest, (key, _) in list(self._cache.items()):
            if key.id == key_id:
                del self._cache[digest]

    async def _lookup(self, digest: str, secret: str) -> ApiKey | None:
        revocations = self._revocations
        try:
            key = await self._call(self._store.lookup, secret)
        finally:
            del self._lookups[digest]
        if key is None:
            self._cache.pop(digest, None)
        elif self._ttl_s > 0 and revocations == self._revocations:  # a TTL of 0: no cache;
            # a revocation since the lookup began: it may have read the key before it
            self._cache[digest] = (key, time.monotonic() + self._ttl_s)
        return key


def _what_was_sent(authorization: str | None, scheme: str) -> str:
    """Names the scheme a client used, never a value: a key sent without "Bearer " would
    otherwise be echoed into the agent's exception and logs."""
    if not authorization:
        return "no Authorization header"
    if scheme.lower() == "bearer":
        return "a Bearer Authorization header without a key"
    if _SCHEME.fullmatch(scheme) and not scheme.startswith("cp_"):
        return f"a {scheme!r} Authorization header"
    return "an Authorization header that is not Bearer <key>"


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,19}")


def _retrieve(task: asyncio.Task[ApiKey | None]) -> None:
    """Mark a lookup's exception retrieved: each waiting caller has already received it."""
    if not task.cancelled():
        task.exception()


def require_role(role: Role, *, strict_query: bool = False) -> Guard:
    """A controller guard admitting only keys of `role` (401/403 otherwise), and with
    `strict_query` then refusing query parameters the route does not take (gateway.query),
    so that only an authenticated caller learns which ones it does. Guards run before
    Litestar reads the body: an anonymous caller gets its 401 without the gateway decoding
    (or validating, and describing) what it sent."""

    async def guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        authenticator: Authenticator = connection.app.state.authenticator
        key = await authenticator.authenticate(_authorization(connection))
        if key.role != role:
            raise APIError(
                403,
                f"{_article(key.role)} {key.role} key cannot use {connection.url.path}:"
                f" it needs {_article(role)} {role} key",
                code="wrong_role",
            )
        if strict_query:
            refuse_unknown_query(connection)
        connection.scope["auth"] = key  # where Litestar keeps it: `request.auth`

    return guard


def _authorization(connection: ASGIConnection) -> str | None:
    """The one Authorization header. Two are refused: a proxy that reads the first and a
    server that reads the last would each act for a different caller."""
    sent = connection.headers.getall("authorization", [])
    if len(sent) > 1:
        raise APIError(
            401,
            f"{len(sent)} Authorization headers: send one, Authorization: Bearer cp_...",
            code="invalid_api_key",
        )
    return sent[0] if sent else None


def current_principal(request: Request) -> ApiKey:
    """The key the controller's guard admitted (the `principal` dependency)."""
    return request.auth


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"
