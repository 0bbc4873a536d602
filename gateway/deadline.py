"""The database deadline: every key-store and ledger call the gateway awaits answers within
settings.db_timeout_s or fails closed. A server that hangs must cost the caller a 503 in
bounded time, as one that is down does, never a request held open."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def within_db_timeout(
    work: Awaitable[T], timeout_s: float, unavailable: Callable[[str], Exception], database: str
) -> T:
    """`work`'s result; `unavailable(message)` is raised, naming `database` and the setting,
    when it takes longer than `timeout_s`."""
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            return await work
    except TimeoutError:
        if not deadline.expired():  # the work's own timeout (a driver's): not this deadline
            raise
        raise unavailable(
            f"{database} did not answer within db_timeout_s ({timeout_s:g} s)"
        ) from None
