"""Finding trials below a watched location as they appear, without walking into them.

A trial is a folder (or S3 prefix) that holds ``collections/000000000/<worker>_collections.json``,
the first file a hook writes. A scan lists folder by folder (on S3: ``list_objects_v2`` with a
``/`` delimiter) down to ``max_depth`` levels, never inside a known trial, so a poll over a
bucket of finished trials costs one listing per folder level, not one per file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

from mltrace.exceptions import MltraceRuntimeError
from mltrace.format import flight_record, paths
from mltrace.storage import is_remote
from mltrace.watch.storage_cache import StorageCache

logger = logging.getLogger(__name__)

MAX_DEPTH = 4
#: folders that belong to a trial or to mltrace, never trials themselves
_SKIP = frozenset({"events", "index", "collections", "tensorboard", paths.RULE_RESULTS_DIR,
                   paths.WATCH_STATE_DIR, paths.WORKERS_DONE_DIR, flight_record.RECORD_DIR})


@dataclass(frozen=True)
class FoundTrial:
    """A trial found below the watched location."""

    #: the path below the watched location ("" for the location itself), "/"-separated
    relative: str
    #: what create_trial opens
    location: str


class TrialFinder:
    """Lists the trials at or below ``location`` (a local folder or ``s3://bucket/prefix``).

    Args:
        location: the watched location.
        max_depth: folder levels below ``location`` to look at.
    """

    def __init__(self, location: str, max_depth: int = MAX_DEPTH,
                 storages: StorageCache | None = None) -> None:
        self.location = location.rstrip("/") or location
        self.storages = storages or StorageCache()
        self.max_depth = max_depth
        self._remote = is_remote(location)
        self._known: dict[str, FoundTrial] = {}

    def scan(self) -> list[FoundTrial]:
        """Every trial there now, those found before included, sorted by path.

        Raises:
            MltraceRuntimeError, OSError: the location cannot be listed (S3 down, no bucket).
        """
        for rel in self._walk():
            if rel not in self._known:
                loc = self._join(rel)
                self._known[rel] = FoundTrial(rel, loc)
        return sorted(self._known.values(), key=lambda t: t.relative)

    def forget(self, relative: str) -> None:
        """Drop a trial that was deleted (a later scan finds it again if it comes back)."""
        self._known.pop(relative, None)

    def exists(self, trial: FoundTrial) -> bool:
        """True while the trial's collections file is there."""
        return bool(self.storages.get(trial.location).list(paths.COLLECTIONS_DIR))

    def _join(self, rel: str) -> str:
        if not rel:
            return self.location
        return f"{self.location}/{rel}" if self._remote else os.path.join(self.location, rel)

    def _walk(self) -> Iterator[str]:
        stack = [("", 0)]
        while stack:
            rel, depth = stack.pop()
            if rel in self._known:
                continue
            children, is_trial = self._children(rel)
            if is_trial:
                yield rel
                continue
            if depth >= self.max_depth:
                continue
            for child in children:
                if child in _SKIP or child.startswith("."):
                    continue
                stack.append((f"{rel}/{child}" if rel else child, depth + 1))

    def _children(self, rel: str) -> tuple[list[str], bool]:
        """(sub-folder names of ``rel``, whether ``rel`` is a trial)."""
        if self._remote:
            return self._remote_children(rel)
        folder = self._join(rel)
        try:
            entries = [e.name for e in os.scandir(folder) if e.is_dir()]
        except FileNotFoundError:
            return [], False
        coll = os.path.join(folder, *paths.COLLECTIONS_DIR.split("/"))
        try:
            is_trial = any(n.endswith("_collections.json") for n in os.listdir(coll))
        except OSError:
            is_trial = False
        return sorted(entries), is_trial

    def _remote_children(self, rel: str) -> tuple[list[str], bool]:
        storage = self.storages.get(self._join(rel))
        client = getattr(storage, "client", None)
        bucket, prefix = getattr(storage, "bucket", None), getattr(storage, "prefix", None)
        if client is None or bucket is None or prefix is None:  # a storage plugin: list all
            keys = storage.list("")
            is_trial = any(k.startswith(paths.COLLECTIONS_DIR + "/") for k in keys)
            return sorted({k.split("/", 1)[0] for k in keys if "/" in k}), is_trial
        base = f"{prefix}/" if prefix else ""
        children: list[str] = []
        try:
            for page in client.get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=base, Delimiter="/"):
                children += [p["Prefix"][len(base):].rstrip("/")
                             for p in page.get("CommonPrefixes", [])]
        except Exception as exc:  # botocore's errors: name the place and the likely fix
            raise MltraceRuntimeError(
                f"cannot list s3://{bucket}/{base}: {type(exc).__name__}: {exc}; check "
                "AWS_ENDPOINT_URL, the credentials and that the bucket exists") from exc
        is_trial = "collections" in children and bool(storage.list(paths.COLLECTIONS_DIR))
        return sorted(children), is_trial
