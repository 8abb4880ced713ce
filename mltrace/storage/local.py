"""Local directory storage: atomic writes by temp file + rename in the same directory
(mltrace.storage.atomic_files)."""

from __future__ import annotations

import builtins
import os
from collections.abc import Sequence

from mltrace.exceptions import MltraceValueError
from mltrace.storage.atomic_files import AtomicFiles
from mltrace.storage.base import Storage


class LocalStorage(Storage):
    """A trial in a local directory.

    Args:
        root: the directory (``~`` expanded); created on first write.
    """

    def __init__(self, root: str) -> None:
        self.uri = root
        self.root = os.path.abspath(os.path.expanduser(root))
        self.files = AtomicFiles()

    def _path(self, key: str) -> str:
        parts = key.split("/")
        if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise MltraceValueError(f"storage key {key!r} must be a relative path without '..'")
        return os.path.join(self.root, *parts)

    @property
    def local_folder(self) -> str:
        return self.root

    @property
    def writes_plain_files(self) -> bool:
        """True for LocalStorage itself; a subclass that writes or deletes its own way (a test's
        faulty disk, say) is written through its methods."""
        return type(self).write is LocalStorage.write and type(self).delete is LocalStorage.delete

    def local_path(self, key: str) -> str:
        return self._path(key)

    def write(self, key: str, data: bytes) -> None:
        self.files.write(self._path(key), data)

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
        self.files.delete(self._path(key))


def _all_before(folder: str, start_after: str) -> bool:
    """True if every key under ``folder`` (ending in "/") sorts at or before ``start_after``."""
    return folder < start_after and not start_after.startswith(folder)
