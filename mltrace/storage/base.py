"""The Storage interface: what the writer and the readers need from a place that holds a trial.

Keys are "/"-separated paths relative to the trial root (see mltrace.format.paths).
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Sequence


class Storage(ABC):
    """A trial's location: a local directory (local.py) or an S3 prefix (s3.py).

    What a storage can do beyond the methods is said by two properties, so that no caller has
    to guess it from the class or a URI: :attr:`is_local` and :attr:`writes_plain_files`.
    """

    #: the location as the user gave it (path or URI), for messages.
    uri: str

    @property
    def local_folder(self) -> str | None:
        """The folder of this machine that holds the keys as files (:meth:`local_path` names
        each), or None for a remote store."""
        return None

    @property
    def is_local(self) -> bool:
        """True if keys are files in a folder of this machine: readers then look for new files
        at once, and writers need no spill folder."""
        return self.local_folder is not None

    @property
    def writes_plain_files(self) -> bool:
        """True if another process may write this storage's files itself, as plain files
        replaced atomically (mltrace.storage.atomic_files): the trial writer's child process
        does so. A storage that changes how files are written is written through itself."""
        return False

    @abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key`` atomically: a reader sees the whole file or none of it."""

    @abstractmethod
    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        """Read ``length`` bytes from ``start`` (all of the rest when None).

        Raises:
            FileNotFoundError: no such key.
        """

    @abstractmethod
    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        """Keys under ``prefix`` (a folder), sorted, only those > ``start_after`` when given."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """True if ``key`` exists."""

    # builtins.list: inside this class, ``list`` is the method above.
    def read_many(self, requests: Sequence[tuple[str, int, int | None]]) -> builtins.list[bytes]:
        """Read several (key, start, length) ranges; remote storages fetch them in parallel."""
        return [self.read(key, start, length) for key, start, length in requests]

    def local_path(self, key: str) -> str | None:
        """A filesystem path for ``key`` when the storage :attr:`is_local`, else None."""
        return None

    def delete(self, key: str) -> None:
        """Remove ``key``; no error if it does not exist. The writer removes an index file of an
        earlier, crashed run before it replaces that step's events file (mltrace.writer).

        Raises:
            NotImplementedError: a storage that cannot delete (the writer then leaves the file).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot delete files")
