"""An in-memory object store registered as a storage scheme, for the TensorBoard export tests
(tests/writer/test_tensorboard_export.py) and the TensorBoard launch on an object store
(tests/tb_plugin/test_tb_plugin.py)."""

from __future__ import annotations

from mltrace.storage.base import Storage


class MemoryStorage(Storage):
    """An object store without appends (what S3 is to the writer)."""

    files: dict[str, bytes] = {}

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.prefix = uri.split("://", 1)[1].rstrip("/") + "/"

    def write(self, key: str, data: bytes) -> None:
        self.files[self.prefix + key] = data

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        data = self.files[self.prefix + key]
        return data[start:] if length is None else data[start:start + length]

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        base = self.prefix + (prefix.rstrip("/") + "/" if prefix else "")
        return sorted(k[len(self.prefix):] for k in self.files if k.startswith(base))

    def exists(self, key: str) -> bool:
        return self.prefix + key in self.files
