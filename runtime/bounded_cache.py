"""A memo bounded by the bytes of what it is keyed on as well as by its count.

Agents resend the same tools, so the checks and validators built from a schema are kept;
but any agent key can send a new 64 KB tool set with every request, and 1,024 validators of
such schemas held 400 MB (a count alone bounds nothing useful). Each entry weighs the size
of the text it was built from plus a fixed overhead; the least recently used go first.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, ParamSpec, TypeVar

P = ParamSpec("P")
V = TypeVar("V")

ENTRY_OVERHEAD = 4096  # bytes an entry weighs beyond its text: a small schema's validator


class SizeBoundedMemo(Generic[P, V]):
    """``function``'s results by its arguments, at most ``max_entries`` of them and at most
    ``max_bytes`` of summed weight. A call that raises is not kept (as functools.lru_cache)."""

    def __init__(
        self,
        function: Callable[P, V],
        size_of: Callable[P, int],
        *,
        max_entries: int,
        max_bytes: int,
    ) -> None:
        self._function = function
        self._size_of = size_of
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        functools.update_wrapper(self, function)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> V:
        key = (args, tuple(sorted(kwargs.items())))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry[0]
        value = self._function(*args, **kwargs)  # outside the lock: builds may take a while
        weight = self._size_of(*args, **kwargs) + ENTRY_OVERHEAD
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (value, weight)
                self._bytes += weight
            while len(self._entries) > self.max_entries or (
                self._bytes > self.max_bytes and len(self._entries) > 1
            ):
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
        return value

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def weight(self) -> int:
        """The summed weight of the entries kept, in bytes."""
        return self._bytes


def size_bounded(
    size_of: Callable[P, int], *, max_entries: int, max_bytes: int
) -> Callable[[Callable[P, V]], SizeBoundedMemo[P, V]]:
    """Decorator form: ``@size_bounded(lambda text: len(text), max_entries=..., max_bytes=...)``."""

    def wrap(function: Callable[P, V]) -> SizeBoundedMemo[P, V]:
        return SizeBoundedMemo(function, size_of, max_entries=max_entries, max_bytes=max_bytes)

    return wrap
