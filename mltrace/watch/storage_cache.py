"""One Storage per trial location for the watcher, and one boto3 client for all of S3.

``open_storage`` builds a boto3 session and client per call (about 0.4 s of botocore's model
loading each); a watcher looks at many trials every poll, so it opens each location once and
shares one S3 client between them (boto3 clients are thread-safe).
"""

from __future__ import annotations

from typing import Any

from mltrace.storage import Storage, open_storage


class StorageCache:
    """Storages by location, built once."""

    def __init__(self) -> None:
        self._storages: dict[str, Storage] = {}
        self._s3_client: Any = None

    def get(self, location: str) -> Storage:
        """The Storage of ``location`` (built on first use)."""
        storage = self._storages.get(location)
        if storage is not None:
            return storage
        if location.lower().startswith("s3://") and self._s3_client is not None:
            from mltrace.storage.s3 import S3Storage

            storage = S3Storage(location, client=self._s3_client)
        else:
            storage = open_storage(location)
            if location.lower().startswith("s3://"):
                self._s3_client = getattr(storage, "client", None)
        self._storages[location] = storage
        return storage

    def forget(self, location: str) -> None:
        """Drop ``location`` (a deleted trial)."""
        self._storages.pop(location, None)
