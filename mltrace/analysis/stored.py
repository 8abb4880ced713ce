"""The overview's statistics kept on disk, so that a trial is decoded once per machine, not once
per viewer: a fresh TensorBoard on a trial looked at before reads its heat maps (the overview,
the difference view, the non-finite check) from one file instead of decoding a million records
again.

A trial's file lives in the cache folder (``MLTRACE_CACHE_DIR``; else
``$XDG_CACHE_HOME/mltrace``, else ``~/.cache/mltrace``; ``off`` turns the cache off), under
``statistics/``, named by a hash of the trial's location: nothing is written into the trial,
which may be read-only, on S3, or still training (the folder keeps at most MAX_BYTES, the files
used longest ago deleted first). It holds, per (tensor, statistic, worker), the
steps and values a :class:`~mltrace.analysis.statistic_cache.StatisticCache` read, and for each step the
checksum of the step's index files (``Trial.step_checksums``) when it was read. A step whose index
files changed since (a job restarted into the same folder rewrites its steps) is not restored:
its values are read again. A damaged or foreign file is set aside with a warning and rebuilt.

Example:
    >>> cache_root({"MLTRACE_CACHE_DIR": "off"}) is None
    True
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from mltrace.trials import Trial

logger = logging.getLogger("mltrace.analysis")

#: The environment variable that moves the cache folder, or turns it off (``off``).
CACHE_DIR_ENV = "MLTRACE_CACHE_DIR"
#: The values that turn the cache off.
OFF = frozenset({"off", "0", "false", "no", "none"})
#: Bumped when the file's layout changes: files of another format are rebuilt.
FORMAT = 1
#: The most the statistics folder holds; beyond it the files used longest ago are deleted.
MAX_BYTES = 2 << 30
#: Keys of the statistic cache: (trial path, tensor, statistic, worker).
Key = tuple[str, str, str, "str | None"]


def cache_root(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The cache folder (not created here), or None when ``MLTRACE_CACHE_DIR`` turns it off."""
    raw = environ.get(CACHE_DIR_ENV, "").strip()
    if raw.lower() in OFF:
        return None
    if raw:
        return Path(raw).expanduser()
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mltrace"


def location(trial: Trial) -> str:
    """What names ``trial`` in the cache: its URI, a local folder as an absolute path (the
    same trial opened as ``run`` and as ``/home/me/run`` is one file; two folders named ``run``
    are two)."""
    if trial.storage.is_local:
        return os.path.abspath(os.path.expanduser(trial.path))
    return trial.path


