"""Local directory storage: atomic writes by temp file + rename in the same directory."""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Sequence

from mltrace.exceptions import MltraceValueError
from mltrace.storage.base import Storage

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_PID = os.getpid()  # in temp file names; asked once, not per file


def _refresh_pid() -> None:
    global _PID
    _PID = os.getpid()


if hasattr(os, "register_at_fork"):  # a forked child writes temp files under its own pid
    os.register_at_fork(after_in_child=_refresh_pid)


class LocalStorage(Storage):
    """A trial in a local directory.

    Args:
        root: the directory (``~`` expanded); created on first write.
    """

    def __init__(self, root: str) -> None:
        self.uri = root
        self.root = os.path.abspath(os.path.expanduser(root))
        # Folders known to exist. Bounded (forgotten all at once when full, which costs one more
        # makedirs per folder): every step has a folder of its own (events/<step>/), so
        # remembering them all would grow memory by one path per step.
        self._made_dirs: set[str] = set()

    def _path(self, key: str) -> str:
        parts = key.split("/")
        if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise MltraceValueError(f"storage key {key!r} must be a relative path without '..'")
        return os.path.join(self.root, *parts)

    def local_path(self, key: str) -> str:
        return self._path(key)

    def write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        folder = os.path.dirname(path)
        if folder not in self._made_dirs:
            os.makedirs(folder, exist_ok=True)
            if len(self._made_dirs) >= _MADE_DIRS_KEPT:
                self._made_dirs.clear()
            self._made_dirs.add(folder)
        # The temp file sits beside the target so that rename is atomic; readers skip dot files
        # and *.tmp. Its name is unique per process and thread (one writer per file at a time).
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{_PID}.{threading.get_ident()}.tmp")
        try:
            # os.open/os.write, not open(): three syscalls fewer a file (no fstat, ioctl, lseek
            # of a buffered file object). Each syscall lets go of the interpreter's lock, which
            # the writer's thread must then win back from the training thread.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o666)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        with open(self._path(key), "rb") as f:
            # Never past the end nor more than the file holds: read(n) allocates n bytes up front,
            # and a damaged index may give an offset or length of 2**60 (the record check then
            # reports the short read).
            size = os.fstat(f.fileno()).st_size
            if start >= size:
                return b""
            if start:
                f.seek(start)
            return f.read() if length is None else f.read(max(0, min(length, size - start)))

    def read_many(self, requests: Sequence[tuple[str, int, int | None]]) -> builtins.list[bytes]:
        """Read several (key, start, length) ranges, each file opened once: a reader's batch
        often holds many records of one events file (every tensor of a step), and opening the
        file is most of a small read's cost. Clamped as ``read``."""
        out: builtins.list[bytes] = [b""] * len(requests)
        by_key: dict[str, list[int]] = {}
        for i, (key, _, _) in enumerate(requests):
            by_key.setdefault(key, []).append(i)
        for key, positions in by_key.items():
            with open(self._path(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                for i in positions:
                    _, start, length = requests[i]
                    if start >= size:
                        continue
                    f.seek(start)
                    out[i] = f.read() if length is None else f.read(max(0, min(length, size - start)))
        return out

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        keys: list[str] = []
        if not os.path.isdir(base):
            return keys
        for dirpath, dirnames, filenames in os.walk(base):
            rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            rel = "" if rel == "." else rel + "/"
            if start_after:
                # A folder whose keys all sort before start_after is skipped whole (old index/
                # folders), which keeps incremental listing cheap on long runs.
                dirnames[:] = [d for d in dirnames if not _all_before(rel + d + "/", start_after)]
            for name in filenames:
                if name.startswith(".") or name.endswith(".tmp"):
                    continue
                key = rel + name
                if start_after is None or key > start_after:
                    keys.append(key)
        keys.sort()
        return keys

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def delete(self, key: str) -> None:
        try:
            os.remove(self._path(key))
        except FileNotFoundError:
            pass


_MADE_DIRS_KEPT = 64


def _all_before(folder: str, start_after: str) -> bool:
    """True if every key under ``folder`` (ending in "/") sorts at or before ``start_after``."""
    return folder < start_after and not start_after.startswith(folder)
