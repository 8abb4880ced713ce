"""Tensors -> one worker's files of a trial: per-step events + index, collections, end marker.

Records of a step are encoded on the training thread (cheap: bytes are built in memory) and the
finished files are handed to one background thread that writes them in order: the events file
before its index file, so that a reader that finds an index file always finds its events file.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np

from mltrace.format import paths
from mltrace.format.crc32c import crc32c
from mltrace.format.events import encode_tensor_event
from mltrace.format.index import IndexEntry, ShapeEntry, StepIndex, encode_index
from mltrace.format.records import frame_record
from mltrace.modes import ModeKeys
from mltrace.storage.base import Storage

logger = logging.getLogger(__name__)

_STOP = object()


class _StepFile:
    """The records of one (global step, worker) being assembled in memory."""

    def __init__(self, step: int, mode: ModeKeys, mode_step: int) -> None:
        self.step = step
        self.index = StepIndex(mode=mode, mode_step=mode_step, event_file_name=None)
        self.buffer = bytearray()


class TrialWriter:
    """Writes one worker's part of a trial.

    Args:
        storage: where the trial lives.
        worker: the worker name in file names (``worker_0``).
        max_pending: files queued for the background thread before the training thread waits.
    """

    def __init__(self, storage: Storage, worker: str, max_pending: int = 64) -> None:
        self.storage = storage
        self.worker = paths.check_worker_name(worker)
        self._step: _StepFile | None = None
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.steps_written = 0

    # -- one step -------------------------------------------------------------------------------
    def open_step(self, step: int, mode: ModeKeys, mode_step: int) -> None:
        """Start collecting the records of ``step``; closes the previous step if still open."""
        if self._step is not None:
            self.close_step()
        self._step = _StepFile(step, mode, mode_step)

    @property
    def step_open(self) -> bool:
        """True while a step's records are being collected."""
        return self._step is not None

    def add_tensor(
        self, name: str, value: np.ndarray, mode: ModeKeys, mode_step: int,
        wall_time: float | None = None,
    ) -> None:
        """Append one tensor record to the open step."""
        step = self._step
        assert step is not None, "open_step() first"
        payload = encode_tensor_event(
            name, value, step.step, mode, mode_step, time.time() if wall_time is None else wall_time
        )
        record = frame_record(payload)
        step.index.tensors.append(IndexEntry(name, len(step.buffer), len(record), crc32c(payload)))
        step.buffer += record

    def add_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Record a tensor's shape in the open step's index (no record is written)."""
        assert self._step is not None, "open_step() first"
        self._step.index.shapes.append(ShapeEntry(name, tuple(int(s) for s in shape)))

    def close_step(self) -> bool:
        """Hand the open step's files to the background writer; False if it held nothing."""
        step, self._step = self._step, None
        if step is None or (not step.index.tensors and not step.index.shapes):
            return False
        files = []
        if step.index.tensors:
            event_key = paths.event_file_key(step.step, self.worker)
            step.index.event_file_name = event_key
            files.append((event_key, bytes(step.buffer)))
        files.append((paths.index_file_key(step.step, self.worker), encode_index(step.index)))
        self._submit(files)
        self.steps_written += 1
        return True

    # -- whole-trial files ------------------------------------------------------------------------
    def write_collections(self, collections_json: str) -> None:
        """(Re)write this worker's collections file."""
        self._submit([(paths.collections_file_key(self.worker), collections_json.encode())])

    def write_end_marker(self) -> None:
        """Write ``training_job_end.ts`` after everything queued before it."""
        self._submit([(paths.END_OF_JOB_MARKER, b"")])

    def write_file(self, key: str, data: bytes) -> None:
        """Queue any other file of the trial (e.g. the MLflow run file)."""
        self._submit([(key, data)])

    # -- background thread ----------------------------------------------------------------------
    def _submit(self, files: list[tuple[str, bytes]]) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="mltrace-writer", daemon=True)
            self._thread.start()
        self._queue.put(files)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                for key, data in item:  # type: ignore[union-attr]
                    self._write_one(key, data)
            finally:
                self._queue.task_done()

    def _write_one(self, key: str, data: bytes) -> None:
        try:
            self.storage.write(key, data)
        except Exception as exc:  # never crash training; the hook reports at close
            message = f"could not write {self.storage.uri}/{key}: {type(exc).__name__}: {exc}"
            if not self.errors:
                logger.error("%s (further write errors are counted and reported at close)", message)
            self.errors.append(message)

    def flush(self) -> None:
        """Wait until every queued file is written."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.join()

    def close(self) -> None:
        """Close the open step, write everything queued, and stop the background thread."""
        self.close_step()
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._thread = None
        if len(self.errors) > 1:
            logger.error("%d files of %s could not be written; first: %s",
                         len(self.errors), self.storage.uri, self.errors[0])


__all__ = ["TrialWriter"]
