"""The trial writer's queue is bounded in bytes: a slow disk slows saving down and never grows
memory past the bound; every step still reaches the disk, in order. mltrace.writer.byte_queue itself:
bytes are freed when an item is written, not when it is taken; an item larger than the bound
still goes, alone."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mltrace.collections import Collection, CollectionManager
from mltrace.modes import ModeKeys
from mltrace.storage.local import LocalStorage
from mltrace.trials import create_trial
from mltrace.writer import TrialWriter
from mltrace.writer.byte_queue import ByteQueue

MB = 1 << 20


class ThrottledDisk(LocalStorage):
    """A local directory whose writes take ``delay`` seconds more each (a slow disk)."""

    def __init__(self, path: str, delay: float) -> None:
        super().__init__(path)
        self.delay = delay
        self.writes = 0

    def write(self, key: str, data: bytes) -> None:
        time.sleep(self.delay)
        super().write(key, data)
        self.writes += 1


def test_a_slow_disk_slows_the_writer_down_and_memory_stays_bounded(tmp_path: Path) -> None:
    disk = ThrottledDisk(str(tmp_path / "run"), delay=0.05)
    writer = TrialWriter(disk, "worker_0", max_pending_bytes=3 * MB)
    manager = CollectionManager()
    manager.add(Collection("default"))
    writer.write_collections(manager.to_json())
    steps, step_bytes = 12, MB
    started = time.monotonic()
    for step in range(steps):
        writer.open_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor("w", np.full(step_bytes // 4, step, dtype=np.float32), ModeKeys.TRAIN, step)
        writer.close_step()
    submitted = time.monotonic() - started
    writer.close()

    held = writer._queue.peak_bytes  # noqa: SLF001 - the bound is what this test is about
    assert 2 * MB < held <= 3 * MB + 64 * 1024  # the queue filled up to its bound, not past it
    # 12 steps of 2 files each at 50 ms a file: saving waited for the disk (without the bound
    # all 12 steps would be queued at once, in well under the time 20 writes take).
    assert submitted > 20 * 0.05 * 0.8
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("w").steps() == list(range(steps))
    assert trial.tensor("w").value(steps - 1)[0] == steps - 1


def test_bytes_are_released_when_an_item_is_done_not_when_it_is_taken() -> None:
    q: ByteQueue[str] = ByteQueue(max_bytes=100)
    q.put("a", 60)
    item, size = q.get(timeout=0)
    assert (item, size) == ("a", 60)
    with pytest.raises(queue.Full):  # "a" is still being written: 60 + 50 > 100
        q.put("b", 50, block=False)
    q.task_done(size)
    q.put("b", 50, block=False)
    assert q.held_bytes == 50


def test_an_item_larger_than_the_bound_goes_alone() -> None:
    q: ByteQueue[str] = ByteQueue(max_bytes=10)
    q.put("huge", 1000, block=False)  # an empty queue takes anything: else it could never go
    with pytest.raises(queue.Full):
        q.put("small", 1, timeout=0.05)
    done = threading.Event()

    def writer() -> None:
        got, size = q.get()
        q.task_done(size)
        done.set()

    threading.Thread(target=writer).start()
    q.put("small", 1, timeout=5)  # waits until the huge one is written
    assert done.is_set() and q.held_bytes == 1 and q.peak_bytes == 1000
    with pytest.raises(queue.Empty):
        ByteQueue[str](max_bytes=1).get(timeout=0)
    with pytest.raises(ValueError, match="max_bytes=0"):
        ByteQueue[str](max_bytes=0)
