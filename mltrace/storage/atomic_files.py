"""Files written whole or not at all: a temp file beside the target, then a rename.

Standard library only: the trial writer's process (mltrace.writer.process) loads this file by
its path, without importing the mltrace package, so that it starts in milliseconds.
"""

from __future__ import annotations

import os
import threading

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_PID = os.getpid()  # in temp file names; asked once, not per file
#: Folders remembered as existing before the memory is cleared (one makedirs more per folder).
MADE_DIRS_KEPT = 64


def _refresh_pid() -> None:
    global _PID
    _PID = os.getpid()


if hasattr(os, "register_at_fork"):  # a forked child writes temp files under its own pid
    os.register_at_fork(after_in_child=_refresh_pid)


class AtomicFiles:
    """Writes and deletes files so that a reader sees each one whole or not at all."""

    def __init__(self) -> None:
        # Folders known to exist. Bounded (forgotten all at once when full): every step has a
        # folder of its own (events/<step>/), so remembering them all would grow memory by one
        # path per step.
        self.made_dirs: set[str] = set()

    def write(self, path: str, data: bytes | memoryview) -> None:
        """Write ``data`` to ``path``, creating its folder; a failure leaves no file behind."""
        folder = os.path.dirname(path)
        if folder not in self.made_dirs:
            os.makedirs(folder, exist_ok=True)
            if len(self.made_dirs) >= MADE_DIRS_KEPT:
                self.made_dirs.clear()
            self.made_dirs.add(folder)
        # The temp file sits beside the target so that rename is atomic; readers skip dot files
        # and *.tmp. Its name is unique per process and thread (one writer per file at a time).
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{_PID}.{threading.get_ident()}.tmp")
        try:
            # os.open/os.write, not open(): three syscalls fewer a file (no fstat, ioctl, lseek
            # of a buffered file object).
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

    @staticmethod
    def delete(path: str) -> None:
        """Remove ``path``; a file that is not there is not an error."""
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
