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

logger = logging.getLogger("mltrace.hook")


class OutDirGuard:
    """The identity of a local out_dir, taken when the hook starts writing.

    Args:
        path: the out_dir's local path, or None for a remote store (nothing to check there).
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._identity: tuple[int, int] | None = None
        self._fd: int | None = None

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
