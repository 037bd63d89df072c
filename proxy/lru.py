"""A bounded map that forgets its least recently stored entry: every in-process cache of the proxy is one.

In-process caches only save work (digests, counts, decisions, records read
before); the store stays the truth, so forgetting an entry costs a recomputation,
never a different answer. Bounded so that many sessions cannot grow memory.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, KeysView
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        return self._data.get(key)

    def touch(self, key: K) -> V | None:
        """As get, and a hit counts as a use (kept longest)."""
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)

    def clear(self) -> None:
        self._data.clear()

    def keys(self) -> KeysView[K]:
        return self._data.keys()

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)


class LockedLRU(LRU[K, V]):
    """An LRU shared with worker threads (counts made off the event loop, proxy/offloop.py)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._lock = threading.Lock()

    def touch(self, key: K) -> V | None:
        with self._lock:
            return super().touch(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            super().put(key, value)

    def clear(self) -> None:
        with self._lock:
            super().clear()
