"""Files that could not be uploaded yet, kept on local disk in order until the store answers.

A spill folder holds ``destination.json`` (the trial's URI) and, per file, ``<seq>.bin`` with its
bytes and ``<seq>.key`` with its key. Files are uploaded in sequence order, so an events file
still reaches the store before its index file. ``mltrace upload-spill DIR`` uploads a folder
left behind by a run whose store never came back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading

from mltrace.storage.base import Storage

logger = logging.getLogger(__name__)


def default_spill_root() -> str:
    """MLTRACE_SPILL_DIR, else ~/.cache/mltrace/spill."""
    return os.environ.get("MLTRACE_SPILL_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "mltrace", "spill")


class SpillDir:
    """An ordered on-disk queue of (key, bytes) for one destination.

    Args:
        root: the folder that holds spill folders.
        uri: the destination (names the folder and is recorded in it).
        worker: keeps workers of one trial apart.
    """

    def __init__(self, root: str, uri: str, worker: str) -> None:
        digest = hashlib.sha1(uri.encode()).hexdigest()[:10]
        self.path = os.path.join(root, f"{digest}-{worker}")
        self.uri = uri
        self._lock = threading.Lock()
        self._drain_lock = threading.Lock()  # one uploader at a time
        self._seq = 0
        self._pending: list[int] = []
        if os.path.isdir(self.path):  # a previous run of this worker left files: keep their order
            self._pending = sorted(int(n[:-4]) for n in os.listdir(self.path) if n.endswith(".bin"))
            self._seq = (self._pending[-1] + 1) if self._pending else 0

    @property
    def pending(self) -> int:
        """Files waiting for upload."""
        return len(self._pending)

    def add(self, key: str, data: bytes) -> None:
        """Append one file (fsync-free; a crash loses at most what the OS had not written).

        Raises:
            OSError: the spill's disk refused it (full, say); nothing of the entry is left.
        """
        with self._lock:
            os.makedirs(self.path, exist_ok=True)
            destination = os.path.join(self.path, "destination.json")
            if self._seq == 0 or not os.path.exists(destination):
                _write_whole(destination, json.dumps({"uri": self.uri}).encode())
            seq = self._seq
            self._seq += 1
            base = os.path.join(self.path, f"{seq:012d}")
            try:
                with open(base + ".key", "w", encoding="utf-8") as f:
                    f.write(key)
                _write_whole(base + ".bin", data)  # .bin appears last: the entry is complete
            except OSError:
                _remove(base + ".key")
                raise
            self._pending.append(seq)

    def drain(self, storage: Storage) -> int:
        """Upload pending files in order until one fails; return how many were uploaded.

        Raises:
            Exception: whatever the storage raised for the first file that failed (it stays).
        """
        if not self._drain_lock.acquire(blocking=False):
            return 0
        try:
            return self._drain(storage)
        finally:
            self._drain_lock.release()

    def _drain(self, storage: Storage) -> int:
        done = 0
        while True:
            with self._lock:
                if not self._pending:
                    break
                seq = self._pending[0]
            base = os.path.join(self.path, f"{seq:012d}")
            with open(base + ".key", encoding="utf-8") as f:
                key = f.read()
            with open(base + ".bin", "rb") as f:
                data = f.read()
            storage.write(key, data)
            os.remove(base + ".bin")
            os.remove(base + ".key")
            with self._lock:
                self._pending.pop(0)
            done += 1
        if not self._pending:
            try:
                os.remove(os.path.join(self.path, "destination.json"))
                os.rmdir(self.path)
            except OSError:
                pass
        return done


def _write_whole(path: str, data: bytes) -> None:
    """Write ``path`` through a temp file and rename: it appears whole or not at all."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        _remove(tmp)
        raise


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def upload_spill(path: str) -> int:
    """Upload what a run left in spill folder ``path`` to the destination it records."""
    from mltrace.storage import open_storage

    with open(os.path.join(path, "destination.json")) as f:
        uri = json.load(f)["uri"]
    spill = SpillDir(os.path.dirname(path), uri, os.path.basename(path).split("-", 1)[1])
    spill.path = path
    return spill.drain(open_storage(uri))
