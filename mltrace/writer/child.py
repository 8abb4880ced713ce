"""The trial writer's process: writes the files of one local trial that a pipe brings it.

mltrace.writer.process starts this file as ``python -S child.py ROOT MAX_PENDING_BYTES``.
It uses the standard library only and loads its two mltrace helpers (``byte_queue.py`` and
``storage/atomic_files.py``) by their paths, so that it starts in milliseconds and never imports
what the training script imports (nor runs a ``sitecustomize``). This module also holds the pipe
protocol, which the parent side imports from here.

Frames on stdin, in order: ``HEADER`` (op, key length, data length), the key (a trial-relative
path, as os.fsencode gives it), then the data (OP_WRITE only). A file whose op has ``IN_GROUP``
set belongs with the file before it: when that one failed, it is skipped (a step's index file
never goes without its events file). OP_FLUSH's key is a token the child sends back once every
earlier file is written or failed.

Reports on stdout: ``REPORT`` (kind, payload length), then the payload. R_READY once the child
reads; R_FAILED with ``failure_payload``; R_FLUSHED with the token.

A reading thread moves frames from the pipe into a queue bounded in bytes, so the training
process hands a large step over as fast as the pipe takes it, and waits only when the child
holds MAX_PENDING_BYTES not yet written (a slow disk slows saving; memory stays bounded). End of
input (the parent closed the pipe, or died) means: write what came whole, then exit. So SIGINT,
SIGTERM and SIGHUP are ignored: Ctrl-C in a terminal, a scheduler stopping a job and a closed
terminal reach the whole process group, and the child must outlive the parent long enough to
write what it got (SIGKILL still ends it). SIGXFSZ is ignored too (a file-size limit is a failed
write, reported, not a killed writer), and SIGUSR1 means discard: drop what is not written yet
(the parent found its out_dir replaced).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import struct
import sys
import threading
from types import ModuleType
from typing import Any

HEADER = struct.Struct("<BxxxIQ")
OP_WRITE, OP_DELETE, OP_FLUSH = 1, 2, 3
IN_GROUP = 0x80
REPORT = struct.Struct("<BI")
R_READY, R_FAILED, R_FLUSHED = 1, 2, 3
#: Memory a queued frame costs beyond its data (the floor that bounds empty files too).
FRAME_COST = 256


def failure_payload(key: str, exc: BaseException) -> bytes:
    """A failed write as R_FAILED's payload: key, exception type, errno, message, file name."""
    number = getattr(exc, "errno", None)
    text = getattr(exc, "strerror", None) or str(exc)
    filename = getattr(exc, "filename", None)
    fields = (key, type(exc).__name__, "" if number is None else str(number), text,
              "" if filename is None else os.fsdecode(filename))
    return "\0".join(f.replace("\0", " ") for f in fields).encode("utf-8", "surrogateescape")


def parse_failure(payload: bytes) -> tuple[str, BaseException]:
    """The key and an exception equal in type and message to what failed in the child (an
    OSError with its errno, so that its message is the same; another kind as a RuntimeError
    naming it)."""
    key, kind, number, text, filename = payload.decode("utf-8", "surrogateescape").split("\0")
    if number:
        return key, OSError(int(number), text, *((filename,) if filename else ()))
    return key, RuntimeError(f"{kind}: {text}")


def _load(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _report(kind: int, payload: bytes = b"") -> None:
    try:
        os.write(1, REPORT.pack(kind, len(payload)) + payload)
    except BrokenPipeError:
        pass  # the parent is gone (killed): nobody to tell, the files still get written


def _read_exactly(stream: Any, size: int) -> bytes | None:
    data = stream.read(size) if size else b""
    return data if len(data) == size else None


def _read_frames(stream: Any, pending: Any, discarding: threading.Event) -> None:
    """The reading thread: frames into ``pending`` (None at the end of input; a frame cut off by
    it, from a parent that died mid-write, is dropped)."""
    try:
        while True:
            head = _read_exactly(stream, HEADER.size)
            if head is None:
                return
            op, key_length, data_length = HEADER.unpack(head)
            key = _read_exactly(stream, key_length)
            data = _read_exactly(stream, data_length) if (op & ~IN_GROUP) == OP_WRITE else b""
            if key is None or data is None:
                return
            if not discarding.is_set():
                pending.put((op, os.fsdecode(key), data), len(data) + FRAME_COST)
    finally:
        pending.put(None, 0)


def _write_all(root: str, files: Any, pending: Any, discarding: threading.Event) -> None:
    """The main loop: each frame in order, until the end of input."""
    group_failed = False
    while True:
        item, size = pending.get()
        try:
            if item is None:
                return
            op, key, data = item
            kind = op & ~IN_GROUP
            if kind == OP_FLUSH:
                _report(R_FLUSHED, key.encode())
                continue
            if discarding.is_set() or (op & IN_GROUP and group_failed):
                continue
            group_failed = False
            path = os.path.join(root, *key.split("/"))
            try:
                if kind == OP_WRITE:
                    files.write(path, data)
                else:
                    files.delete(path)
            except Exception as exc:  # reported to the parent, which logs and counts it
                group_failed = True
                _report(R_FAILED, failure_payload(key, exc))
        finally:
            pending.task_done(size)


def main(argv: list[str]) -> int:
    root, max_pending = argv[1], int(argv[2])
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    discarding = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: discarding.set())
    here = os.path.dirname(os.path.abspath(__file__))  # mltrace/writer/
    byte_queue = _load("mltrace_writer_byte_queue", os.path.join(here, "byte_queue.py"))
    atomic = _load("mltrace_writer_atomic_files",
                   os.path.join(os.path.dirname(here), "storage", "atomic_files.py"))
    pending = byte_queue.ByteQueue(max_pending)
    reader = threading.Thread(target=_read_frames, args=(sys.stdin.buffer, pending, discarding),
                              name="mltrace-writer-pipe", daemon=True)
    reader.start()
    _report(R_READY)
    _write_all(root, atomic.AtomicFiles(), pending, discarding)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
