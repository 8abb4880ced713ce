"""Trial, smdebug's analysis API over a trial directory (``create_trial`` opens one).

Index-driven: a refresh lists only index files it has not read (``start_after`` the last complete
step), reads them, and records where each record lives; a value is then one ranged read of one
record, checked against the CRC the index stores. A trial opened during training sees new steps
as they land and learns that training ended from ``training_job_end.ts``.
"""

from __future__ import annotations

import bisect
import difflib
import inspect
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Any, NoReturn

import numpy as np

from mltrace.collections import Collection, CollectionManager
from mltrace.exceptions import (
    CorruptRecordError,
    IndexReaderException,
    MissingCollectionFiles,
    MltraceTypeError,
    MltraceValueError,
    NoMoreData,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from mltrace.format import flight_record, paths
from mltrace.format.crc32c import crc32c
from mltrace.format.events import WireError, decode_event, decode_tensor_payload
from mltrace.format.flight_record import FirstNonFinite, FlightRecord
from mltrace.format.index import decode_index
from mltrace.format.records import unframe_record
from mltrace.modes import ModeKeys, mode_from
from mltrace.storage import LocalStorage, open_storage
from mltrace.storage.s3 import S3Storage

# Location and TensorEntries are part of the reader API (index_entries returns them).
from mltrace.trials.index import Location as Location
from mltrace.trials.index import TensorEntries as TensorEntries
from mltrace.trials.index import TrialIndex
from mltrace.trials.tensor import Tensor

logger = logging.getLogger("mltrace.trials")  # the name users configure: the package's

#: How long create_trial waits for a first collections file (seconds); MLTRACE_TRIAL_WAIT overrides.
DEFAULT_CREATE_TIMEOUT = 10.0
#: How long wait_for_steps waits by default (seconds); MLTRACE_STEP_WAIT overrides.
DEFAULT_STEP_TIMEOUT = 3600.0
POLL_INTERVAL = 0.5
#: Steps a live reader lets wait for a lagging worker (smdebug's INCOMPLETE_STEP_WAIT_WINDOW).
DEFAULT_INCOMPLETE_STEP_WINDOW = 1000


class StepState(Enum):
    """Whether a step can be read: smdebug's three answers."""

    UNAVAILABLE = 0
    AVAILABLE = 1
    NOT_YET_AVAILABLE = 2


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise MltraceValueError(f"{name}={raw!r} must be a number of seconds") from None


def _incomplete_step_window() -> int:
    for name in ("MLTRACE_INCOMPLETE_STEP_WAIT_WINDOW", "SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW"):
        raw = os.environ.get(name)
        if raw:
            try:
                return max(2, int(raw))
            except ValueError:
                raise MltraceValueError(f"{name}={raw!r} must be a whole number of steps") from None
    return DEFAULT_INCOMPLETE_STEP_WINDOW


class Trial:
    """A training run's saved tensors.

    Args:
        path: the hook's out_dir (local path or a URI of an installed storage backend).
        name: a display name (default: the last path component).
        range_steps: (begin, end) global steps to load, end exclusive; None loads all.
        timeout: seconds to wait for the first collections file before raising
            MissingCollectionFiles (default 10, or MLTRACE_TRIAL_WAIT).
        poll_interval: seconds between polls while waiting.
        check: smdebug's argument, accepted so that smdebug calls run; no effect (every record is
            checked against the CRC its index entry stores).
        index_mode: smdebug's argument (its only supported mode); no effect.
        cache: smdebug's argument; no effect (values are read when asked for).
        parallel: smdebug's argument; no effect (remote stores fetch batches in parallel).

    Raises:
        MltraceTypeError: an unknown keyword argument (the message lists the valid ones).
        MissingCollectionFiles: no collections file appeared within ``timeout``.

    Beside smdebug's API, the reader API that Tensor, the rules and the plugins build on:
    ``index_entries``, ``tensor_count``, ``saved_steps``, ``is_step_complete``,
    ``to_global_step``, ``to_mode_steps``, ``read_tensor``, ``read_tensors``, ``reload_step``,
    ``raise_for_missing_step`` and ``step_wall_time``.
    """

    def __init__(
        self,
        path: str,
        name: str | None = None,
        range_steps: tuple[int | None, int | None] | None = None,
        timeout: float | None = None,
        poll_interval: float = POLL_INTERVAL,
        *,
        check: bool = False,
        index_mode: bool = True,
        cache: bool = False,
        parallel: bool = True,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise unknown_keywords("Trial", unknown, trial_keywords())
        self.path = path.strip()
        self.name = name or os.path.basename(self.path.rstrip("/")) or self.path
        self.storage = open_storage(self.path)
        self.range_steps = range_steps
        self.poll_interval = poll_interval
        self._index = TrialIndex()
        self._read_keys: set[str] = set()
        self._rewritten: set[str] = set()  # index files being rewritten, see reload_step
        self._token: str | None = None
        self.loaded_all_steps = False
        self.last_complete_step = -1
        self.dynamic_refresh = True
        self.skipped_files: list[str] = []
        self._workers: set[str] = set()
        self._last_refresh = 0.0
        #: saved steps a live reader waits for a lagging worker before counting them complete
        self.incomplete_step_window = _incomplete_step_window()
        #: seconds between automatic refreshes: none locally, 1 s on remote stores
        self.refresh_interval = 0.0 if self.storage.local_path(paths.END_OF_JOB_MARKER) else 1.0
        if timeout is None:
            timeout = _env_seconds("MLTRACE_TRIAL_WAIT", DEFAULT_CREATE_TIMEOUT)
        self._load_collections(timeout)
        self.refresh_data()

    # -- loading --------------------------------------------------------------------------------
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
        for start in range(0, len(todo), 256):  # remote storages fetch a batch in parallel
            batch = todo[start:start + 256]
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
                except (IndexReaderException, OSError) as exc:
                    logger.warning("skipping step %d of worker %s: %s", step, worker, exc)
                    self.skipped_files.append(key)
                    continue
                self._index.ingest(step, worker, index)
                self._workers.add(worker)
        self._advance_complete_steps()

    def _read_or_error(self, key: str) -> bytes | Exception:
        try:
            return self.storage.read(key)
        except OSError as exc:
            return exc

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
        if isinstance(self.storage, LocalStorage):
            return os.path.join(os.path.expanduser(self.storage.uri), self._token)
        if isinstance(self.storage, S3Storage):
            return f"{self.storage.prefix}/{self._token}" if self.storage.prefix else self._token
        return f"{self.storage.uri}/{self._token}"

    # -- collections --------------------------------------------------------------------------
    def collections(self) -> dict[str, Collection]:
        """The collections of the trial (from the first worker's collections file)."""
        return self._collection_manager.get_collections()

    def collection(self, name: str) -> Collection:
        """One collection by name. A name the trial's collections file does not hold gives a new,
        empty collection that lives in this Trial object only (smdebug does the same), so that an
        analysis can group tensors itself and query by it::

            trial.collection("mine").include("^fc1")
            trial.collection("mine").add_tensor_name("loss")
            trial.tensor_names(collection="mine")

        Raises:
            MltraceTypeError: ``name`` is not a string.
        """
        if not isinstance(name, str):
            raise MltraceTypeError(
                f"collection name {name!r} must be a string, e.g. trial.collection('weights')")
        if name not in self._collection_manager.collections:
            logger.debug("trial %s: new analysis-side collection %r", self.name, name)
        return self._collection_manager.get(name, create=True)

    def _collection_arg(self, collection: str | Collection) -> Collection:
        """``tensor_names(collection=...)``: a Collection object, or a name (see collection)."""
        if isinstance(collection, Collection):
            return collection
        if not isinstance(collection, str):
            raise MltraceTypeError(
                f"tensor_names(collection={collection!r}): pass a collection name or a Collection")
        return self.collection(collection)

    def _warn_empty_collection(self, coll: Collection) -> None:
        """A query by collection found nothing. A misspelt name creates an empty collection (as
        in smdebug), so warn when the name is close to one the training wrote, and when an
        analysis-side collection the user filled matches nothing (smdebug warned then too);
        otherwise (common in rules and views) debug only."""
        written = sorted(self._written_collections)
        close = [] if coll.name in self._written_collections else difflib.get_close_matches(
            coll.name, written, n=1)
        if close:
            logger.warning("no tensor of trial %s is in collection %r, which the training did "
                           "not write (did you mean %r?)", self.name, coll.name, close[0])
        elif coll.name not in self._written_collections and (coll.include_regex
                                                             or coll.tensor_names):
            logger.warning("no tensor of trial %s is in collection %r (include_regex %s, "
                           "tensor_names %s)", self.name, coll.name, coll.include_regex,
                           sorted(coll.tensor_names))
        else:
            logger.debug("no tensor of collection %r in trial %s", coll.name, self.name)

    def tensors_in_collection(self, coll: str | Collection) -> list[Tensor]:
        """Tensor objects of the tensors that belong to a collection."""
        return [self.tensor(n) for n in self.tensor_names(collection=coll)]

    # -- tensors ------------------------------------------------------------------------------
    def tensor_names(
        self, show_prefixed_tensors: bool = False, *, step: int | None = None,
        mode: ModeKeys | str = ModeKeys.GLOBAL, regex: str | list[str] | None = None,
        collection: str | Collection | None = None,
    ) -> list[str]:
        """Sorted tensor names, optionally those saved at ``step`` (of ``mode``), matching
        ``regex`` (re.search, any of a list) or belonging to ``collection`` (not both)."""
        if regex is not None and collection is not None:
            raise MltraceValueError(
                f"tensor_names(regex={regex!r}, collection={collection!r}): pass one of them, "
                "not both (as smdebug)")
        self.maybe_refresh()
        mode = mode_from(mode)
        tensors = self._index.tensors
        names = set(tensors)
        if step is not None:
            g = self._index.to_global(step, mode)
            names = {n for n in names if g is not None and g in tensors[n].global_steps()}
        elif mode is not ModeKeys.GLOBAL:  # names saved in that mode (smdebug)
            steps = set(self._index.mode_to_global.get(mode, {}).values())
            names = {n for n in names if steps & tensors[n].global_steps()}
        if regex is not None:
            patterns = [_compile_regex(r) for r in ([regex] if isinstance(regex, str) else regex)]
            names = {n for n in names if any(p.search(n) for p in patterns)}
        if collection is not None:
            coll = self._collection_arg(collection)
            names = {n for n in names if coll.matches(n)}
            if not names:
                self._warn_empty_collection(coll)
        if not names:
            logger.debug("tensor_names found no tensor for step=%s regex=%s collection=%s",
                         step, regex, collection)
        return sorted(names)

    def has_tensor(self, name: str) -> bool:
        """True if the trial holds tensor ``name``."""
        if name not in self._index.tensors:
            self.maybe_refresh()
        return name in self._index.tensors

    def tensor(self, name: str) -> Tensor:
        """The Tensor ``name``.

        Raises:
            TensorUnavailable: no such tensor (yet).
        """
        if not self.has_tensor(name):
            raise TensorUnavailable(name)
        return Tensor(name, self)

    # -- steps and modes -------------------------------------------------------------------------
    def steps(self, mode: ModeKeys | str = ModeKeys.GLOBAL,
              show_incomplete_steps: bool = False) -> list[int]:
        """Saved steps of ``mode`` (mode steps; global steps for GLOBAL), complete ones only
        unless ``show_incomplete_steps``."""
        self.maybe_refresh()
        steps = set(self._index.step_workers)
        if not show_incomplete_steps:
            steps = {s for s in steps if self.is_step_complete(s)}
        return self._index.steps_of(steps, mode_from(mode))

    def modes(self) -> list[ModeKeys]:
        """Modes of the saved steps."""
        self.maybe_refresh()
        return self._index.modes()

    def mode(self, global_step: int) -> ModeKeys | None:
        """The mode of a global step (None if unknown)."""
        return self.mode_modestep(global_step)[0]

    def mode_step(self, global_step: int) -> int | None:
        """The mode step of a global step (None if unknown)."""
        return self.mode_modestep(global_step)[1]

    def mode_modestep(self, global_step: int) -> tuple[ModeKeys | None, int | None]:
        """(mode, mode step) of a global step."""
        if global_step not in self._index.global_to_mode:
            self.maybe_refresh()
        return self._index.global_to_mode.get(global_step, (None, None))

    def global_step(self, mode: ModeKeys | str, mode_step: int) -> int | None:
        """The global step of a mode step (None if unknown)."""
        mode = mode_from(mode)
        g = self._index.to_global(mode_step, mode)
        if g is None:
            self.maybe_refresh()
            g = self._index.to_global(mode_step, mode)
        return g

    def workers(self) -> list[str]:
        """Worker names of the trial."""
        self.maybe_refresh()
        return sorted(self._workers)

    def has_passed_step(self, step: int, mode: ModeKeys | str = ModeKeys.GLOBAL) -> StepState:
        """Whether ``step`` can be read now, never will be, or may be later (smdebug's rules)."""
        mode = mode_from(mode)
        self.maybe_refresh()
        seen = self._index.sorted_steps(mode)
        pos = bisect.bisect_left(seen, step)
        if pos == len(seen):
            return StepState.UNAVAILABLE if self.loaded_all_steps else StepState.NOT_YET_AVAILABLE
        first = seen[pos]
        g = self._index.to_global(first, mode)
        if g is None:  # cannot happen: ``seen`` lists the steps the index maps
            return StepState.NOT_YET_AVAILABLE
        if first > step:
            if self.last_complete_step >= g:
                return StepState.UNAVAILABLE
            return StepState.NOT_YET_AVAILABLE
        return StepState.AVAILABLE if self.is_step_complete(g) else StepState.NOT_YET_AVAILABLE

    def wait_for_steps(self, required_steps: Iterable[int],
                       mode: ModeKeys | str = ModeKeys.GLOBAL,
                       timeout: float | None = None) -> None:
        """Wait until every step of ``required_steps`` is available.

        Raises:
            StepUnavailable: a step was skipped by training.
            NoMoreData: training ended before the step.
            StepNotYetAvailable: ``timeout`` seconds passed (default 3600, MLTRACE_STEP_WAIT).
        """
        mode = mode_from(mode)
        if timeout is None:
            timeout = _env_seconds("MLTRACE_STEP_WAIT", DEFAULT_STEP_TIMEOUT)
        deadline = time.monotonic() + timeout
        for step in sorted(set(required_steps)):
            while True:
                state = self.has_passed_step(step, mode)
                if state is StepState.AVAILABLE:
                    break
                if state is StepState.UNAVAILABLE:
                    self.raise_for_missing_step(step, mode)
                if time.monotonic() >= deadline:
                    raise StepNotYetAvailable(step, mode)
                time.sleep(self.poll_interval)
                self.maybe_refresh(force=True)

    # -- the index as read so far (no refresh): what Tensor, the rules and plugins build on -----
    def index_entries(self, name: str) -> TensorEntries:
        """Where each record of tensor ``name`` lives, per global step and worker.

        Answers from the index files read so far (call ``maybe_refresh`` first to look for new
        ones). The object is the reader's own: read it, do not change it.

        Args:
            name: a tensor name (one of ``tensor_names()``).

        Returns:
            TensorEntries: ``values`` {global step: {worker: Location}}, ``reductions``
            {global step: {worker: {(reduction, abs): Location}}}, ``shapes``
            {global step: {worker: shape}}, and ``global_steps()``.

        Raises:
            TensorUnavailable: the index holds no record of ``name``.
        """
        try:
            return self._index.tensors[name]
        except KeyError:
            raise TensorUnavailable(name) from None

    def tensor_count(self) -> int:
        """How many tensor names the index files read so far hold (no refresh); cheap, so that
        a consumer can cache what it derives from ``tensor_names()`` until this changes."""
        return len(self._index.tensors)

    def saved_steps(self, mode: ModeKeys | str = ModeKeys.GLOBAL) -> Sequence[int]:
        """Every step read so far in ``mode``, complete or not (mode steps; global steps for
        GLOBAL), sorted; no refresh. The sequence is cached until the next index file is read,
        so that step lookups on long runs stay logarithmic: do not change it."""
        return self._index.sorted_steps(mode_from(mode))

    def is_step_complete(self, step: int) -> bool:
        """True if global ``step`` is complete: every worker wrote it, training ended, or a
        later step is complete (smdebug's rule; see ``incomplete_step_window``)."""
        return (self.loaded_all_steps or step <= self.last_complete_step
                or len(self._index.step_workers.get(step, ())) >= self.num_workers)

    def to_global_step(self, step: int, mode: ModeKeys | str = ModeKeys.GLOBAL) -> int | None:
        """The global step of ``step`` of ``mode`` from the index read so far (no refresh; see
        ``global_step`` for a lookup that refreshes); a GLOBAL step maps to itself when saved.

        Returns:
            the global step, or None when no index file read so far has it.
        """
        return self._index.to_global(step, mode_from(mode))

    def to_mode_steps(self, global_steps: Iterable[int],
                      mode: ModeKeys | str = ModeKeys.GLOBAL) -> list[int]:
        """``global_steps`` as sorted steps of ``mode``: mode steps of those saved in ``mode``
        (others left out), or the global steps themselves for GLOBAL."""
        return self._index.steps_of(global_steps, mode_from(mode))

    def step_wall_time(self, step: int) -> float | None:
        """When global ``step`` was written: the wall time of one of its records (None when no
        record of it can be read or none carries a wall time)."""
        for entries in self._index.tensors.values():
            by_worker = entries.values.get(step) or None
            locations = list(by_worker.values()) if by_worker else []
            if not locations and step in entries.reductions:
                locations = [loc for reds in entries.reductions[step].values()
                             for loc in reds.values()]
            for loc in locations:
                where = f"{self.storage.uri}/{loc.key}"
                try:
                    record = self.storage.read(loc.key, loc.start, loc.length)
                    wall = decode_event(unframe_record(record, where)).wall_time
                except (OSError, ValueError):
                    continue
                return wall or None
        return None

    def raise_for_missing_step(self, step: int, mode: ModeKeys | str = ModeKeys.GLOBAL,
                               tensor_name: str | None = None) -> NoReturn:
        """Raise the error that says why ``step`` of ``mode`` cannot be read.

        Args:
            step: a step of ``mode`` that the index does not hold.
            mode: its mode.
            tensor_name: the tensor being read, if any: then a step that may still be written
                raises StepNotYetAvailable.

        Raises:
            NoMoreData: training ended before ``step``.
            StepNotYetAvailable: reading a tensor at a step training may still write.
            StepUnavailable: otherwise (training skipped the step).
        """
        mode = mode_from(mode)
        seen = self._index.sorted_steps(mode)
        if self.loaded_all_steps and (not seen or step > seen[-1]):
            raise NoMoreData(step, mode, seen[-1] if seen else None)
        if (tensor_name is not None
                and self.has_passed_step(step, mode) is StepState.NOT_YET_AVAILABLE):
            raise StepNotYetAvailable(step, mode)
        raise StepUnavailable(step, mode)

    # -- reading records -----------------------------------------------------------------------
    def reload_step(self, step: int) -> bool:
        """Read the index files of global ``step`` again; True if one changed or is gone.

        A job restarted into this out_dir after a crash writes its steps again (mltrace.writer),
        so a trial that indexed the earlier run would read the new events files at the old
        offsets. Tensor reads call this when a record fails its check and, if the step changed,
        look it up again. A step whose index is gone (being rewritten: the writer removes it
        first) is dropped until a refresh finds its new index file.
        """
        changed = False
        for worker in sorted(self._index.step_workers.get(step, ())):
            key = paths.index_file_key(step, worker)
            try:
                index = decode_index(self.storage.read(key), f"{self.storage.uri}/{key}")
            except FileNotFoundError:
                index = None
            except (IndexReaderException, OSError):
                continue
            if index is not None and self._index.locations(step, worker) == (
                    TrialIndex.locations_in(index)):
                continue  # the same index: the record itself is damaged
            self._index.forget(step, worker)
            if index is not None:
                self._index.ingest(step, worker, index)
            else:  # refreshes list from this key on (and skip what they read) until it is back
                self._read_keys.discard(key)
                self._rewritten.add(key)
            changed = True
        return changed

    def read_tensor(self, location: Location, tensor_name: str, step: int,
                    mode: ModeKeys | str = ModeKeys.GLOBAL) -> np.ndarray:
        """Read and check one record (one ranged read).

        Args:
            location: where the record lives, from ``index_entries``.
            tensor_name, step, mode: what the record is, for messages and errors.

        Raises:
            TensorUnavailableForStep: the events file the index lists is missing.
            CorruptRecordError: the record fails its CRC checks or is not a record of its tensor
                (``reload_step`` tells whether the step was rewritten since it was indexed).
            MltraceTypeError: a dtype this reader does not know.
        """
        try:
            record = self.storage.read(location.key, location.start, location.length)
        except FileNotFoundError:
            logger.warning("events file %s/%s listed by the index is missing; step %d of %s "
                           "skipped", self.storage.uri, location.key, step, tensor_name)
            raise TensorUnavailableForStep(tensor_name, step, mode_from(mode)) from None
        return self._decode_record(record, location)

    def read_tensors(self, locations: Sequence[Location]) -> list[np.ndarray]:
        """Read and check several records at once (in parallel on remote stores).

        Raises:
            FileNotFoundError: an events file the index lists is missing.
            CorruptRecordError, MltraceTypeError: as ``read_tensor``; read one by one with
                ``read_tensor`` to learn which record.
        """
        requests = [(loc.key, loc.start, loc.length) for loc in locations]
        records: list[bytes] = list(self.storage.read_many(requests))
        return [self._decode_record(rec, loc) for rec, loc in zip(records, locations)]

    def _decode_record(self, record: bytes, loc: Location) -> np.ndarray:
        where = f"{self.storage.uri}/{loc.key} at byte {loc.start}"
        payload = unframe_record(record, where)
        if loc.crc32c is not None and crc32c(payload) != loc.crc32c:
            raise CorruptRecordError(where, f"payload CRC32C {crc32c(payload)} differs from "
                                            f"the index's {loc.crc32c}")
        try:
            tensor = decode_tensor_payload(payload, loc.tag)
        except WireError as exc:
            raise CorruptRecordError(where, f"not a record of {loc.tag!r} ({exc})") from None
        except MltraceTypeError as exc:  # e.g. an unknown dtype: name the file it is in
            raise MltraceTypeError(f"cannot read the record in {where}: {exc}") from None
        if tensor is None:
            raise CorruptRecordError(where, "record holds no tensor")
        return tensor

    # -- the flight recorder's records (mltrace.format.flight_record) ----------------------------
    def flight_records(self) -> list[FlightRecord]:
        """Each worker's flight recorder record: its dumps (trigger, reason, steps written
        before and after) and the first non-finite tensor it saw; empty for a trial whose hook
        had no recorder or never dumped. Read afresh at each call (a live job dumps later)."""
        return flight_record.read_records(self.storage)

    def first_nonfinite(self) -> FirstNonFinite | None:
        """The first tensor, in execution order, that held a NaN or an infinity: the earliest
        over the trial's workers (lowest step, then worker name), or None if no recorder saw
        one. Its ``tensor``, ``step``, ``mode``, ``worker`` and ``phase`` say which and when."""
        return flight_record.first_nonfinite(self.storage)

    def __repr__(self) -> str:
        return f"<Trial {self.name!r} at {self.path!r}: {len(self._index.step_workers)} steps>"


def _compile_regex(regex: Any) -> re.Pattern[str]:
    """Compile a ``tensor_names(regex=...)`` pattern, or raise naming it and the fix."""
    try:
        return re.compile(regex)
    except (re.error, TypeError) as exc:
        raise MltraceValueError(
            f"tensor_names(regex={regex!r}): not a valid regular expression ({exc}); to match a "
            "name literally, escape it: regex=re.escape(name)"
        ) from None


def trial_keywords() -> list[str]:
    """The keyword arguments Trial (and so create_trial) takes, in signature order."""
    params = inspect.signature(Trial.__init__).parameters.values()
    return [p.name for p in params
            if p.name not in ("self", "path") and p.kind is not p.VAR_KEYWORD]


def unknown_keywords(where: str, unknown: dict[str, Any], valid: list[str]) -> MltraceTypeError:
    """The error for keyword arguments ``where`` does not take: each named, with the closest
    valid one (difflib) and the full list."""
    hints = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, valid, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return MltraceTypeError(
        f"{where}() got unknown keyword argument(s) {', '.join(hints)}; "
        f"valid keyword arguments are: {', '.join(valid)}"
    )
