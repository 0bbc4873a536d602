"""The database deadline: every key-store and ledger call the gateway awaits answers within
settings.db_timeout_s or fails closed. A server that hangs must cost the caller a 503 in
bounded time, as one that is down does, never a request held open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

T = TypeVar("T")


@asynccontextmanager
async def db_deadline(
    timeout_s: float, unavailable: Callable[[str], Exception], database: str
) -> AsyncIterator[None]:
    """`unavailable(message)` is raised, naming `database` and the setting, when the block
    takes longer than `timeout_s`."""
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            yield
    except TimeoutError:
        if not deadline.expired():  # the work's own timeout (a driver's): not this deadline
            raise
        raise unavailable(
            f"{database} did not answer within db_timeout_s ({timeout_s:g} s)"
        ) from None


async def within_db_timeout(
    work: Awaitable[T], timeout_s: float, unavailable: Callable[[str], Exception], database: str
) -> T:
    """`work`'s result, within `db_deadline`."""
    async with db_deadline(timeout_s, unavailable, database):
        return await work
