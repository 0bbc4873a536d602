"""Threads with a deep stack, for the grammar compilers.

llguidance and xgrammar recurse through nested rules and schemas in native code, about
2.7 KB of stack a level: on a default 8 MB thread stack, 3,000 rules that each name the next
(a 40 KB grammar) overflowed it and took the whole process down (SIGSEGV). The limits in
runtime.limits refuse the shapes known to nest deep, but the compilers read grammars in ways
a check in Python cannot fully mirror; so everything that compiles, validates or steps a
grammar runs on threads whose stack holds any input within the byte limits (64 KB of
grammar nests at most about 10,000 levels: 27 MB) ten times over. Only the pages a thread
touches are committed; the rest is address space.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

DEEP_STACK_BYTES = 256 * 2**20

_STARTING = threading.Lock()


class DeepStackExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose threads get DEEP_STACK_BYTES of stack. Python sets a
    thread's stack size process-wide when it starts (threading.stack_size); the pool starts
    its threads on demand, so the size is set around that start and put back."""

    def _adjust_thread_count(self) -> None:
        with _STARTING:
            previous = threading.stack_size(DEEP_STACK_BYTES)
            try:
                super()._adjust_thread_count()  # type: ignore[misc]
            finally:
                threading.stack_size(previous)
