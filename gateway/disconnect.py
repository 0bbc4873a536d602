"""Stop generating for a client that has gone.

A non-streaming request whose client timed out would otherwise run to the end: engine time
nobody reads (the embedded engine decodes one request at a time, so everyone waits), and with
the OpenAI SDK's retries the same request runs again next to it. A plain request is watched
until its receipt is committed; a stream until its first event, after which Litestar's
response cancels it when the server reports the disconnect. Watching starts once a request
has been running for a moment, so answers from a fast upstream pay one timer and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from litestar.types import Receive

from gateway.errors import APIError

T = TypeVar("T")

WATCH_AFTER_S = 0.05


async def unless_client_leaves(receive: Receive, work: Awaitable[T]) -> T:
    """``work``'s result; cancelled when the client disconnects first, and then an APIError
    499 (nginx's "client closed request": the answer has no reader). A receipt not yet
    taken by the ledger's writer is never sealed; one already being committed lands and is
    logged as committed late (gateway.completion)."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    watcher: asyncio.Task[None] | None = None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    def start_watching() -> None:
        nonlocal watcher
        if not task.done():
            watcher = loop.create_task(watch())

    timer = loop.call_later(WATCH_AFTER_S, start_watching)
    try:
        return await task
    except asyncio.CancelledError:
        if gone:
            raise APIError(
                499, "the client disconnected before the answer was ready", code=None
            ) from None
        raise
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
