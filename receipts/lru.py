"""A bounded memo: what verification remembers per distinct manifest or schema. A chain
repeats a few of them many times, but whoever writes receipts (an agent key) chooses how many
distinct ones there are, so a memo that kept them all grew without bound (1,250 receipts of
distinct 60 KB tool sets held 929 MB)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most ``size`` values by key, forgetting the least recently used."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("an LRU memo holds at least one entry")
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[K], V]) -> V:
        """The value remembered for ``key``, else ``make(key)``, remembered."""
        items = self._items
        if key in items:
            items.move_to_end(key)
            return items[key]
        value = items[key] = make(key)
        if len(items) > self.size:
            items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)
