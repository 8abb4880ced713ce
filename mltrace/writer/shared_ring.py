"""Memory shared with the trial writer's process, where a step's large values are copied once.

Through the pipe alone, a raw value is copied four times: into a bytes object on the training
thread, into the pipe by the reports thread, out of it by the child, into the page cache by the
child's write. On a transformer saving its weights and gradients every step (6.5 MB a step on
the benchmark's nanoGPT), the three copies off the training thread keep the second core busy
and the training thread waiting for it. Here the training thread copies a large value straight
into a ring of memory that the child has mapped too (a ``memfd``, Linux only), and the pipe
carries where it lies; the child writes it to the file from there. The copy on the training
thread is the snapshot every save needs (the optimizer changes the weights in place right
after), as numpy's ``tofile`` makes one into the page cache.

The ring is used in order: ``head`` counts the bytes claimed since the start, ``released`` the
bytes the child has written (or given up) and let go; a claim that would pass ``released`` by
more than the ring's size finds no room and the value goes through the pipe as before, so
training never waits for the ring. The child writes files in the order they were sent and the
claims were made in that order, so the end of the last value it wrote releases everything
before it (a value claimed for a step that was never sent, too).
"""

from __future__ import annotations

import logging
import mmap
import os

import numpy as np

logger = logging.getLogger(__name__)

#: The ring's size: about five steps of raw weights and gradients of the benchmark's nanoGPT
#: (0.85M parameters). Memory is taken as the ring is first used: a job that saves only small
#: values never touches it.
RING_BYTES = 32 << 20
#: Values smaller than this go through the pipe: for them a copy costs less than the call.
MIN_PART_BYTES = 64 << 10
#: Claims start at a multiple of this (a cache line), so that a value's copy is aligned.
ALIGN = 64


class SharedRing:
    """A ring of memory shared with one writer process (see the module docstring).

    Args:
        size: bytes; a multiple of ALIGN.
    """

    def __init__(self, size: int = RING_BYTES) -> None:
        self.size = size
        #: the memory file, passed to the child (closed here once the child has it)
        self.fd = os.memfd_create("mltrace-writer-ring", 0)  # not inherited but by pass_fds
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        self._base: int = self._bytes.ctypes.data
        self.head = 0
        self.released = 0
        #: False once the ring may no longer be written: in a forked copy of the process, whose
        #: mapping is the same memory, and once the child is gone.
        self.enabled = True
        self._ends: dict[int, int] = {}  # offset of a claim -> ``head`` just past it

    @classmethod
    def create(cls, size: int = RING_BYTES) -> SharedRing | None:
        """A ring, or None where memory files do not exist (not Linux) or cannot be made."""
        if not hasattr(os, "memfd_create"):
            return None
        try:
            return cls(size)
        except OSError as exc:
            logger.debug("no shared memory for the writer process (%s); values go through the pipe", exc)
            return None

    def close_fd(self) -> None:
        """Close the memory file here once the child has its own (the mapping stays)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def snapshot(self, array: np.ndarray) -> np.ndarray | None:
        """A copy of ``array``'s bytes (C order) in the ring, as a 1-d uint8 view of it; None for
        a value below MIN_PART_BYTES, or when the ring has no room (the caller copies it itself)."""
        nbytes = array.nbytes
        if nbytes < MIN_PART_BYTES or not self.enabled:
            return None
        start = self.head
        offset = start % self.size
        if offset + nbytes > self.size:  # not before the ring's end: from its start
            start += self.size - offset
            offset = 0
        end = start + -(-nbytes // ALIGN) * ALIGN
        if end - self.released > self.size:
            return None
        part = self._bytes[offset:offset + nbytes]
        np.copyto(part.view(array.dtype).reshape(array.shape), array, casting="no")
        self.head = end
        self._ends[offset] = end
        return part

    def owns(self, part: object) -> bool:
        """True for a part that :meth:`snapshot` returned (any numpy array in a file's parts)."""
        return type(part) is np.ndarray

    def locate(self, part: np.ndarray) -> tuple[int, int, int]:
        """Where a part from :meth:`snapshot` lies: offset in the ring, length, and the count
        of claimed bytes just past it (what the child gives back once it wrote the part). Once
        per part: a part is sent once."""
        offset = int(part.ctypes.data) - self._base
        return offset, int(part.nbytes), self._ends.pop(offset)

    def release(self, end: int) -> None:
        """The child wrote (or gave up) every part up to ``end`` (from :meth:`locate`): that
        memory may be claimed again. Called from the reports thread."""
        if end > self.released:
            self.released = end


__all__ = ["ALIGN", "MIN_PART_BYTES", "RING_BYTES", "SharedRing"]
