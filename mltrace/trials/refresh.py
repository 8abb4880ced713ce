"""Loading a trial's index files and deciding which steps are complete: the part of ``Trial``
that talks to storage to learn what was saved.

A refresh lists only index files it has not read (``start_after`` the last complete step),
reads them in batches, and records where each record lives in the trial's ``TrialIndex``. A
step is complete when every worker wrote it and every earlier step is complete, or once
training ended (``training_job_end.ts``, and every worker's done file in a distributed run).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
import zlib
from collections.abc import Iterable, Iterator

from mltrace.collections import CollectionManager
from mltrace.exceptions import IndexReaderException, MissingCollectionFiles, MltraceValueError
from mltrace.format import paths
from mltrace.format.index import decode_index
from mltrace.storage.base import Storage
from mltrace.storage.s3 import S3Storage
from mltrace.trials.index import TrialIndex

logger = logging.getLogger("mltrace.trials")  # the name users configure: the package's

#: How long create_trial waits for a first collections file (seconds); MLTRACE_TRIAL_WAIT overrides.
DEFAULT_CREATE_TIMEOUT = 10.0
POLL_INTERVAL = 0.5
#: Steps a live reader lets wait for a lagging worker (smdebug's INCOMPLETE_STEP_WAIT_WINDOW).
DEFAULT_INCOMPLETE_STEP_WINDOW = 1000
#: Index files read per batch (remote storages fetch a batch in parallel).
INDEX_BATCH = 256
#: New objects a paused collector may leave before its end moves them to the oldest generation.
SETTLE_AFTER = 100_000


def env_seconds(name: str, default: float) -> float:
    """Seconds from environment variable ``name``, or ``default`` when it is unset or empty.

    Raises:
        MltraceValueError: the variable is not a number.
    """
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise MltraceValueError(f"{name}={raw!r} must be a number of seconds") from None


def incomplete_step_window_from_env() -> int:
    """The incomplete-step window: MLTRACE_INCOMPLETE_STEP_WAIT_WINDOW, else smdebug's
    SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW, else 1000 (at least 2).

    Raises:
        MltraceValueError: the variable is not a whole number.
    """
    for name in ("MLTRACE_INCOMPLETE_STEP_WAIT_WINDOW", "SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW"):
        raw = os.environ.get(name)
        if raw:
            try:
                return max(2, int(raw))
            except ValueError:
                raise MltraceValueError(f"{name}={raw!r} must be a whole number of steps") from None
    return DEFAULT_INCOMPLETE_STEP_WINDOW


class TrialRefresh:
    """The state every part of ``Trial`` shares, and the methods that fill it from storage:
    the collections files, the index files, and which steps are complete.

    ``Trial.__init__`` sets the attributes declared here; the other parts of Trial (steps,
    names, records) read them and call ``maybe_refresh`` before answering.
    """

    path: str
    name: str
    storage: Storage
    range_steps: tuple[int | None, int | None] | None
    poll_interval: float
    num_workers: int
    loaded_all_steps: bool
    last_complete_step: int
    dynamic_refresh: bool
    skipped_files: list[str]
    incomplete_step_window: int
    refresh_interval: float
    _index: TrialIndex
    _read_keys: set[str]
    _rewritten: set[str]
    _token: str | None
    _workers: set[str]
    _last_refresh: float
    _collection_manager: CollectionManager
    _written_collections: frozenset[str]

    # -- the collections files -----------------------------------------------------------------
    def _collection_keys(self) -> list[str]:
        keys = self.storage.list(paths.COLLECTIONS_DIR)
        return [k for k in keys if paths.parse_collections_key(k)]

    def _load_collections(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        start = time.monotonic()
        keys = self._collection_keys()
        while not keys:
            if self.storage.exists(paths.END_OF_JOB_MARKER) or time.monotonic() >= deadline:
                raise MissingCollectionFiles(self.path, time.monotonic() - start,
                                             has_steps=bool(self.storage.list(paths.INDEX_DIR)))
            time.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))
            keys = self._collection_keys()
        first = keys[0]
        self._collection_manager = CollectionManager.from_json(
            self.storage.read(first), where=f"{self.storage.uri}/{first}"
        )
        self._written_collections = frozenset(self._collection_manager.collections)
        self.num_workers = max(1, self._collection_manager.num_workers)
        while len(keys) < self.num_workers and time.monotonic() < deadline:
            time.sleep(self.poll_interval)
            keys = self._collection_keys()
        if len(keys) < self.num_workers:
            logger.warning("trial %s expects %d workers but has collections files of %d so far",
                           self.path, self.num_workers, len(keys))
        self._workers = {w for k in keys if (w := paths.parse_collections_key(k))}

    # -- the index files -----------------------------------------------------------------------
    def refresh_data(self) -> None:
        """Read index files that appeared since the last refresh."""
        self._last_refresh = time.monotonic()
        ended = self.storage.exists(paths.END_OF_JOB_MARKER)
        if ended and self.num_workers > 1:
            done = self.storage.list(paths.WORKERS_DONE_DIR)
            ended = not done or len(done) >= self.num_workers  # smdebug trials have no done files
        start_after = self._token  # after the last complete step; or before a rewritten index
        if start_after is not None and self._rewritten:
            start_after = min(start_after, *(k[:-len(".json")] for k in self._rewritten))
        self._ingest(self.storage.list(paths.INDEX_DIR, start_after=start_after))
        if ended:
            self.loaded_all_steps = True
            if self._index.step_workers:
                self.last_complete_step = max(self._index.step_workers)

    def _new_index_keys(self, keys: Iterable[str]) -> list[tuple[str, int, str]]:
        """(key, global step, worker) of the index files in ``keys`` not read yet, in range."""
        todo: list[tuple[str, int, str]] = []
        for key in keys:
            if key in self._read_keys:
                continue
            parsed = paths.parse_index_key(key)
            if parsed is None:
                continue
            step, worker = parsed
            self._read_keys.add(key)
            self._rewritten.discard(key)
            if self.range_steps is not None:
                begin, end = self.range_steps
                if (begin is not None and step < begin) or (end is not None and step >= end):
                    continue
            todo.append((key, step, worker))
        return todo

    def _ingest(self, keys: Iterable[str]) -> None:
        todo = self._new_index_keys(keys)
        with collector_paused():
            self._ingest_keys(todo)
        self._advance_complete_steps()

    def _ingest_keys(self, todo: list[tuple[str, int, str]]) -> None:
        for start in range(0, len(todo), INDEX_BATCH):
            batch = todo[start:start + INDEX_BATCH]
            try:
                blobs: list[bytes | Exception] = list(
                    self.storage.read_many([(k, 0, None) for k, _, _ in batch]))
            except OSError:
                blobs = [self._read_or_error(k) for k, _, _ in batch]
            for (key, step, worker), blob in zip(batch, blobs):
                try:
                    if isinstance(blob, Exception):
                        raise blob
                    index = decode_index(blob, f"{self.storage.uri}/{key}")
                    checksum = zlib.crc32(blob)
                except (IndexReaderException, OSError) as exc:
                    logger.warning("skipping step %d of worker %s: %s", step, worker, exc)
                    self.skipped_files.append(key)
                    continue
                self._index.ingest(step, worker, index, checksum)
                self._workers.add(worker)

    def step_checksums(self, steps: Iterable[int]) -> dict[int, int]:
        """``{global step: checksum}`` of the index files of each of ``steps`` that the trial has
        (``TrialIndex.step_checksum``): the same checksum later means the step was not rewritten,
        so what was read from it then is still what it holds."""
        out = {}
        for step in steps:
            crc = self._index.step_checksum(step)
            if crc is not None:
                out[step] = crc
        return out

    def _read_or_error(self, key: str) -> bytes | Exception:
        try:
            return self.storage.read(key)
        except OSError as exc:
            return exc

    def maybe_refresh(self, name: str | None = None, force: bool = False) -> None:
        """Refresh unless training has ended (or refresh is switched off). Remote trials look
        at most every ``refresh_interval`` seconds unless forced (a miss forces a look)."""
        if self.loaded_all_steps or not (self.dynamic_refresh or force):
            return
        if not force and time.monotonic() - self._last_refresh < self.refresh_interval:
            return
        self.refresh_data()

    @property
    def last_index_token(self) -> str | None:
        """smdebug's ``last_index_token``: the index file of the last complete step (its last
        worker's), after which refreshes list new index files. As smdebug names it: a path under
        the trial directory for a local trial, the key in the bucket for S3 (the URI elsewhere);
        None until a step is complete. The step it names stays where it was when training
        ended, as smdebug's does (``last_complete_step`` then moves to the last step)."""
        if self._token is None:
            return None
        if self.storage.is_local:
            return os.path.join(os.path.expanduser(self.storage.uri), self._token)
        if isinstance(self.storage, S3Storage):
            return f"{self.storage.prefix}/{self._token}" if self.storage.prefix else self._token
        return f"{self.storage.uri}/{self._token}"

    # -- step completeness ---------------------------------------------------------------------
    def _advance_complete_steps(self) -> None:
        """smdebug's completeness: a step is complete when every worker wrote it, and so is every
        earlier one. A worker that stopped writing (crashed) would hold every later step back, so
        once more than ``incomplete_step_window`` steps wait (MLTRACE_INCOMPLETE_STEP_WAIT_WINDOW,
        or smdebug's SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW; 1000), all but the newest half of
        them count as complete, as smdebug does (it counts in step numbers, this in saved steps)."""
        waiting = sorted(s for s in self._index.step_workers if s > self.last_complete_step)
        complete = [s for s in waiting if len(self._index.step_workers[s]) >= self.num_workers]
        last = complete[-1] if complete else None
        window = self.incomplete_step_window
        behind = [s for s in waiting if last is None or s > last]
        if len(behind) > window:
            last = behind[len(behind) - window // 2 - 1]
            lagging = sorted(self._workers - self._index.step_workers[behind[0]])
            logger.warning("trial %s: %d steps wait for workers %s; counting steps up to %d as "
                           "complete (incomplete-step window %d)", self.path, len(behind),
                           lagging, last, window)
        if last is not None:
            self.last_complete_step = last
            last_worker = max(self._index.step_workers[last])
            self._token = paths.index_file_key(last, last_worker)

    def is_step_complete(self, step: int) -> bool:
        """True if global ``step`` is complete: every worker wrote it, training ended, or a
        later step is complete (smdebug's rule; see ``incomplete_step_window``)."""
        return (self.loaded_all_steps or step <= self.last_complete_step
                or len(self._index.step_workers.get(step, ())) >= self.num_workers)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (when it runs) while index files are ingested,
    or a view reads a million records of an open trial.

    An index holds millions of small objects (a location per record) and no cycle; each batch
    of new objects would start a collection that walks all of them again, half the time of
    opening a trial of 1M records. Reference counting frees everything as usual meanwhile.
    Nested or concurrent pauses leave the collector as the outermost found it.

    A pause that leaves many new objects behind (a trial's index) ends with a collection of
    the young generations, which moves the survivors straight to the oldest: left to itself,
    the collector would walk them once to the middle generation and again out of it (about
    0.4 s each for a 1M-record index). The oldest generation is not walked here."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
            if gc.get_count()[0] > SETTLE_AFTER:
                gc.collect(1)
