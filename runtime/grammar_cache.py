"""The grammar cache: compile each constraint once per (backend order, tokenizer).

Compiling is the expensive step (milliseconds for llguidance, seconds for Outlines), so:

* the key is (constraint kind, canonical constraint text, backend order, tokenizer digest):
  the same schema written with other key order or spacing shares one entry;
* compiles run in a thread pool, and concurrent requests for one key share ONE future, so a
  burst of identical requests compiles once;
* entries are bounded (LRU);
* a compile that fails on the input (a typed ``RuntimeInputError``: invalid, too complex, no
  backend supports it) is deterministic, so the failure is cached like a success and re-raised
  at once; any other exception (out of memory, a backend crash) is NOT cached: the waiters of
  that compile get it, and the next request compiles afresh.

Stats are kept per constraint kind (json, regex, ebnf, tools); the gateway's /metrics reads
them at scrape time, so this module knows nothing about Prometheus.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import asdict, dataclass

from runtime.backends.base import CompiledGrammar
from runtime.backends.registry import BackendChain
from runtime.constraint import Constraint
from runtime.deep_stack import DeepStackExecutor
from runtime.errors import RuntimeInputError

CacheKey = tuple[str, str, tuple[str, ...], str]


@dataclass
class KindStats:
    hits: int = 0  # served from the cache, or joined a compile already running
    misses: int = 0  # had to start a compile
    compiles: int = 0  # compiles finished (successful or not)
    failures: int = 0
    compile_ms_sum: float = 0.0
    compile_ms_max: float = 0.0


def _retrieved(future: asyncio.Future[CompiledGrammar]) -> None:
    if not future.cancelled():
        future.exception()


class GrammarCache:
    def __init__(
        self,
        chain: BackendChain,
        *,
        max_entries: int = 512,
        workers: int = 2,
    ):
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.chain = chain
        self.max_entries = max_entries
        self._pool = DeepStackExecutor(max_workers=workers, thread_name_prefix="grammar")
        self._lock = threading.Lock()
        self._entries: OrderedDict[CacheKey, Future[CompiledGrammar]] = OrderedDict()
        self._stats: dict[str, KindStats] = {}

    def key(self, constraint: Constraint, order: tuple[str, ...] | None = None) -> CacheKey:
        names = order or self.chain.names
        return (constraint.kind, constraint.source, names, self.chain.tokenizer_digest)

    def submit(
        self, constraint: Constraint, order: tuple[str, ...] | None = None
    ) -> Future[CompiledGrammar]:
        """The one future for this constraint (compiled by the backends in ``order``, default
        the chain's): cached, in flight, or newly started."""
        key = self.key(constraint, order)
        with self._lock:
            stats = self._stats.setdefault(constraint.kind, KindStats())
            future = self._entries.get(key)
            if future is not None:
                self._entries.move_to_end(key)
                stats.hits += 1
                return future
            stats.misses += 1
            future = self._pool.submit(self._compile, constraint, order)
            self._entries[key] = future
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)  # an evicted in-flight future still completes
        future.add_done_callback(lambda f: self._forget_fault(key, f))
        return future

    def get(self, constraint: Constraint, timeout: float | None = None) -> CompiledGrammar:
        """Blocking: the compiled grammar, or the typed error its compile raised."""
        return self.submit(constraint).result(timeout)

    async def aget(
        self, constraint: Constraint, order: tuple[str, ...] | None = None
    ) -> CompiledGrammar:
        """The same without blocking the event loop. A waiter cancelled (its client left)
        leaves the compile alone: other requests may be waiting on the same future, and a
        queued compile cancelled under them failed them with CancelledError (a bare 500)."""
        shared = asyncio.wrap_future(self.submit(constraint, order))
        shared.add_done_callback(_retrieved)  # a failure no waiter is left to read is not news
        return await asyncio.shield(shared)

    def stats(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {kind: asdict(s) for kind, s in self._stats.items()}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, constraint: Constraint, order: tuple[str, ...] | None) -> CompiledGrammar:
        start = time.perf_counter()
        try:
            return self.chain.compile(constraint, order)
        except BaseException:
            with self._lock:
                self._stats[constraint.kind].failures += 1
            raise
        finally:
            ms = (time.perf_counter() - start) * 1000
            with self._lock:
                s = self._stats[constraint.kind]
                s.compiles += 1
                s.compile_ms_sum += ms
                s.compile_ms_max = max(s.compile_ms_max, ms)

    def _forget_fault(self, key: CacheKey, future: Future[CompiledGrammar]) -> None:
        """Drop a failed compile unless the failure is the input's fault (deterministic)."""
        exc = future.exception() if not future.cancelled() else None
        if future.cancelled() or (exc is not None and not isinstance(exc, RuntimeInputError)):
            with self._lock:
                if self._entries.get(key) is future:
                    del self._entries[key]
