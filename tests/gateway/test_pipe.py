"""ThreadPipe: a writer thread's bytes read on the event loop, bounded, with the writer's
errors and the reader's leaving passed across."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gateway.pipe import ThreadPipe
from receipts.errors import Stopped


async def _read_all(pipe: ThreadPipe) -> bytes:
    data = b""
    while (chunk := await pipe.read()) is not None:
        data += chunk
    return data


def test_bytes_arrive_in_chunks_and_the_rest_on_finish() -> None:
    async def main() -> bytes:
        pipe = ThreadPipe(chunk=4, depth=2)

        def write() -> None:
            for piece in (b"ab", b"cdef", b"g"):
                pipe.write(piece)
            pipe.finish()

        writer = asyncio.to_thread(write)
        data, _ = await asyncio.gather(_read_all(pipe), writer)
        return data

    assert asyncio.run(main()) == b"abcdefg"


def test_a_full_pipe_holds_its_writer_until_the_reader_takes_a_chunk() -> None:
    async def main() -> None:
        pipe = ThreadPipe(chunk=1, depth=2)
        sent = []

        def write() -> None:
            for n in range(4):
                pipe.write(bytes([n]))
                sent.append(n)
            pipe.finish()

        writer = asyncio.ensure_future(asyncio.to_thread(write))
        deadline = time.monotonic() + 10
        while sent != [0, 1]:
            assert time.monotonic() < deadline, sent
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert sent == [0, 1]  # the third chunk waits for room
        assert await pipe.read() == b"\x00"
        assert await _read_all(pipe) == b"\x01\x02\x03"
        await writer
        assert sent == [0, 1, 2, 3]

    asyncio.run(main())


def test_the_writers_error_reaches_the_reader_after_what_it_sent() -> None:
    async def main() -> None:
        pipe = ThreadPipe(chunk=1, depth=4)

        def write() -> None:
            pipe.write(b"x")
            pipe.fail(ValueError("the database went away"))

        await asyncio.to_thread(write)
        assert await pipe.read() == b"x"
        with pytest.raises(ValueError, match="went away"):
            await pipe.read()

    asyncio.run(main())


def test_a_writer_whose_reader_left_stops_even_when_the_pipe_is_full() -> None:
    async def main() -> None:
        pipe = ThreadPipe(chunk=1, depth=1)
        raised: list[BaseException] = []
        blocked = threading.Event()

        def write() -> None:
            try:
                pipe.write(b"a")
                blocked.set()
                pipe.write(b"b")  # no room: waits for a reader that leaves
            except Stopped as exc:
                raised.append(exc)

        writer = asyncio.ensure_future(asyncio.to_thread(write))
        await asyncio.to_thread(blocked.wait, 5)
        pipe.close()
        await asyncio.wait_for(writer, 5)
        assert len(raised) == 1

    asyncio.run(main())


def test_a_reader_that_takes_nothing_is_cut_off_after_stall_s() -> None:
    """A client that stays connected but reads nothing held a whole-chain thread (two of
    them stopped every tenant's exports and verifications) and a database snapshot."""

    async def main() -> None:
        pipe = ThreadPipe(chunk=1, depth=1, stall_s=0.5)

        def write() -> None:
            pipe.write(b"a")
            pipe.write(b"b")  # no room, and the reader never comes

        with pytest.raises(Stopped, match="took nothing of this stream for 0.5 s"):
            await asyncio.wait_for(asyncio.to_thread(write), 5)

    asyncio.run(main())
