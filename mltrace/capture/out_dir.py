"""Which folder a hook writes into: a local out_dir is the folder the hook created or found when
it began writing, not whatever later sits at that path.

A hook left open (a notebook that never called ``close()``, a script that builds a second hook
after ``del_hook()``) still writes its last step, its collections file and the end marker when
it closes, at the latest at interpreter exit. If someone deleted the out_dir and created it again
for another run in between, those files would land in the other run's trial: a
``training_job_end.ts`` that declares it finished, a collections file that replaces its own. So
the hook remembers the folder's identity (device and inode) when it starts writing, and stops
writing, with a warning, once the path names another folder or none. It keeps the folder open
meanwhile: file systems reuse a deleted folder's inode number at once (a folder made again at
once often gets the same one), but not while a descriptor holds it.
"""

from __future__ import annotations

import logging
import os

from mltrace.exceptions import MltraceRuntimeError, MltraceValueError
from mltrace.format import paths
from mltrace.storage import open_storage
from mltrace.storage.base import Storage

logger = logging.getLogger("mltrace.capture.hook")


def open_out_dir(out_dir: str, tensorboard_dir: str | None, dry_run: bool) -> Storage:
    """The trial's storage, after checking that every location the hook writes to has a storage
    back-end and that ``out_dir`` can take a new trial (see check_out_dir; not in a dry run).

    Raises:
        MltraceValueError: a location no back-end handles, or an out_dir that cannot be written.
        MltraceRuntimeError: out_dir holds a finished trial.
    """
    if tensorboard_dir:
        open_storage(tensorboard_dir)  # a location no backend handles fails here, clearly
    storage = open_storage(out_dir)
    if not dry_run:
        check_out_dir(out_dir, storage)
    return storage


def check_out_dir(out_dir: str, storage: Storage) -> None:
    """Fail at construction when ``out_dir`` cannot take a new trial: it holds a finished one,
    or (local) it cannot be created or written (see check_local_out_dir).

    Raises:
        MltraceRuntimeError: a finished run is there.
        MltraceValueError: a local out_dir that is a file, or not writable.
    """
    check_local_out_dir(out_dir, storage.local_path(paths.END_OF_JOB_MARKER))
    if storage.exists(paths.END_OF_JOB_MARKER):
        raise MltraceRuntimeError(
            f"out_dir {out_dir!r} holds a finished run ({paths.END_OF_JOB_MARKER} exists): use "
            "a new out_dir, or delete that one to overwrite it")


def check_local_out_dir(out_dir: str, marker_path: str | None) -> None:
    """Fail at construction, not at the first write, when a local out_dir cannot hold a trial:
    it (or the nearest existing folder above it) is a file, or this process may not write there.
    ``marker_path`` is a file's path inside out_dir (None for remote storage: not checked)."""
    if marker_path is None:
        return
    root = probe = os.path.dirname(marker_path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        where = "is a file" if probe == root else f"is inside {probe!r}, which is a file"
        raise MltraceValueError(f"out_dir {out_dir!r} {where}: pass the path of a directory (new or existing)")
    effective = os.access in os.supports_effective_ids
    if not os.access(probe, os.W_OK | os.X_OK, effective_ids=effective):
        raise MltraceValueError(
            f"out_dir {out_dir!r} cannot be written: this process (uid {os.geteuid()}) may not create "
            f"files in {probe!r}; pass a directory you can write to, or fix its permissions"
        )


class OutDirGuard:
    """The identity of a local out_dir, taken when the hook starts writing.

    Args:
        path: the out_dir's local path, or None for a remote store (nothing to check there).
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._identity: tuple[int, int] | None = None
        self._fd: int | None = None

    @classmethod
    def of(cls, storage: Storage, dry_run: bool) -> OutDirGuard:
        """The guard of ``storage``'s local folder (none to check for a remote store or a dry run)."""
        marker = None if dry_run else storage.local_path(paths.END_OF_JOB_MARKER)
        return cls(os.path.dirname(marker) if marker else None)

    def claim(self) -> None:
        """Create the folder if needed and remember which folder it is (until ``release``)."""
        if self.path is None:
            return
        os.makedirs(self.path, exist_ok=True)
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            found = os.fstat(self._fd)
        except OSError:  # a platform that cannot open folders: the inode alone
            self._fd = None
            found = os.stat(self.path)
        self._identity = (found.st_dev, found.st_ino)

    def replaced(self) -> bool:
        """True if the path no longer names the folder claimed (deleted, or deleted and made
        again); False before the claim and for remote stores."""
        if self._identity is None or self.path is None:
            return False
        try:
            found = os.stat(self.path)
        except OSError:
            return True
        return (found.st_dev, found.st_ino) != self._identity

    def release(self) -> None:
        """The hook is done writing: let the folder go."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        # A hook dropped without close() (its atexit entry holds only a weak reference) must not
        # keep a descriptor open for the rest of the process.
        self.release()


__all__ = ["OutDirGuard"]
