"""What a storage can do is said by its properties (``is_local``, ``local_folder``,
``writes_plain_files``) and ``is_remote(location)``, never guessed by the callers: the trial
writer's child process writes only plain local folders, a faulty test disk (a LocalStorage that
writes its own way) is written through its methods."""

from __future__ import annotations

import pytest

from mltrace.storage import LocalStorage, is_remote, open_storage
from mltrace.storage.s3 import S3Storage
from mltrace.writer.process import WriterProcess


class _OwnWrites(LocalStorage):
    def write(self, key: str, data: bytes) -> None:
        super().write(key, data)


@pytest.mark.parametrize("location, remote", [
    ("/tmp/run", False), ("relative/run", False), ("file:///tmp/run", False), ("FILE:///tmp/x", False),
    ("s3://bucket/run", True), ("gs://bucket/run", True)])
def test_is_remote_tells_uris_of_remote_stores_from_local_paths(location, remote):
    assert is_remote(location) is remote


def test_a_local_folder_is_local_and_written_as_plain_files(tmp_path):
    storage = open_storage(str(tmp_path / "run"))
    assert storage.is_local and storage.local_folder == str(tmp_path / "run")
    assert storage.writes_plain_files
    own = _OwnWrites(str(tmp_path / "own"))
    assert own.is_local and not own.writes_plain_files
    assert WriterProcess.start(own, 1 << 20, lambda key, exc: None) is None  # written through it
    process = WriterProcess.start(storage, 1 << 20, lambda key, exc: None)
    assert process is not None
    process.close()


def test_s3_is_neither_local_nor_plain_files():
    storage = S3Storage("s3://bucket/prefix")
    assert not storage.is_local and storage.local_folder is None and not storage.writes_plain_files
    assert storage.local_path("x") is None
