"""A child process that writes a local trial's files, so that training never shares the
interpreter's lock with the writing.

Why a process and not a thread of the training process: every
syscall of such a thread (a step's events and index files take about ten: folders, opens, writes,
renames) lets go of the interpreter's lock, which the thread then has to win back from the
training thread; on the benchmark MLP saving every step, a thread costs training about 0.4 ms
a step, twice the syscalls' own time. Here the training thread hands a step over with one ``writev`` into
a pipe, and a process of its own (mltrace/writer/child.py, standard library only) writes the
files, in order, each atomically. Failures come back over a second pipe and are recorded in the
trial writer's failure log by a thread that sleeps in ``select`` otherwise.

Used for local trials (LocalStorage itself, not subclasses that change how files are written) on
POSIX; ``MLTRACE_WRITER=thread`` keeps the thread. The trial writer (mltrace.writer) writes the
files itself until the child says it is ready, so nothing waits on a child that is slow to start
or never starts (then the thread takes over). A child that dies later (killed) is a recorded
failure, and the thread goes on with the files it never got. If the training process is killed,
the child still writes every file it received whole, then exits.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from mltrace.storage.base import Storage
from mltrace.writer import child as protocol

logger = logging.getLogger(__name__)

CHILD_PROGRAM = protocol.__file__
#: The environment variable that chooses the writer: "process" (the default where it works) or
#: "thread".
WRITER_ENV = "MLTRACE_WRITER"
#: What the pipe to the child may hold (Linux raises a pipe's 64 KiB up to this on request).
PIPE_BYTES = 1 << 20
_IOV_MAX = 512  # parts per writev, below every system's IOV_MAX
#: A batch of files goes to the child once it holds this many bytes, or this many groups (steps),
#: or once its first file waited BATCH_SECONDS (see _Channel).
BATCH_BYTES = 256 << 10
BATCH_GROUPS = 8
BATCH_SECONDS = 0.05
#: Bytes a batch may keep waiting for room in the pipe while the training thread goes on (the
#: reports thread sends them as the child reads); beyond them the training thread waits.
PUSH_BYTES = 8 << 20

#: Files as (key, data): None deletes the file; a list of bytes is one file's data in parts.
Files = Sequence[tuple[str, "bytes | list[bytes] | None"]]


class WriterProcessGone(Exception):
    """The child no longer takes files (it died, or this is a forked copy of its parent)."""


class _Channel:
    """The pipes to and from one child: the batch of files not yet sent, and what the child
    said. Shared by the training thread (``add``) and the reports thread (``serve``), which must
    not hold the WriterProcess (an unclosed writer would then never be collected).

    Files that come quickly one after the other are sent in batches: waking the child costs the
    sending thread tens of microseconds on a VM, more than a small step's files take to encode.
    A group goes at once when nothing was sent for BATCH_SECONDS (a training that saves every
    100th step never waits); otherwise it joins the batch, which goes when it holds BATCH_BYTES
    or BATCH_GROUPS groups, when its oldest file waited BATCH_SECONDS (checked at each ``add``
    and, for a training that stopped saving, by the reports thread), and at every flush and
    close. So a file reaches the disk (or a failure the log) at most BATCH_SECONDS later than
    it would from a thread.

    A batch of BATCH_BYTES or more (a save step of a big model) is copied into the pipe by the
    reports thread, woken through a second pipe, as the child reads, and so is the rest of one
    the pipe had no room for: the training thread neither copies it nor waits for the child to
    read it. It waits only once PUSH_BYTES are unsent, and at every flush and close.
    """

    def __init__(self, fd: int, on_failure: Callable[[str, BaseException], None]) -> None:
        self.fd = fd
        os.set_blocking(fd, False)  # a full pipe answers EAGAIN: see send
        self.on_failure = on_failure
        self.changed = threading.Condition()  # guards ready, ended, flushed
        self.ready = False
        self.ended = False
        self.flushed = 0
        self.sending = threading.Lock()  # guards the batch, and keeps the pipe's order
        self.parts: list[bytes | memoryview] = []
        self.groups: list[Files] = []
        self.size = 0
        self.since = 0.0  # when the batch's first group came
        self.last_sent = 0.0  # when the last batch went
        #: True while the reports thread sends the rest of a batch the pipe had no room for
        self.pushing = False
        self.wake_r, self.wake_w = os.pipe()  # wakes the reports thread to push
        os.set_blocking(self.wake_w, False)

    def add(self, files: Files, parts: list[bytes | memoryview], size: int, soon: bool) -> None:
        now = time.monotonic()
        with self.sending:
            if not self.groups:
                self.since = now
            self.parts += parts
            self.groups.append(files)
            self.size += size
            if self.ended:
                raise WriterProcessGone
            if self.size >= PUSH_BYTES:
                self.send(block=True)
            elif self.pushing:  # the reports thread sends these after what it holds
                return
            elif self.size >= BATCH_BYTES:  # copying it into the pipe is the reports thread's
                self.push_later()
            elif (soon or now - self.last_sent >= BATCH_SECONDS or len(self.groups) >= BATCH_GROUPS
                    or now - self.since >= BATCH_SECONDS):
                if not self.send(block=False):
                    self.push_later()

    def push_later(self) -> None:
        """Have the reports thread send the rest of the batch (the caller holds ``sending``)."""
        self.pushing = True
        if self.wake_w < 0:  # the reports thread ended: flush and close send the rest
            return
        try:
            os.write(self.wake_w, b"\0")
        except OSError:  # full: the reports thread is woken already
            pass

    def send(self, block: bool) -> bool:
        """Write the batch into the pipe (the caller holds ``sending``). With ``block``, waits
        while the pipe is full; without, leaves the rest in the batch. True if all went.

        Raises:
            WriterProcessGone: the child's end is closed; the batch stays, for take_unsent.
        """
        parts = self.parts
        try:
            while parts:
                try:
                    written = os.writev(self.fd, parts[:_IOV_MAX])
                except BlockingIOError:
                    if not block:
                        self.parts = parts
                        return False
                    select.select([], [self.fd], [])
                    continue
                done = 0
                while done < len(parts) and written >= len(parts[done]):
                    written -= len(parts[done])
                    done += 1
                parts = parts[done:]
                if written:
                    parts[0] = memoryview(parts[0])[written:]
        except OSError as exc:  # EPIPE: the child is gone
            self.parts = parts
            with self.changed:
                self.ended = True
                self.changed.notify_all()
            raise WriterProcessGone from exc
        self.clear()
        self.last_sent = time.monotonic()
        return True

    def clear(self) -> list[Files]:
        """Empty the batch (sent, or given up) and return its groups (the caller holds
        ``sending``, or is a forked copy where no other thread runs)."""
        groups = self.groups
        self.parts, self.groups, self.size = [], [], 0
        self.pushing = False
        return groups

    def send_if_waiting(self) -> None:
        """From the reports thread: send a batch whose first file waited BATCH_SECONDS (for a
        training that stopped saving), or what is left of one being pushed; never waits for the
        pipe or for the training thread."""
        if not self.groups or not self.sending.acquire(blocking=False):
            return
        try:
            if self.groups and (self.pushing or time.monotonic() - self.since >= BATCH_SECONDS):
                if not self.send(block=False):
                    self.pushing = True
        finally:
            self.sending.release()

    def hand_over(self) -> None:
        """Send the batch now, without waiting for the pipe: what does not fit goes with the
        reports thread as the child reads (the training thread never waits here)."""
        if not self.groups:
            return
        with self.sending:
            if self.groups and not self.pushing and not self.send(block=False):
                self.push_later()

    def take_unsent(self) -> list[Files]:
        """Once the child is gone: the groups it never got."""
        with self.sending:
            return self.clear()

    def serve(self, proc: subprocess.Popen[bytes]) -> None:
        """The reports thread: reads the child's reports until its end of the pipe closes, and
        sends a batch that waited too long; then reaps the child."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        try:
            while True:
                readable, writable, _ = select.select(
                    [fd, self.wake_r], [self.fd] if self.pushing else [], [], BATCH_SECONDS)
                if self.wake_r in readable:
                    os.read(self.wake_r, 4096)
                if writable or not readable or self.wake_r in readable:
                    self.send_if_waiting()
                if fd not in readable:
                    continue
                head = _read_exactly(fd, protocol.REPORT.size)
                if head is None:
                    return
                kind, length = protocol.REPORT.unpack(head)
                payload = _read_exactly(fd, length)
                if payload is None:
                    return
                if kind == protocol.R_FAILED:
                    self.on_failure(*protocol.parse_failure(payload))
                    continue
                with self.changed:
                    if kind == protocol.R_READY:
                        self.ready = True
                    elif kind == protocol.R_FLUSHED:
                        self.flushed = int(payload)
                    self.changed.notify_all()
        except WriterProcessGone:
            pass
        except Exception as exc:  # never take the training process down
            logger.debug("reading the writer process's reports failed: %s", exc)
        finally:
            with self.changed:
                self.ended = True
                self.changed.notify_all()
            proc.wait()
            proc.stdout.close()
            with self.sending:  # push_later writes to wake_w while holding it
                self.close_wake()

    def close_wake(self) -> None:
        """Close the wake pipe (the reports thread ended, or in a forked copy); its numbers are
        forgotten, so that a later push_later cannot write into a file that reused them."""
        wakes, self.wake_r, self.wake_w = (self.wake_r, self.wake_w), -1, -1
        for wake in wakes:
            if wake >= 0:
                try:
                    os.close(wake)
                except OSError:
                    pass


