"""What the analysis layer keeps between requests: values of steps already read, per key, in a
thread-safe least-recently-used cache. A complete step of a trial never changes, so a long-lived
viewer (the TensorBoard plugin) reads only the new steps of a live run; the bound keeps a viewer
that looks at many tensors from growing without end.

Example:
    >>> cache: LruCache[dict[int, float]] = LruCache(dict, max_entries=2)
    >>> cache.get("loss")[10] = 0.5
    >>> cache.get("loss")
    {10: 0.5}
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LruCache(Generic[V]):
    """Entries made by ``create`` on first use, the least recently used dropped beyond
    ``max_entries``. Callers fill the entry ``get`` returns in place.

    Args:
        create: makes the empty entry of a key not seen yet.
        max_entries: how many keys are kept.
    """

    def __init__(self, create: Callable[[], V], max_entries: int) -> None:
        self._create = create
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def get(self, key: Hashable) -> V:
        """The entry of ``key`` (a new empty one when unknown); it becomes the most recent."""
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                entry = self._data[key] = self._create()
                while len(self._data) > self.max_entries:
                    self._data.popitem(last=False)
            else:
                self._data.move_to_end(key)
            return entry

    def items(self) -> list[tuple[Hashable, V]]:
        """Every ``(key, entry)`` held now, least recently used first (a copy: safe to walk
        while other threads use the cache)."""
        with self._lock:
            return list(self._data.items())


__all__ = ["LruCache"]
