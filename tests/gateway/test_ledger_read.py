"""LedgerRead's whole-chain turns: a tenant's export, once answered (done or refused), has
given back its turn, so the client's next one is not a 429."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import gateway.ledger_read
from gateway.errors import APIError
from gateway.ledger_read import LedgerRead
from gateway.pipe import ThreadPipe
from receipts.errors import BundleTooLarge, LedgerUnavailable, Stopped


async def _stays(_: Any = None) -> dict[str, Any]:
    """An ASGI receive whose client never leaves."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def _slow_to_end(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    linger: Callable[[], object] = lambda: time.sleep(0.3),
) -> None:
    """ThreadPipe's ``name`` (finish or fail) lingers in its thread after it has told the
    reader: the window in which the turn was still held when the answer had gone."""
    end: Callable[..., None] = getattr(ThreadPipe, name)

    def lingering(self: ThreadPipe, *args: Any) -> None:
        end(self, *args)
        linger()

    monkeypatch.setattr(ThreadPipe, name, lingering)


def _export(data: bytes) -> Callable[..., None]:
    def write(out: Any, should_stop: Callable[[], bool]) -> None:
        out.write(data)

    return write


def _too_large(out: Any, should_stop: Callable[[], bool]) -> None:
    raise BundleTooLarge("a bundle of seqs 1..40 would be too large")


def test_a_finished_export_has_given_back_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_to_end(monkeypatch, "finish")

    async def main() -> list[bytes]:
        read = LedgerRead(timeout_s=5)
        try:
            downloads = []
            for n in range(2):
                stream = await read.streamed("acme", _stays, _export(b"bundle %d" % n))
                downloads.append(b"".join([chunk async for chunk in stream]))
            return downloads
        finally:
            read.close()

    assert asyncio.run(main()) == [b"bundle 0", b"bundle 1"]


def test_a_refused_export_has_given_back_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_to_end(monkeypatch, "fail")

    async def main() -> bytes:
        read = LedgerRead(timeout_s=5)
        try:
            with pytest.raises(APIError) as refused:
                await read.streamed("acme", _stays, _too_large)
            assert (refused.value.status, refused.value.code) == (400, "bundle_too_large")
            stream = await read.streamed("acme", _stays, _export(b"a shorter range"))
            return b"".join([chunk async for chunk in stream])
        finally:
            read.close()

    assert asyncio.run(main()) == b"a shorter range"


def test_a_second_export_while_one_runs_is_a_429(monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn is still one per tenant, held while the writer's thread runs: here from
    the first chunk, which its finish sends, until the test lets it end."""
    let_end = threading.Event()
    _slow_to_end(monkeypatch, "finish", lambda: let_end.wait(10))

    async def main() -> None:
        read = LedgerRead(timeout_s=5)
        try:
            first = await read.streamed("acme", _stays, _export(b"x"))
            with pytest.raises(APIError) as busy:
                await read.streamed("acme", _stays, _export(b"y"))
            assert busy.value.status == 429
            let_end.set()
            assert b"".join([chunk async for chunk in first]) == b"x"
        finally:
            read.close()

    asyncio.run(main())


def test_a_last_chunk_the_client_never_takes_ends_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writer's finish gave up on a stalled client (Stopped) outside the try that passes
    errors on: the reader waited for an end that never came."""
    monkeypatch.setattr(gateway.ledger_read, "ThreadPipe", functools.partial(ThreadPipe, 4, 1, 0.3))

    def three_chunks(out: Any, should_stop: Callable[[], bool]) -> None:
        for piece in (b"aaaa", b"cccc", b"bb"):  # "bb" is finish's, once "cccc" is taken
            out.write(piece)

    async def main() -> list[bytes]:
        read = LedgerRead(timeout_s=5)
        got: list[bytes] = []
        try:
            stream = await read.streamed("acme", _stays, three_chunks)
            await asyncio.sleep(1)  # the client takes nothing for longer than stall_s
            with pytest.raises(Stopped, match="took nothing of this stream"):
                async with asyncio.timeout(10):
                    async for chunk in stream:
                        got.append(chunk)
            return got
        finally:
            read.close()

    assert asyncio.run(main()) == [b"aaaa", b"cccc"]


def test_an_export_queued_at_shutdown_is_a_503_not_a_wait_forever() -> None:
    """`close` drops queued whole-chain work: an export that never ran waited on its pipe."""
    running, release = threading.Event(), threading.Event()

    def held(out: Any, should_stop: Callable[[], bool]) -> None:
        out.write(b"x" * (1 << 16))  # a whole chunk: its stream has begun
        running.set()
        release.wait(10)

    async def main() -> None:
        read = LedgerRead(timeout_s=5, chain_workers=1)
        try:
            first = await read.streamed("acme", _stays, held)
            queued = asyncio.ensure_future(read.streamed("globex", _stays, _export(b"y")))
            await asyncio.sleep(0.2)
            assert running.is_set() and not queued.done()
            read.close()
            with pytest.raises(LedgerUnavailable, match="shutting down"):
                async with asyncio.timeout(10):
                    await queued
            await first.aclose()
        finally:
            release.set()
            read.close()

    asyncio.run(main())
