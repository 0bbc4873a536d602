"""Bytes a worker thread writes, read by the event loop as they come: how an export bundle
(written by gzip and tarfile, blocking file APIs) reaches its client while it is being made.

The thread never blocks the loop and the loop never blocks a thread: chunks cross with
``call_soon_threadsafe``, and a semaphore holds the writer once ``depth`` chunks wait unread,
so a slow client costs at most ``depth`` chunks of memory. A reader that leaves is noticed by
the writer at its next chunk (Stopped), as whole-chain work notices at its next receipt; so is
one that stays connected but takes no chunk for ``stall_s``: the writer holds a thread, and an
export a database snapshot, that a reader must not keep forever.
"""

from __future__ import annotations

import asyncio
import threading
import time

from receipts.errors import Stopped

_END = object()
_WAIT_S = 0.25  # how often a writer held by a full pipe looks whether its reader has gone


class ThreadPipe:
    """A binary file for one writer thread (``write``, then ``finish`` or ``fail``) and an
    async reader (``read``) on the loop that made it."""

    def __init__(self, chunk: int = 1 << 16, depth: int = 8, stall_s: float = 60.0) -> None:
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue[object] = asyncio.Queue()  # bounded by _room
        self._room = threading.Semaphore(depth)
        self._gone = threading.Event()
        self._chunk = chunk
        self._stall_s = stall_s
        self._buffer = bytearray()

    # the writer's side (a worker thread)

    def write(self, data: bytes) -> int:
        self._buffer += data
        if len(self._buffer) >= self._chunk:
            self._send(bytes(self._buffer))
            self._buffer.clear()
        return len(data)

    def flush(self) -> None:
        """Nothing: chunks leave when full, and `finish` sends the rest."""

    def finish(self) -> None:
        """The writer is done: what it wrote is read to the end."""
        if self._buffer:
            self._send(bytes(self._buffer))
            self._buffer.clear()
        self._end(_END)

    def fail(self, error: BaseException) -> None:
        """The writer failed: the reader gets ``error`` after what was already sent."""
        self._end(error)

    def _send(self, chunk: bytes) -> None:
        deadline = time.monotonic() + self._stall_s
        while not self._room.acquire(timeout=_WAIT_S):
            if self._gone.is_set():
                break
            if time.monotonic() > deadline:
                raise Stopped(
                    f"the client took nothing of this stream for {self._stall_s:g} s; it is cut off"
                )
        if self._gone.is_set():
            raise Stopped("the client reading this stream has gone")
        self._loop.call_soon_threadsafe(self._items.put_nowait, chunk)

    def _end(self, item: object) -> None:
        """The last item, past the bound: the writer must not wait to say it is done."""
        if not self._gone.is_set():
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)

    # the reader's side (the event loop)

    async def read(self) -> bytes | None:
        """The next chunk; None once the writer finished. Raises what the writer failed with."""
        item = await self._items.get()
        if isinstance(item, bytes):
            self._room.release()
            return item
        if isinstance(item, BaseException):
            raise item
        return None  # _END

    def close(self) -> None:
        """The reader is done (or gone): a writer still at work stops at its next chunk."""
        self._gone.set()
