"""A request body arrives within body_timeout_s, or the request is a 408.

uvicorn reads a body only as the application asks for it, with no deadline of its own: a
client that sends less than its Content-Length and then waits would hold its connection, and
the handler awaiting the body, for as long as it likes (slowloris). This ASGI wrapper gives
each request's body one deadline from the request's start; once the body is complete,
`receive` is the server's again (the disconnect watch of a long generation waits on it).
"""

from __future__ import annotations

import asyncio

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import APIError


def body_deadline(app: ASGIApp, timeout_s: float) -> ASGIApp:
    """`app` with every HTTP request body due within `timeout_s` of the request's start."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + timeout_s
        complete = False

        async def receive_in_time() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise APIError(
                    408,
                    f"the request body did not arrive within body_timeout_s ({timeout_s:g} s):"
                    " send the whole body its Content-Length announces",
                    code="request_timeout",
                ) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await app(scope, receive_in_time, send)

    return guarded
