"""A FIFO queue bounded by the bytes its items hold, for the trial writer's background thread.

A queue bounded in items bounds nothing useful when one item is a 40-byte collections file and
the next a step of 2 GB of weights: a slow disk behind 64 such steps holds 128 GB in memory. Here
the producer waits (or, with ``block=False``, is told the queue is full) while the bytes queued
and not yet written would pass ``max_bytes``. The bytes of an item are released when the
consumer says it is done with it (``task_done``), not when it takes it: the item's memory is
held until it is written. An item larger than ``max_bytes`` is let in when the queue is empty,
so that it can go at all.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class ByteQueue(Generic[T]):
    """FIFO of ``(item, size)`` bounded by the sum of the sizes held (taken or not yet taken)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes={max_bytes}: a queue needs room for at least one byte")
        self.max_bytes = max_bytes
        self._items: collections.deque[tuple[T, int]] = collections.deque()
        self._held = 0  # bytes of items queued or taken and not yet done
        self._unfinished = 0
        self._lock = threading.Lock()
        # Two conditions on one lock: the consumer waits for items, producers and join() for
        # bytes to be freed, so a task_done wakes no idle consumer for nothing.
        self._changed = threading.Condition(self._lock)
        self._not_empty = threading.Condition(self._lock)
        #: the most bytes held at once (for tests and benchmarks)
        self.peak_bytes = 0

    @property
    def held_bytes(self) -> int:
        """Bytes of the items queued or being written."""
        return self._held

    def put(self, item: T, size: int, block: bool = True, timeout: float | None = None) -> None:
        """Queue ``item`` of ``size`` bytes, waiting while it would not fit.

        Raises:
            queue.Full: it did not fit (at once with ``block=False``, else within ``timeout``).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self._held and self._held + size > self.max_bytes:
                left = None if deadline is None else deadline - time.monotonic()
                if not block or (left is not None and left <= 0):
                    raise queue.Full
                self._changed.wait(left)
            self._items.append((item, size))
            self._held += size
            self._unfinished += 1
            self.peak_bytes = max(self.peak_bytes, self._held)
            self._not_empty.notify()

    def get(self, timeout: float | None = None) -> tuple[T, int]:
        """The oldest ``(item, size)``; call :meth:`task_done` with it once it is handled.

        Raises:
            queue.Empty: nothing came within ``timeout`` (``0``: nothing is queued now).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._not_empty:
            while not self._items:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Empty
                self._not_empty.wait(left)
            return self._items.popleft()

    def task_done(self, size: int) -> None:
        """The consumer is done with an item of ``size`` bytes: its bytes are free again."""
        with self._changed:
            self._held -= size
            self._unfinished -= 1
            self._changed.notify_all()

    def join(self) -> None:
        """Wait until every item put was handled."""
        with self._changed:
            while self._unfinished:
                self._changed.wait()
