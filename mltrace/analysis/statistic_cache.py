"""What the overview and its neighbours keep of a trial's statistics between requests: per
(trial, tensor, statistic, worker), the values of the complete steps read so far
(:class:`StepValues`), in a bounded cache (:class:`StatisticCache`) that a trial's entries are
restored into from the cache folder on first use and saved to once read
(:mod:`mltrace.analysis.stored`): a trial is decoded once per machine, whichever viewer reads
it next.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mltrace.analysis import stored
from mltrace.analysis.cache import LruCache
from mltrace.analysis.series import Damaged

if TYPE_CHECKING:
    from mltrace.trials import Trial

#: Seconds between two saves of a live trial's statistics (an ended trial's are saved at once).
SAVE_EVERY_S = 60.0

logger = logging.getLogger("mltrace.analysis")


@dataclass
class StepValues:
    """One statistic of one tensor at its saved global steps (ascending, parallel arrays)."""

    steps: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    values: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.float64))
    #: What the trial's index looked like when every step was last read (a later look with the
    #: same signature has nothing new to read).
    signature: tuple[int, bool, int] | None = None
    #: The stride of the coarsest-first pass (COARSE_FIRST) this entry has read in full.
    stride_read: int | None = None
    #: Steps whose records could not be read (tried again when the index changes).
    damaged: list[Damaged] = field(default_factory=list)

    def extend(self, steps: Sequence[int] | np.ndarray,
               values: Sequence[float] | np.ndarray) -> None:
        """Add the steps (any order) not held yet and keep the arrays sorted by step. A step
        held already keeps its value: two readers of one entry (two requests, or a restore
        from the cache folder and a read) may bring the same complete step, which never
        changes."""
        if not len(steps):
            return
        new_steps = np.asarray(steps, dtype=np.int64)
        new_values = np.asarray(values, dtype=np.float64)
        if len(self.steps):
            fresh = ~np.isin(new_steps, self.steps)
            new_steps, new_values = new_steps[fresh], new_values[fresh]
        s = np.concatenate([self.steps, new_steps])
        v = np.concatenate([self.values, new_values])
        order = np.argsort(s, kind="stable")
        self.steps, self.values = s[order], v[order]


def index_signature(trial: Trial, present: set[int]) -> tuple[int, bool, int]:
    """What the trial's index looks like for a tensor whose global steps are ``present``
    (:attr:`StepValues.signature`): an entry read in full under the same signature has nothing
    new to read."""
    return (len(present), trial.loaded_all_steps, trial.last_complete_step)


class StatisticCache(LruCache[StepValues]):
    """Statistics of steps already read, per (trial, tensor, statistic, worker); the least
    recently used entries are dropped beyond ``max_entries``. Complete steps never change.
    ``get(key)`` returns the key's StepValues (a new empty one when unknown).

    With a cache folder (``root``; by default :func:`stored.cache_root`, None for none), a
    trial's entries are restored from it on first use (``restore``) and saved to it once read
    (``persist``): a trial is decoded once per machine, whichever viewer reads it next.
    """

    def __init__(self, max_entries: int = 4096, root: Path | None | bool = True) -> None:
        super().__init__(StepValues, max_entries)
        self.root: Path | None = stored.cache_root() if root is True else root or None
        self._restored: set[str] = set()
        self._unsaved: set[str] = set()
        self._saved_at: dict[str, float] = {}
        self._disk_lock = threading.Lock()

    def restore(self, trial: Trial) -> int:
        """Fill the entries of ``trial`` from the cache folder, once per trial: the values of
        each step whose index files are unchanged since they were saved. Returns how many
        entries were restored."""
        if self.root is None or trial.path in self._restored:
            return 0
        with self._disk_lock:  # a second reader of the trial waits here until it is restored
            if trial.path in self._restored:
                return 0
            try:
                return self._restore(trial, self.root)
            finally:
                self._restored.add(trial.path)

    def _restore(self, trial: Trial, root: Path) -> int:
        found, valid = stored.stored_for(trial, root)
        if found is None:
            return 0
        names = set(trial.tensor_names())
        restored = 0
        for key, (steps, values) in found.entries.items():
            if key[1] not in names:
                continue
            keep = np.isin(steps, valid)
            entry = self.get(key)
            held = len(entry.steps)
            entry.extend(steps[keep], values[keep])
            if not held:
                _mark_covered(trial, key[1], entry)
            restored += 1
        return restored

    def note_read(self, trial: Trial) -> None:
        """Values of ``trial`` were read that the cache folder does not hold yet."""
        self._unsaved.add(trial.path)

    def persist(self, trial: Trial) -> bool:
        """Save ``trial``'s entries to the cache folder when values were read since the last
        save (a live trial's at most every SAVE_EVERY_S seconds). True when saved. A folder
        that cannot be written is reported once and the cache stays in memory."""
        path = trial.path
        if self.root is None or path not in self._unsaved:
            return False
        last = self._saved_at.get(path)
        if not trial.loaded_all_steps and last is not None and (
                time.monotonic() - last < SAVE_EVERY_S):
            return False
        with self._disk_lock:
            entries = {k: (e.steps, e.values) for k, e in self.items()
                       if isinstance(k, tuple) and k[0] == path and len(e.steps)}
            read_steps = np.unique(np.concatenate([s for s, _ in entries.values()]
                                                  or [np.empty(0, np.int64)]))
            checksums = trial.step_checksums(read_steps.tolist())
            self._unsaved.discard(path)
            self._saved_at[path] = time.monotonic()
            try:
                where = stored.location(trial)
                stored.write(stored.trial_file(self.root, where),
                             stored.Stored(where, entries, checksums))
            except (OSError, ValueError) as exc:  # a full disk, a folder we may not write
                logger.warning("cannot save overview statistics under %s (%s); set %s to a "
                               "writable folder, or to 'off'", self.root, exc,
                               stored.CACHE_DIR_ENV)
                self.root = None
                return False
            return True


def _mark_covered(trial: Trial, tensor: str, entry: StepValues) -> None:
    """Mark a restored ``entry`` as read in full when it holds every complete step ``tensor``
    has now (later looks then read nothing until the index changes)."""
    present = trial.index_entries(tensor).global_steps()
    complete = np.fromiter(present if trial.loaded_all_steps else
                           (s for s in present if trial.is_step_complete(s)), dtype=np.int64)
    if len(complete) == len(entry.steps) and np.isin(complete, entry.steps).all():
        entry.signature = index_signature(trial, present)
        entry.stride_read = 1


__all__ = ["SAVE_EVERY_S", "StatisticCache", "StepValues", "index_signature"]
