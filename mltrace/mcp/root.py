"""The one place an MCP server may read: a local folder or an S3 prefix, and the trials below it.

An agent names a trial by its path relative to the root (as ``list_trials`` gives it), or by a
path or ``s3://`` URI inside the root. Every such argument is resolved here and refused when it
leaves the root (``..``, an absolute path elsewhere, a symbolic link that points out, another
bucket), so that ``--root`` bounds what the server can read. Trials are found as
``mltrace watch`` finds them (mltrace.watch.discovery), and kept open between calls: a live trial
refreshes itself, so a kept one sees the steps written since.
"""

from __future__ import annotations

import os
import posixpath
from collections import OrderedDict

from mltrace.exceptions import MltraceRuntimeError, MltraceValueError
from mltrace.format import paths
from mltrace.storage import is_remote
from mltrace.trials import Trial, create_trial
from mltrace.watch.discovery import FoundTrial, TrialFinder
from mltrace.watch.storage_cache import StorageCache

#: Folder levels below the root searched for trials.
MAX_DEPTH = 4
#: Trials kept open between calls (the least recently used is closed beyond it).
MAX_OPEN_TRIALS = 16


class TrialRoot:
    """The root a server reads, and the trials in it.

    Args:
        location: a local folder, or ``s3://bucket/prefix``.
        max_depth: folder levels below ``location`` searched for trials.

    Attributes:
        location: the root: an absolute local path with its links resolved, or the URI without
            a trailing "/".
        remote: True for a URI (S3), False for a local folder.

    Raises:
        MltraceValueError: a local ``location`` that is not a folder, or an S3 URI without bucket.
    """

    def __init__(self, location: str, max_depth: int = MAX_DEPTH) -> None:
        location = location.strip()
        if location.lower().startswith("file://"):
            location = location[len("file://"):]
        self.remote = is_remote(location)
        if self.remote:
            scheme, _, rest = location.partition("://")
            bucket, _, prefix = rest.partition("/")
            if not bucket:
                raise MltraceValueError(
                    f"--root {location!r} has no bucket: use s3://bucket/prefix")
            parts = _parts(prefix, location)
            self.location = f"{scheme.lower()}://{'/'.join([bucket, *parts])}"
        else:
            self.location = os.path.realpath(os.path.expanduser(location or "."))
            if not os.path.isdir(self.location):
                raise MltraceValueError(
                    f"--root {location!r} is not a folder: pass the folder that holds the trials "
                    "(a hook's out_dir or a folder above it), or s3://bucket/prefix")
        self.max_depth = max_depth
        self._storages = StorageCache()
        self._open: OrderedDict[str, Trial] = OrderedDict()

    def find(self) -> list[FoundTrial]:
        """The trials at or below the root now, sorted by relative path.

        Raises:
            MltraceRuntimeError: the root cannot be listed (an S3 bucket that does not exist,
                credentials that may not list it, an unreachable endpoint).
        """
        finder = TrialFinder(self.location, self.max_depth, self._storages)
        try:
            found = finder.scan()
        except (MltraceRuntimeError, OSError) as exc:
            raise MltraceRuntimeError(
                f"cannot list the trials under {self.location}: {exc}. Listing is not available "
                "there; where the credentials may read but not list, the other tools still read a "
                "trial named by its path relative to the root") from exc
        # the finder follows symbolic links; one that points out of the root is not served
        return [t for t in found if self.remote or _inside(t.location, self.location)]

    def relative(self, location: str) -> str:
        """The path of ``location`` relative to the root, ``.`` for the root itself."""
        if location == self.location:
            return "."
        if self.remote:
            return location[len(self.location) + 1:]
        return os.path.relpath(location, self.location).replace(os.sep, "/")

    def resolve(self, trial: str) -> str:
        """The location of the trial argument ``trial``, checked to be inside the root.

        Raises:
            MltraceValueError: ``trial`` is empty, leaves the root, or is a URI of another kind.
        """
        if not isinstance(trial, str) or not trial.strip():
            raise MltraceValueError(
                f"trial {trial!r} is empty: pass a trial's path relative to the root, as "
                "list_trials gives it ('.' for the root itself)")
        trial = trial.strip()
        return self._resolve_remote(trial) if self.remote else self._resolve_local(trial)

    def _resolve_local(self, trial: str) -> str:
        if trial.lower().startswith("file://"):
            trial = trial[len("file://"):]
        if is_remote(trial):
            raise MltraceValueError(
                f"trial {trial!r} is a URI, but the root is the local folder {self.location}: "
                "pass a path relative to it, as list_trials gives it")
        path = os.path.realpath(os.path.join(self.location, trial))
        if not _inside(path, self.location):
            raise _outside(trial, self.location)
        return path

    def _resolve_remote(self, trial: str) -> str:
        if "://" in trial:
            scheme, _, rest = trial.partition("://")
            uri = f"{scheme.lower()}://{rest}"
            if uri != self.location and not uri.startswith(self.location + "/"):
                raise _outside(trial, self.location)
            trial = uri[len(self.location):]
        elif trial.startswith("/"):
            raise MltraceValueError(
                f"trial {trial!r} is an absolute local path, but the root is {self.location}: "
                "pass a path relative to the root, or an s3:// URI under it")
        parts = _parts(trial, trial)
        return "/".join([self.location, *parts])

    def open(self, trial: str) -> tuple[str, Trial]:
        """(path relative to the root, opened Trial) of the trial argument ``trial``.

        Raises:
            MltraceValueError: ``trial`` leaves the root, or holds no trial.
        """
        location = self.resolve(trial)
        found = self._open.get(location)
        if found is not None:
            self._open.move_to_end(location)
            return self.relative(location), found
        storage = self._storages.get(location)
        if not storage.list(paths.COLLECTIONS_DIR):
            raise MltraceValueError(
                f"no trial at {trial!r} (under the root {self.location}): it holds no "
                f"{paths.COLLECTIONS_DIR}/*_collections.json; call list_trials for the trials "
                "under the root")
        opened = create_trial(location, timeout=0)
        self._open[location] = opened
        while len(self._open) > MAX_OPEN_TRIALS:
            self._open.popitem(last=False)
        return self.relative(location), opened


def _parts(path: str, given: str) -> list[str]:
    """The "/"-separated parts of a relative ``path``; MltraceValueError if one is ``..``."""
    parts = [p for p in posixpath.normpath("/" + path).split("/") if p]
    if ".." in path.replace("\\", "/").split("/"):
        raise MltraceValueError(
            f"{given!r} contains '..': pass a path inside the root, relative to it, as "
            "list_trials gives it")
    return parts


def _inside(path: str, root: str) -> bool:
    """True if the local ``path``, its links resolved, is ``root`` or below it."""
    return os.path.commonpath([os.path.realpath(path), root]) == root


def _outside(trial: str, root: str) -> MltraceValueError:
    return MltraceValueError(
        f"trial {trial!r} is outside the root {root}: the server reads only below its --root; "
        "pass a path relative to the root, as list_trials gives it")
