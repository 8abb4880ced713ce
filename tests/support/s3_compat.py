"""Work around a listing bug of the SeaweedFS release that tests run against (4.48), so that real
smdebug's S3 reader can be tested on it unchanged.

SeaweedFS answers ListObjectsV2 with no keys when ``StartAfter`` equals a ``Prefix`` that has no
trailing slash (``Prefix="run/index", StartAfter="run/index"``); S3 returns every key under the
prefix. smdebug 1.0.34's S3 index reader sends exactly that on its first listing, so without
this it sees no steps. SeaweedFS fixed markers that sort before the prefix in
https://github.com/seaweedfs/seaweedfs/pull/11322 (after 4.48). ``tests/legacy/
test_smdebug_reads_mltrace_s3.py`` checks that the bug is still there, so the shim goes when the
server is upgraded. mltrace's own S3 reader never sends such a request.
"""

from __future__ import annotations

from typing import Any


def _drop_start_after_equal_to_prefix(params: dict[str, Any], **_: Any) -> None:
    # Same answer on S3: every key under the prefix sorts after the prefix itself (only an object
    # named exactly like the prefix would differ, and a trial has none).
    if params.get("StartAfter") and params.get("StartAfter") == params.get("Prefix"):
        del params["StartAfter"]


def install(session: Any = None) -> None:
    """Rewrite such requests of every S3 client created afterwards from ``session`` (default:
    boto3's default session, which ``boto3.client(...)`` uses; smdebug creates its clients so)."""
    import boto3

    if session is None:
        session = boto3._get_default_session()
    session.events.register("before-parameter-build.s3.ListObjectsV2",
                            _drop_start_after_equal_to_prefix,
                            unique_id="mltrace-seaweedfs-start-after")


def uninstall(session: Any = None) -> None:
    """Undo install() (clients created before keep it)."""
    import boto3

    if session is None:
        session = boto3._get_default_session()
    session.events.unregister("before-parameter-build.s3.ListObjectsV2",
                              unique_id="mltrace-seaweedfs-start-after")
