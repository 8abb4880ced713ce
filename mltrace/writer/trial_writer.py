"""Tensors -> one worker's files of a trial: per-step events + index, collections, end marker.

Records of a step are encoded on the training thread (cheap: bytes are built in memory) and the
finished files are handed to one writer that writes them in order: the events file before its
index file, so that a reader that finds an index file always finds its events file. For a local
trial that writer is a child process fed through a pipe (mltrace.writer.process: its syscalls
then never take the interpreter's lock from training); for S3, or if the child is not there, a
background thread of this process.

Remote stores (S3) can be down. Then files go to a local spill folder (mltrace.writer.spill) instead of
waiting: when the bounded queue is full or the store refuses a file, that file and every later
one are spilled in order, and the background thread uploads the spill as soon as the store
answers again. Training never waits on the network beyond the queue, and no step is lost.

A file that can be written nowhere (a full or failing local disk, or a spill folder on one) is
lost, never half there: storages write atomically, and the files of a step that come after a
failed one are dropped with it, so that no index file names an events file that is not there.
The first failure is logged at once (naming the file and the cause), later ones are counted and
summed up at close. The writer keeps trying: every later step is written as usual, so a disk
that gets space again gets the steps again (smdebug's writer also went on). A hook built with
``strict=True`` raises the failure instead (``failures``, a mltrace.writer.failure_log.FailureLog).

A job restarted into the out_dir of a crashed run (the hook accepts an out_dir without the end
marker, as smdebug did) writes its steps from step 0 again, over the earlier run's files. Each
file is replaced atomically, but a step is two files: killed between them, the job would leave
the earlier run's index naming offsets and CRCs in the new events file, a step that can never
be read. So the background thread first lists the index files already there (one listing, off
the training thread) and removes the earlier run's index file of a step before it replaces
that step's events file: at every moment a step's index matches its events file, or the step
has no index (absent for readers, never an error).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TypeVar, cast

import numpy as np

from mltrace.exceptions import TrialWriteError
from mltrace.format import paths
from mltrace.format.event_batch import EventBatchEncoder
from mltrace.format.index import ShapeEntry
from mltrace.format.scalar_block import ScalarBlockEncoder
from mltrace.modes import ModeKeys
from mltrace.storage.base import Storage
from mltrace.writer.byte_queue import ByteQueue
from mltrace.writer.failure_log import FailureLog
from mltrace.writer.process import WriterProcess, WriterProcessGone
from mltrace.writer.spill import SpillDir, default_spill_root
from mltrace.writer.step_records import StepRecords

logger = logging.getLogger("mltrace.writer")  # the name users configure: the package's

_STOP = object()
#: The files handed over together (a step: its events file, then its index file); None as data
#: deletes the file.
FileGroup = Sequence[tuple[str, "bytes | None"]]
#: The same as the writer process takes them: an events file may still be its parts, in order
#: (the pipe takes them as they are; joining them would copy every value once more).
PartsGroup = Sequence[tuple[str, "bytes | list[bytes] | None"]]
_Group = TypeVar("_Group", bound=PartsGroup)
#: What the background thread may hold before the training thread waits (see TrialWriter).
DEFAULT_MAX_PENDING_BYTES = 256 << 20
# _write_one's outcomes.
_WRITTEN, _SPILL, _LOST = "written", "spill", "lost"


class TrialWriter:
    """Writes one worker's part of a trial.

    Args:
        storage: where the trial lives.
        worker: the worker name in file names (``worker_0``).
        max_pending_bytes: bytes of files queued for the background thread (and being
            written) before the training thread waits for the disk, or, with a remote store,
            before files go to the local spill. Memory stays bounded on a slow disk.
        batch_steps: let the writer process take steps in batches (mltrace.writer.process);
            False hands each step over at once, so that a write failure is known within a
            step or two (strict hooks, which raise it in training).
    """

    def __init__(self, storage: Storage, worker: str, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 spill_root: str | None = None, close_timeout: float = 60.0,
                 retry_interval: float = 2.0, batch_steps: bool = True) -> None:
        self.storage = storage
        self.batch_steps = batch_steps
        self.worker = paths.check_worker_name(worker)
        self._step: StepRecords | None = None
        self._encoder = EventBatchEncoder()
        self._scalars = ScalarBlockEncoder()
        self._queue: ByteQueue[object] = ByteQueue(max_pending_bytes)
        self._thread: threading.Thread | None = None
        #: files that could not be written (see mltrace.writer.failure_log).
        self.failures = FailureLog(logger, "mltrace goes on with the next steps", "write errors")
        self.steps_written = 0
        self._earlier_steps: set[int] | None = None  # an earlier run's steps, once listed
        self.close_timeout = close_timeout
        self.retry_interval = retry_interval
        remote = not storage.is_local
        self.spill = SpillDir(spill_root or default_spill_root(), storage.uri, self.worker) if remote else None
        self._spill_lock = threading.Lock()
        self._outage_logged = False
        self._process = None if remote else WriterProcess.start(
            storage, max_pending_bytes, functools.partial(_failed_in_process, self.failures, storage.uri))
        self._lister: threading.Thread | None = None
        self._sent_any = False
        if self._process is not None:
            self._list_earlier_run()

    # -- one step -------------------------------------------------------------------------------
    def open_step(self, step: int, mode: ModeKeys, mode_step: int) -> None:
        """Start collecting the records of ``step``; closes the previous step if still open."""
        if self._step is not None:
            self.close_step()
        self._step = StepRecords(step, mode, mode_step)

    @property
    def step_open(self) -> bool:
        """True while a step's records are being collected."""
        return self._step is not None

    def add_tensor(self, name: str, value: np.ndarray, mode: ModeKeys, mode_step: int,
                   wall_time: float | None = None) -> None:
        """Append one tensor record to the open step."""
        self.add_tensors(((name, value),), mode, mode_step, wall_time)

    def add_tensors(self, records: Iterable[tuple[str, np.ndarray]], mode: ModeKeys, mode_step: int,
                    wall_time: float | None = None) -> None:
        """Append tensor records (name, value) to the open step (see StepRecords.add_tensors)."""
        assert self._step is not None, "open_step() first"
        self._step.add_tensors(self._encoder, records, mode, mode_step, wall_time)

    def add_scalars(self, names: Sequence[str], integer: Sequence[bool], values: np.ndarray,
                    mode: ModeKeys, mode_step: int) -> None:
        """Append one-number records to the open step as one block (see StepRecords.add_scalars)."""
        assert self._step is not None, "open_step() first"
        self._step.add_scalars(self._scalars, names, integer, values, mode, mode_step)

    def record_names(self) -> set[str]:
        """Names of the records in the open step so far."""
        return set(self._step.records.names) if self._step is not None else set()

    def add_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Record a tensor's shape in the open step's index (no record is written)."""
        assert self._step is not None, "open_step() first"
        self._step.index.shapes.append(ShapeEntry(name, tuple(int(s) for s in shape)))

    def close_step(self) -> bool:
        """Hand the open step's files to the background writer; False if it held nothing."""
        step, self._step = self._step, None
        if step is None or step.empty:
            return False
        self._submit(step.files(self.worker, joined=not self._piping), soon=not self.batch_steps)
        self.steps_written += 1
        return True

    def hand_over(self) -> None:
        """Hand the closed steps still waiting in a batch to the writer process now.

        The writer process takes steps that close one after the other in batches (8 steps or
        256 KiB, or 50 ms after the first: mltrace.writer.process). The hook calls this at a step
        boundary after which nothing is saved, so that the last saved steps never wait for a timer
        while training goes on: a step is handed over at the latest when the next step that saves
        nothing begins, and is on disk as soon as the child has written it.
        """
        if self._process is not None:
            self._process.hand_over()

    @property
    def steps_waiting(self) -> int:
        """Closed steps not yet handed to whoever writes them (the writer process's batch)."""
        return self._process.waiting if self._process is not None else 0

    # -- whole-trial files ------------------------------------------------------------------------
    def write_collections(self, collections_json: str) -> None:
        """(Re)write this worker's collections file."""
        self._submit([(paths.collections_file_key(self.worker), collections_json.encode())])

    def write_end_marker(self) -> None:
        """Write this worker's done file, then ``training_job_end.ts``, after everything queued."""
        self._submit([(f"{paths.WORKERS_DONE_DIR}/{self.worker}", b""), (paths.END_OF_JOB_MARKER, b"")])

    def write_file(self, key: str, data: bytes) -> None:
        """Queue any other file of the trial (e.g. the MLflow run file)."""
        self._submit([(key, data)])

    # -- writer process ---------------------------------------------------------------------------
    def _list_earlier_run(self) -> None:
        """Find an earlier run's steps (see the module docstring) off the training thread, for
        the writer process; a trial without index files yet needs no listing."""
        if not self.storage.exists(paths.INDEX_DIR):
            self._earlier_steps = set()
            return

        def find() -> None:
            self._earlier_steps = self._find_earlier_run()

        self._lister = threading.Thread(target=find, name="mltrace-writer-list", daemon=True)
        self._lister.start()

    @property
    def _piping(self) -> bool:
        """True while files go into the writer process's pipe (it started, and is not gone)."""
        return self._process is not None and self._sent_any and not self._process.gone

    def _send(self, files: PartsGroup, soon: bool) -> None:
        """Hand ``files`` to the writer process (``soon``: now, not with a batch of steps); if
        it is gone, the thread takes over."""
        assert self._process is not None
        if self._lister is not None:
            self._lister.join()
            self._lister = None
        if self._process.gone:
            self._take_over()
            self._submit(files, soon)
            return
        if not self._sent_any and not self._process.started:
            # Until the child is ready (tens of ms), files are written here: the trial's first
            # file, its collections file, makes it a trial for readers, and the first steps must
            # not wait in a pipe for a process that may be slow to start (or never start).
            self._write_group(_joined(files))
            return
        self._sent_any = True
        try:
            self._process.send(self._replacing_earlier(files), soon)
        except WriterProcessGone:
            self._take_over()

    def _take_over(self) -> None:
        """The writer process is gone: the thread writes from now on, starting with the files
        the process never got. If it died while running (killed), what it held and had not
        written is lost, which is recorded as a failure."""
        assert self._process is not None
        process, self._process = self._process, None
        started = process.started
        unsent = process.take_unsent()
        status = process.close(wait=True)
        if not started:
            logger.debug("the writer process of %s did not start; writing with a thread", self.storage.uri)
        elif status is not None:  # None: a forked copy of the process that owns the child
            self._record_failure(
                f"{self.storage.uri} (the files its writer process had not written yet)",
                RuntimeError(f"the writer process {process.pid} exited with status {status}; "
                             "a thread of this process writes the next files"))
        for group in unsent:
            self._submit(list(group))

    # -- background thread ----------------------------------------------------------------------
    def _submit(self, group: PartsGroup, soon: bool = True) -> None:
        """Hand ``group`` to whoever writes it: the writer process, or the thread (which takes
        each file in one piece). Files other than steps' (``soon``) go to the process at once:
        readers look for the collections file as soon as a trial exists."""
        if self._process is not None:
            self._send(group, soon)
            return
        files = _joined(group)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="mltrace-writer", daemon=True)
            self._thread.start()
        if self.spill is None:
            self._queue.put(files, _size(files))  # local disk: waiting for the queue is waiting for the disk
            return
        with self._spill_lock:
            if self.spill.pending:  # keep order: once spilling, everything goes behind the spill
                self._spill(files)
                return
        try:
            self._queue.put(files, _size(files), block=False)
        except queue.Full:
            with self._spill_lock:
                self._spill(files)

    def _spill(self, files: FileGroup) -> None:
        assert self.spill is not None
        if not self._outage_logged:
            self._outage_logged = True
            logger.warning("%s is not keeping up or not answering: keeping files in %s and uploading "
                           "them when it answers again", self.storage.uri, self.spill.path)
        for key, data in files:
            if data is None:
                # A deletion cannot wait in the spill: the earlier run's index then stays until
                # this step's index replaces it (only a crash between uploading the two spilled
                # files leaves it naming the new events file).
                continue
            try:
                self.spill.add(key, data)
            except OSError as exc:  # the spill's disk is full too: this file (and its step) is lost
                where = f"{self.storage.uri}/{key} (nor spill it to {self.spill.path})"
                self._record_failure(where, exc)
                return

    def _run(self) -> None:
        if self._earlier_steps is None:
            self._earlier_steps = self._find_earlier_run()
        while True:
            self._drain_spill()
            try:
                item, size = self._queue.get(timeout=self.retry_interval)
            except queue.Empty:
                continue
            try:
                if item is _STOP:
                    self._drain_spill()
                    return
                self._write_group(item)  # type: ignore[arg-type]
            finally:
                self._queue.task_done(size)

    def _write_group(self, files: FileGroup) -> None:
        """Write one submitted group of files in order (a step: events file, then index file),
        stopping at the first that fails; never raises (failures are recorded)."""
        try:
            group = self._replacing_earlier(files)
            for i, (key, data) in enumerate(group):
                outcome = self._write_one(key, data)
                if outcome == _SPILL:
                    with self._spill_lock:
                        self._spill(group[i:])
                if outcome != _WRITTEN:
                    break  # an index file never goes without the events file before it
        except Exception as exc:  # the thread must live on: later files and flush() wait on it
            self._record_failure(f"{self.storage.uri}/{files[0][0]}", exc)

    def _find_earlier_run(self) -> set[int]:
        """The steps whose index files an earlier run of this worker left in the trial (a crashed
        job restarted into the same out_dir; see the module docstring). Empty for a storage that
        cannot delete, or that cannot be listed now (then a restart is not guarded)."""
        if type(self.storage).delete is Storage.delete:
            return set()
        try:
            keys = self.storage.list(paths.INDEX_DIR)
        except Exception as exc:
            logger.warning("could not list %s/%s for an earlier run's steps: %s",
                           self.storage.uri, paths.INDEX_DIR, exc)
            return set()
        parsed = (paths.parse_index_key(key) for key in keys)
        steps = {p[0] for p in parsed if p is not None and p[1] == self.worker}
        if steps:
            logger.warning("%s holds %d steps of an earlier run of %s that did not finish; this "
                           "run replaces each step it writes again", self.storage.uri, len(steps),
                           self.worker)
        return steps

    def _replacing_earlier(self, files: _Group) -> _Group:
        """``files``, led by the removal (None) of the earlier run's index file when they are an
        events file and an index file that replace a step of that run."""
        if not self._earlier_steps or len(files) < 2:  # most runs: no earlier run to replace
            return files
        parsed = paths.parse_index_key(files[-1][0])
        if parsed is None or parsed[0] not in self._earlier_steps:
            return files
        self._earlier_steps.discard(parsed[0])
        return cast(_Group, [(files[-1][0], None), *files])

    def _spill_unsent(self) -> None:
        """Move what the stalled background thread never took from the queue to the spill."""
        while True:
            try:
                item, size = self._queue.get(timeout=0)
            except queue.Empty:
                return
            if item is not _STOP:
                with self._spill_lock:
                    self._spill(item)  # type: ignore[arg-type]
            self._queue.task_done(size)

    def _drain_spill(self) -> None:
        if self.spill is None or not self.spill.pending:
            return
        try:
            uploaded = self.spill.drain(self.storage)
        except Exception as exc:
            logger.debug("spill upload to %s failed, will retry: %s", self.storage.uri, exc)
            return
        if uploaded and not self.spill.pending:
            logger.warning("%s answers again: uploaded %d spilled files", self.storage.uri, uploaded)
            self._outage_logged = False

    def _write_one(self, key: str, data: bytes | None) -> str:
        """Write one file (delete it if ``data`` is None): _WRITTEN; _SPILL when a remote store
        failed (the caller spills it and what follows); _LOST when local storage failed (logged;
        the caller drops the rest of the group)."""
        try:
            if data is None:
                self.storage.delete(key)
            else:
                self.storage.write(key, data)
            return _WRITTEN
        except Exception as exc:  # never crash training; the hook reports at close
            if self.spill is not None:
                logger.debug("writing %s failed: %s", key, exc)
                return _SPILL
            self._record_failure(f"{self.storage.uri}/{key}", exc)
            return _LOST

    def _record_failure(self, location: str, exc: BaseException) -> None:
        _record_failure(self.failures, location, exc)

    def discard(self) -> None:
        """Stop without writing what is still queued (the hook found its out_dir replaced: those
        files belong in a folder that is gone); a file being written now is finished."""
        self._step = None
        if self._process is not None:
            self._process.close(discard=True)
            self._process = None
        while True:
            try:
                _, size = self._queue.get(timeout=0)
            except queue.Empty:
                break
            self._queue.task_done(size)
        self.close()

    def flush(self) -> None:
        """Wait until every queued file is written."""
        if self._process is not None:
            self._process.flush()
            if self._process.gone:  # before it wrote what it was sent, if it never started
                self._take_over()
        if self._thread is not None and self._thread.is_alive():
            self._queue.join()

    def close(self) -> None:
        """Close the open step, write everything queued, and stop the background thread.

        With a remote store, waits at most ``close_timeout`` seconds for spilled files; what is
        still not uploaded then stays on local disk and the log names it and the command that
        uploads it later.
        """
        self.close_step()
        if self._process is not None:
            self.flush()  # the thread takes over if the process is gone
        if self._process is not None:  # flushed: everything is written, the child may go
            self._process.close()
            self._process = None
        if self._thread is not None and self._thread.is_alive():
            deadline = time.monotonic() + self.close_timeout
            if self.spill is None:
                self._queue.put(_STOP, 0)
                self._thread.join()
            else:
                try:
                    self._queue.put(_STOP, 0, timeout=self.close_timeout)
                except queue.Full:
                    pass
                self._thread.join(max(0.0, deadline - time.monotonic()))
                self._spill_unsent()
            while self.spill is not None and self.spill.pending and time.monotonic() < deadline:
                self._drain_spill()
                if self.spill.pending:
                    time.sleep(min(self.retry_interval, max(0.0, deadline - time.monotonic())))
        self._thread = None
        if self.spill is not None and self.spill.pending:
            logger.error(
                "%d files of %s could not be uploaded before close (the store did not answer for "
                "%.0f s). They are safe in %s; upload them later with: mltrace upload-spill %s",
                self.spill.pending, self.storage.uri, self.close_timeout, self.spill.path, self.spill.path)
        self.failures.summarize(f"{{count}} files of {self.storage.uri} could not be written")


def _record_failure(failures: FailureLog, location: str, exc: BaseException) -> None:
    failures.record(f"could not write {location}: {type(exc).__name__}: {exc}", TrialWriteError(location, exc))


def _failed_in_process(failures: FailureLog, uri: str, key: str, exc: BaseException) -> None:
    """What the writer process could not write (not a method: its reports thread must not keep
    the TrialWriter alive)."""
    _record_failure(failures, f"{uri}/{key}", exc)


def _joined(files: PartsGroup) -> FileGroup:
    """``files`` with each file's data in one piece (what storages and the thread take)."""
    return [(key, b"".join(data) if isinstance(data, list) else data) for key, data in files]


def _size(files: FileGroup) -> int:
    """The memory a queued group of files holds (a small floor per file bounds empty files too)."""
    return sum(len(data or b"") + 256 for _, data in files)


__all__ = ["TrialWriter"]