def trial_file(root: Path, trial_location: str) -> Path:
    """The file that holds the statistics of the trial at ``trial_location`` (:func:`location`)."""
    digest = hashlib.sha256(trial_location.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    return root / "statistics" / f"{digest}.npz"


@dataclass
class Stored:
    """One trial's stored statistics: ``entries[key] = (steps, values)``, and the checksum of
    each step's index files when its values were read (``checksums[step]``); ``trial`` is its
    :func:`location`."""

    trial: str
    entries: dict[Key, tuple[np.ndarray, np.ndarray]]
    checksums: dict[int, int]

    def valid_steps(self, current: Mapping[int, int]) -> np.ndarray:
        """The stored steps whose index files are unchanged (``current``: the trial's
        checksums now), ascending."""
        same = np.fromiter((s for s, crc in self.checksums.items() if current.get(s) == crc),
                           dtype=np.int64)
        same.sort()
        return same


def write(path: Path, stored: Stored) -> None:
    """Write ``stored`` to ``path`` at once (a temporary file renamed over it, so a reader never
    sees half a file). Step arrays shared by several entries are written once."""
    keys = list(stored.entries)
    step_sets: dict[bytes, int] = {}
    step_arrays: list[np.ndarray] = []
    which = []
    for key in keys:
        steps = np.ascontiguousarray(stored.entries[key][0], dtype=np.int64)
        found = step_sets.setdefault(steps.tobytes(), len(step_arrays))
        if found == len(step_arrays):
            step_arrays.append(steps)
        which.append(found)
    values = [np.asarray(stored.entries[k][1], dtype=np.float64) for k in keys]
    meta = {"format": FORMAT, "trial": stored.trial, "keys": [list(k[1:]) for k in keys]}
    checked = np.fromiter(stored.checksums, dtype=np.int64, count=len(stored.checksums))
    arrays = {
        "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
        "step_sets": _concat(step_arrays, np.int64),
        "step_offsets": _offsets(step_arrays),
        "entry_steps": np.asarray(which, dtype=np.int64),
        "values": _concat(values, np.float64),
        "value_offsets": _offsets(values),
        "checked_steps": checked,
        "checksums": np.asarray([stored.checksums[s] for s in checked.tolist()], dtype=np.int64),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy 2 stubs: **kwds as allow_pickle
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    prune(path.parent, MAX_BYTES, keep=path)


def prune(folder: Path, max_bytes: int, keep: Path | None = None) -> list[Path]:
    """Delete the files of ``folder`` used longest ago (a read or a write sets a file's time)
    until the rest hold at most ``max_bytes``; never ``keep``, the one just written. Returns
    what was deleted (a file another process deleted first is skipped)."""
    found = []
    for entry in os.scandir(folder):
        if entry.is_file() and not entry.name.startswith("."):
            try:
                stat = entry.stat()
            except OSError:
                continue
            found.append((stat.st_mtime, stat.st_size, Path(entry.path)))
    total = sum(size for _, size, _ in found)
    deleted = []
    for _, size, file in sorted(found):
        if total <= max_bytes:
            break
        if keep is not None and file == keep:
            continue
        try:
            file.unlink()
        except OSError:
            continue
        total -= size
        deleted.append(file)
    return deleted


def read(path: Path, trial_location: str, trial_path: str | None = None) -> Stored | None:
    """The statistics stored at ``path`` for the trial at ``trial_location``, their keys under
    ``trial_path`` (how the reader names the trial; default: the location); None when there is
    no such file. A file that cannot be read, of another format or of another trial is moved
    aside (``.bad``) with a warning, so that the next save starts afresh."""
    try:
        with np.load(path, allow_pickle=False) as f:
            _touch(path)
            meta = json.loads(f["meta"].tobytes())
            if meta.get("format") != FORMAT or meta.get("trial") != trial_location:
                raise ValueError(f"it holds format {meta.get('format')!r} of trial "
                                 f"{meta.get('trial')!r}, not format {FORMAT} of "
                                 f"{trial_location!r}")
            return _parse(meta, {name: f[name] for name in f.files}, trial_location,
                          trial_path or trial_location)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, IndexError, TypeError, zipfile.BadZipFile) as exc:
        logger.warning("ignoring the statistics cache file %s (%s: %s); it is rebuilt from the "
                       "trial", path, type(exc).__name__, exc)
        try:
            os.replace(path, path.with_suffix(".bad"))
        except OSError:
            pass
        return None


def _touch(path: Path) -> None:
    """Mark ``path`` used now (the last file a prune deletes); a folder that is read-only
    for this user keeps its times."""
    try:
        os.utime(path)
    except OSError:
        pass


def _parse(meta: dict[str, Any], arrays: dict[str, np.ndarray], trial_location: str,
           trial_path: str) -> Stored:
    step_sets = _split(arrays["step_sets"], arrays["step_offsets"])
    values = _split(arrays["values"], arrays["value_offsets"])
    which = arrays["entry_steps"].tolist()
    keys = meta["keys"]
    if not len(keys) == len(values) == len(which):
        raise ValueError(f"{len(keys)} keys for {len(values)} value arrays")
    entries: dict[Key, tuple[np.ndarray, np.ndarray]] = {}
    for (tensor, statistic, worker), k, v in zip(keys, which, values):
        steps = step_sets[k]
        if len(steps) != len(v):
            raise ValueError(f"{tensor!r} {statistic}: {len(steps)} steps for {len(v)} values")
        entries[(trial_path, str(tensor), str(statistic), worker)] = (steps, v)
    checksums = dict(zip(arrays["checked_steps"].tolist(), arrays["checksums"].tolist()))
    return Stored(trial_location, entries, checksums)


def _concat(arrays: Iterable[np.ndarray], dtype: type) -> np.ndarray:
    parts = list(arrays)
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


def _offsets(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int64)


def _split(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    bounds = offsets.tolist()
    if not bounds or bounds[0] != 0 or bounds[-1] != len(flat) or bounds != sorted(bounds):
        raise ValueError("offsets do not cover the array")
    return [flat[a:b] for a, b in zip(bounds, bounds[1:])]


def stored_for(trial: Trial, root: Path) -> tuple[Stored | None, np.ndarray]:
    """What ``root`` holds for ``trial``, and the steps of it still valid (index unchanged)."""
    where = location(trial)
    stored = read(trial_file(root, where), where, trial.path)
    if stored is None:
        return None, np.empty(0, dtype=np.int64)
    return stored, stored.valid_steps(trial.step_checksums(stored.checksums))


__all__ = ["CACHE_DIR_ENV", "MAX_BYTES", "Stored", "cache_root", "location", "prune", "read",
           "stored_for", "trial_file", "write"]
