"""The memory the trial writer shares with its process (mltrace.writer.shared_ring): a step's
large values are copied there once on the training thread and written by the child from there.
The files are the same bytes as through the pipe; the ring is used in order, released as the
child writes, never waited for (a full ring sends values through the pipe), never written by a
forked copy of the process, and what the child never got is still written by the thread."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mltrace.collections import CollectionManager
from mltrace.modes import ModeKeys
from mltrace.storage.atomic_files import AtomicFiles
from mltrace.storage.local import LocalStorage
from mltrace.trials import create_trial
from mltrace.writer import TrialWriter
from mltrace.writer import child as protocol
from mltrace.writer import process as writer_process
from mltrace.writer.shared_ring import ALIGN, MIN_PART_BYTES, SharedRing

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memory files are Linux's")

BIG = MIN_PART_BYTES // 4  # float32 elements of the smallest value the ring takes


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _write_steps(writer: TrialWriter, steps: range, elements: int = 3 * BIG) -> None:
    for step in steps:
        writer.open_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor("w", np.arange(elements, dtype=np.float32).reshape(3, -1) + step,
                          ModeKeys.TRAIN, step, wall_time=1.0)
        writer.add_tensor("b", np.full(4, float(step)), ModeKeys.TRAIN, step, wall_time=1.0)
        writer.add_tensor("g", np.full((elements // 3, 3), float(step), dtype=np.float32).T,
                          ModeKeys.TRAIN, step, wall_time=1.0)
        writer.close_step()


# -- the ring itself -------------------------------------------------------------------------------
def test_a_snapshot_holds_the_values_bytes_in_c_order_and_small_values_stay_out():
    ring = SharedRing(4 * MIN_PART_BYTES)
    value = np.arange(BIG, dtype=np.float32).reshape(-1, 2).T  # not contiguous
    part = ring.snapshot(value)
    assert part is not None and part.tobytes() == value.tobytes()
    assert ring.owns(part) and not ring.owns(value.tobytes())
    assert ring.locate(part) == (0, MIN_PART_BYTES, MIN_PART_BYTES)
    assert ring.snapshot(np.zeros(BIG - 1, dtype=np.float32)) is None
    value += 1  # the snapshot is a copy: the optimizer may change the value right after
    assert part.tobytes() != value.tobytes()


def test_claims_are_aligned_wrap_to_the_start_and_wait_for_their_release():
    ring = SharedRing(3 * MIN_PART_BYTES)
    odd = np.ones(BIG + 1, dtype=np.float32)
    first = ring.snapshot(odd)
    second = ring.snapshot(odd)
    assert first is not None and second is not None
    offset, length, end = ring.locate(second)
    assert offset % ALIGN == 0 and offset == ring.locate(first)[2] and length == odd.nbytes
    assert ring.snapshot(odd) is None, "no room before the ring's end, nor at its start"
    ring.release(end - 1)  # the child wrote the first part only
    third = ring.snapshot(odd)
    assert third is not None and ring.locate(third)[0] == 0, "from the ring's start"
    assert ring.snapshot(odd) is None
    ring.release(ring.head)
    ring.enabled = False  # a forked copy, or a child gone
    assert ring.snapshot(odd) is None


def test_a_value_larger_than_the_ring_goes_through_the_pipe():
    ring = SharedRing(2 * MIN_PART_BYTES)
    assert ring.snapshot(np.zeros(3 * BIG, dtype=np.float32)) is None
    assert ring.head == 0


# -- the child's side ------------------------------------------------------------------------------
def test_the_child_reads_segments_of_the_pipe_and_of_the_ring():
    ring = memoryview(bytes(range(256)) * 4)
    body = (protocol.SEGMENT.pack(protocol.SEG_INLINE, 3, 0, 0) + b"abc"
            + protocol.SEGMENT.pack(protocol.SEG_RING, 4, 10, 900)
            + protocol.SEGMENT.pack(protocol.SEG_RING, 2, 0, 700)
            + protocol.SEGMENT.pack(protocol.SEG_INLINE, 1, 0, 0) + b"z")
    parts, end = protocol.segments(body, ring)
    assert b"".join(parts) == b"abc" + bytes([10, 11, 12, 13]) + bytes([0, 1]) + b"z"
    assert end == 900
    with pytest.raises(ValueError, match="out of bounds"):
        protocol.segments(protocol.SEGMENT.pack(protocol.SEG_RING, 8, 1020, 1), ring)
    with pytest.raises(ValueError, match="out of bounds"):
        protocol.segments(protocol.SEGMENT.pack(protocol.SEG_INLINE, 9, 0, 0) + b"short", ring)


def test_atomic_files_write_a_list_of_buffers_in_order(tmp_path):
    data = [memoryview(bytes([i % 251]) * (i % 7)) for i in range(1500)]  # more than one writev
    AtomicFiles().write(str(tmp_path / "d" / "f"), data)
    assert (tmp_path / "d" / "f").read_bytes() == b"".join(data)
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["f"]


# -- through the writer ------------------------------------------------------------------------------
def test_the_files_are_the_bytes_the_pipe_and_the_thread_write(tmp_path, monkeypatch):
    trials = {}
    for kind, ring in (("process", "on"), ("process", "off"), ("thread", "on")):
        monkeypatch.setenv(writer_process.WRITER_ENV, kind)
        monkeypatch.setenv(writer_process.RING_ENV, ring)
        root = tmp_path / f"{kind}-{ring}"
        writer = TrialWriter(LocalStorage(str(root)), "worker_0")
        writer.write_collections(CollectionManager().to_json())
        writer.flush()  # the child is ready: the steps go to it
        _write_steps(writer, range(12))
        process = writer._process  # noqa: SLF001
        if kind == "process" and ring == "on":
            assert process is not None and process.ring is not None
            used = process.ring.head
            assert used >= 2 * 11 * 3 * MIN_PART_BYTES, "every step's two large values but the first's"
        writer.flush()
        if kind == "process" and ring == "on":
            assert process.ring.released == process.ring.head, "the child let go of all of it"
        writer.write_end_marker()
        writer.close()
        assert writer.failures.messages == []
        trials[(kind, ring)] = _files(root)
    assert trials[("process", "on")] == trials[("process", "off")] == trials[("thread", "on")]
    trial = create_trial(str(tmp_path / "process-on"))
    assert trial.steps() == list(range(12))
    assert (trial.tensor("g").value(11) == 11.0).all() and trial.tensor("w").value(5)[0, 1] == 6.0


def test_a_full_ring_sends_values_through_the_pipe_and_training_never_waits(tmp_path):
    """With the child stopped, nothing is released: once the ring is full, large values go
    through the pipe as before; handing steps over does not wait; all are written once the
    child runs again, in order."""
    writer = TrialWriter(LocalStorage(str(tmp_path / "run")), "worker_0")
    writer.write_collections(CollectionManager().to_json())
    process = writer._process  # noqa: SLF001
    assert process is not None and process.ring is not None
    writer.flush()
    ring = process.ring
    elements = 3 * 87381  # two values of 1 MiB a step: 18 steps pass the ring's 32 MiB
    steps = ring.size // (8 * elements) + 2
    os.kill(process.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        _write_steps(writer, range(steps), elements)
        assert time.monotonic() - start < 10
        assert ring.released == 0, "a stopped child releases nothing"
        assert ring.size - 8 * elements < ring.head <= ring.size, "full, and never past it"
    finally:
        os.kill(process.pid, signal.SIGCONT)
    writer.flush()
    assert ring.released == ring.head
    writer.close()
    assert writer.failures.messages == []
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == list(range(steps))
    for step in range(steps):
        assert (trial.tensor("g").value(step) == float(step)).all()
        assert trial.tensor("w").value(step)[2, -1] == elements - 1 + step


def test_steps_in_the_ring_that_the_child_never_got_are_written_by_the_thread(tmp_path):
    """The child stopped, a first step of values too small for the ring fills the pipe; the
    next two wait in the batch behind it, their values in the ring. The child killed, the thread writes all three from what the pipe would
    have taken, the ring's memory included."""
    writer = TrialWriter(LocalStorage(str(tmp_path / "run")), "worker_0")
    writer.write_collections(CollectionManager().to_json())
    process = writer._process  # noqa: SLF001
    assert process is not None and process.ring is not None
    writer.flush()
    os.kill(process.pid, signal.SIGSTOP)
    writer.open_step(0, ModeKeys.TRAIN, 0)  # values too small for the ring fill the pipe
    writer.add_tensors([(f"small_{i}", np.full(BIG // 2, 0.0, dtype=np.float32)) for i in range(40)],
                       ModeKeys.TRAIN, 0)
    writer.add_tensor("g", np.zeros(3, dtype=np.float32), ModeKeys.TRAIN, 0)
    writer.close_step()
    _write_steps(writer, range(1, 3))
    assert process.ring.head > 0 and process.waiting == 3, "held in a batch, values in the ring"
    os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not process.gone and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process.ring.enabled, "a child gone releases nothing: the ring is not used again"
    _write_steps(writer, range(3, 5))
    writer.close()
    assert writer._process is None  # noqa: SLF001 - the thread took over
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == list(range(5))
    for step in range(5):
        assert (trial.tensor("g").value(step) == float(step)).all()


def test_a_forked_copy_never_writes_into_the_parents_ring(tmp_path):
    writer = TrialWriter(LocalStorage(str(tmp_path / "run")), "worker_0")
    writer.write_collections(CollectionManager().to_json())
    writer.flush()
    _write_steps(writer, range(2))
    process = writer._process  # noqa: SLF001
    assert process is not None and process.ring is not None
    pid = os.fork()
    if pid == 0:
        try:
            copy = process.ring
            code = 0 if copy is not None and not copy.enabled and copy.snapshot(
                np.zeros(BIG, dtype=np.float32)) is None else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert process.ring.enabled
    _write_steps(writer, range(2, 4))
    writer.close()
    assert writer.failures.messages == []
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == list(range(4))
    assert (trial.tensor("g").value(3) == 3.0).all()


def test_frames_a_discarding_child_drops_still_free_their_ring(monkeypatch):
    """Told to discard (its out_dir was replaced), the child writes nothing more, but what a
    dropped file held in the ring is released all the same, whether the reading thread or the
    writing loop drops it."""
    import io

    from mltrace.writer.byte_queue import ByteQueue

    reports: list[tuple[int, bytes]] = []
    monkeypatch.setattr(protocol, "_report", lambda kind, payload=b"": reports.append((kind, payload)))
    ring = memoryview(bytes(4096))

    def frame(end: int) -> bytes:
        body = protocol.SEGMENT.pack(protocol.SEG_RING, 100, 0, end)
        return protocol.HEADER.pack(protocol.OP_WRITE | protocol.IN_RING, 1, len(body)) + b"k" + body

    discarding = threading.Event()
    pending: ByteQueue[object] = ByteQueue(1 << 20)
    protocol._read_frames(io.BytesIO(frame(128)), pending, discarding, ring)  # noqa: SLF001
    discarding.set()
    protocol._read_frames(io.BytesIO(frame(256)), pending, discarding, ring)  # noqa: SLF001
    assert reports == [(protocol.R_RELEASED, b"256")], "dropped as it was read"

    class NoFiles:
        def write(self, path: str, data: object) -> None:
            raise AssertionError(f"wrote {path} while discarding")

    protocol._write_all("/nonexistent", NoFiles(), pending, discarding)  # noqa: SLF001
    assert reports == [(protocol.R_RELEASED, b"256"), (protocol.R_RELEASED, b"128")], \
        "the file queued before the discard: dropped by the writing loop, its ring released"