def _read_exactly(fd: int, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class WriterProcess:
    """The child process writing one local trial (see the module docstring).

    Args:
        root: the trial's folder.
        max_pending_bytes: bytes the child may hold not yet written before ``send`` waits.
        on_failure: called (from the reports thread) with the key and the error of each file the
            child could not write.
    """

    def __init__(self, root: str, max_pending_bytes: int,
                 on_failure: Callable[[str, BaseException], None]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", CHILD_PROGRAM, root, str(max_pending_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._fd = self._proc.stdin.fileno()
        _grow_pipe(self._fd)
        self._owner = os.getpid()
        self._tokens = 0
        self._channel = _Channel(self._fd, on_failure)
        self._reader = threading.Thread(target=self._channel.serve, args=(self._proc,),
                                        name="mltrace-writer-reports", daemon=True)
        self._reader.start()
        # An unclosed writer (a script that never closes its hook) still lets its child finish.
        self._finalizer = weakref.finalize(self, _close_quietly, self._proc.stdin)
        _LIVE.add(self)

    @classmethod
    def start(cls, storage: Storage, max_pending_bytes: int,
              on_failure: Callable[[str, BaseException], None]) -> WriterProcess | None:
        """A writer process for ``storage``, or None where the thread writes instead (another
        storage, not POSIX, MLTRACE_WRITER=thread, or the process could not be started)."""
        choice = os.environ.get(WRITER_ENV, "process").strip().lower()
        if choice not in ("process", "thread"):
            logger.warning("%s=%r is not a writer: use 'process' or 'thread'; writing with a process",
                           WRITER_ENV, choice)
        root = storage.local_folder
        if (choice == "thread" or os.name != "posix" or not sys.executable
                or not storage.writes_plain_files or root is None):
            return None
        try:
            return cls(root, max_pending_bytes, on_failure)
        except OSError as exc:
            logger.debug("could not start a writer process (%s); writing with a thread", exc)
            return None

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def gone(self) -> bool:
        """The child takes no more files (it exited, or this is a forked copy of its parent)."""
        return self._channel.ended or os.getpid() != self._owner

    def send(self, files: Files, soon: bool = False) -> None:
        """Hand ``files`` (key, data; None data deletes) to the child, as one group: a file is
        skipped if the one before it failed. They go with the next batch, or at once with
        ``soon``. Waits only while the child holds its bound.

        Raises:
            WriterProcessGone: the child takes no more files (``take_unsent`` then has these).
        """
        parts: list[bytes | memoryview] = []
        size = 0
        for i, (key, data) in enumerate(files):
            op = protocol.OP_WRITE if data is not None else protocol.OP_DELETE
            name = os.fsencode(key)
            chunks = [] if data is None else data if isinstance(data, list) else [data]
            length = sum(len(chunk) for chunk in chunks)
            parts += (protocol.HEADER.pack(op | (protocol.IN_GROUP if i else 0), len(name), length), name)
            parts += chunks
            size += length + protocol.FRAME_COST
        self._channel.add(files, parts, size, soon)

    def flush(self) -> None:
        """Wait until the child wrote (or failed) every file sent before this call."""
        if self.gone:
            return
        self._tokens += 1
        token = str(self._tokens).encode()
        channel = self._channel
        with channel.sending:
            channel.parts += (protocol.HEADER.pack(protocol.OP_FLUSH, len(token), 0), token)
            try:
                channel.send(block=True)
            except WriterProcessGone:
                return
        with channel.changed:
            channel.changed.wait_for(lambda: channel.flushed >= self._tokens or channel.ended)

    def hand_over(self) -> None:
        """Send the files waiting in a batch now (see TrialWriter.hand_over)."""
        if not self.gone:
            try:
                self._channel.hand_over()
            except WriterProcessGone:
                pass  # the next send finds the child gone and the thread takes over

    @property
    def waiting(self) -> int:
        """Groups of files (steps) waiting in a batch, not yet handed to the child."""
        return len(self._channel.groups)

    def take_unsent(self) -> list[Files]:
        """Once the child is gone: the groups it never got, to be written another way."""
        return self._channel.take_unsent()

    @property
    def started(self) -> bool:
        """The child said it was ready (then a death loses what it held, not yet written)."""
        return self._channel.ready

    def close(self, discard: bool = False, wait: bool = False) -> int | None:
        """Let the child write what it holds (``discard``: drop what it has not started) and
        exit. With ``wait``, wait for that and return its exit status; without, return at once
        (the reports thread reaps the child): after a ``flush``, everything is written already.
        None from a forked copy of the parent."""
        _LIVE.discard(self)
        if os.getpid() != self._owner:
            return None
        if discard:
            try:
                self._proc.send_signal(signal.SIGUSR1)  # the child's discard (POSIX only, as it)
            except OSError:
                pass
        else:
            with self._channel.sending:
                try:
                    self._channel.send(block=True)
                except WriterProcessGone:
                    pass
        self._finalizer()
        if not wait:
            return None
        status = self._proc.wait()
        self._reader.join()
        return status

    def forget_after_fork(self) -> None:
        """In a forked child: the pipes and the batch belong to the parent's writer (which sends
        the batch); close our copies."""
        self._channel.ended = True
        self._channel.clear()  # not under ``sending``: a lock held at the fork stays held here
        self._channel.close_wake()
        self._finalizer.detach()
        for stream in (self._proc.stdin, self._proc.stdout):
            _close_quietly(stream)


def _close_quietly(stream: object) -> None:
    try:
        stream.close()  # type: ignore[attr-defined]
    except (OSError, AttributeError):
        pass


def _grow_pipe(fd: int) -> None:
    """Let the pipe hold PIPE_BYTES (Linux; elsewhere, or above the system's limit, it keeps
    its size and ``send`` waits for the child a little more often)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (ImportError, OSError):
        pass


_LIVE: weakref.WeakSet[WriterProcess] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for writer in list(_LIVE):
        writer.forget_after_fork()
    _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["WRITER_ENV", "WriterProcess", "WriterProcessGone"]
