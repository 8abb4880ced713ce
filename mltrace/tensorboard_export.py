"""TensorBoard export of a hook: scalar and histogram summaries, one appended events file per mode.

Layout (``tensorboard_dir`` defaults to ``<out_dir>/tensorboard``)::

    <tensorboard_dir>/<MODE>/events.out.tfevents.<%010d time>.<host>.<pid>.<n>            chief
    <tensorboard_dir>/<MODE>/<worker>/events.out.tfevents....                              other workers

Each mode is a TensorBoard run; Event.step is the global step (as smdebug's export), so TRAIN and
EVAL line up on one axis. Unlike smdebug (one small file per step and mode, no file_version
record), a file is opened once per mode and process and appended, as torch's SummaryWriter does:
TensorBoard's Python loader only follows the newest file of a run, and per-step files made it
crawl. Records carry the real masked CRC32C. Everything after ``add_*`` happens on one
background thread: histogram binning, encoding, and the disk writes, flushed every
``flush_secs`` and at close. ``add_*`` gathers summaries into a batch that the thread receives
whole: at ``end_step()`` (the hook calls it when a step ends), every ``SUBMIT_EVERY`` summaries,
and at a flush, so the thread wakes once a step, not once per summary to take the interpreter
from the training thread. The queue of batches is bounded, so a training loop that outruns the
disk waits instead of losing summaries.

A flush that fails (a full disk) leaves no partial record: the appended file is cut back to its
previous size (a new file is removed), the first failure is logged with the file and the cause,
later ones are counted and summed up at close, and the summaries of that flush are dropped. The
writer keeps going: the next flush appends again, so summaries reappear once the disk has space.
A hook built with ``strict=True`` raises the failure instead (``failures``, a mltrace.failure_log.FailureLog).

Histograms are binned like torch's ``SummaryWriter.add_histogram(bins="tensorflow")`` (TF's
exponential buckets, +-1e-12 growing by 1.1 up to 1e20, plus 0; empty outer buckets trimmed;
values beyond +-1e20 fall outside, as there; see mltrace.histogram_bins), so the bytes equal
torch's for the same values, but for the last bits of sum_squares (einsum here, BLAS there). An adapter may bin a tensor where it lives (``add_binned_histogram``,
e.g. on a GPU) so that only the counts reach the host.
NaN and Inf are left out of a histogram (torch would write NaN min/max, which TensorBoard cannot
draw); a tensor with no finite value gets none, and neither do bool, complex and empty tensors.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import re
import socket
import threading
import time
from bisect import bisect_right

import numpy as np

from mltrace.exceptions import TrialWriteError
from mltrace.failure_log import FailureLog
from mltrace.format import paths
from mltrace.format.events import (
    encode_file_version_event,
    encode_histogram,
    encode_histogram_event,
    encode_scalar_event,
)
from mltrace.format.records import frame_record
from mltrace.histogram_bins import DEFAULT_BINS, Binned, bin_values
from mltrace.modes import ModeKeys
from mltrace.storage import open_storage

logger = logging.getLogger(__name__)

#: Seconds between background flushes (torch's SummaryWriter waits 120 s; TensorBoard reloads every 5).
DEFAULT_FLUSH_SECS = 5.0
#: Storage without appends (object stores) gets one new file per flush, so flush less often there.
REMOTE_FLUSH_SECS = 60.0
#: A mode's buffer is written out early once it holds this many bytes.
MAX_BUFFER_BYTES = 4 << 20
#: ``add_*`` hands its batch to the background thread at the latest after this many summaries.
SUBMIT_EVERY = 64
_STOP = object()
_FLUSH = object()
_file_counter = itertools.count()
_TAG_CHARS = re.compile(r"[^-/\w.]")


def clean_tag(name: str) -> str:
    """A summary tag from a tensor name, as smdebug (and TF) make them: characters outside
    ``[-/\\w.]`` become ``_`` and leading ``/`` go."""
    return _TAG_CHARS.sub("_", name).lstrip("/")


def histogram_fields(values: np.ndarray) -> bytes | None:
    """The encoded HistogramProto of ``values`` (its finite ones), or None if there are none."""
    binned = bin_values(values)
    return None if binned is None else encode_binned(binned)


def encode_binned(binned: Binned) -> bytes | None:
    """The encoded HistogramProto of a binned histogram, as torch's ``make_histogram`` writes
    it: empty buckets trimmed at both ends but one kept on the left (TensorBoard shows only
    right edges); None when every value lies beyond +-1e20 (no bucket holds one)."""
    span = _filled_span(binned)
    if span is None:
        return None
    start, end = span
    counts = binned.counts
    counts = counts[start - 1:end] if start > 0 else np.concatenate([[0], counts[:end]])
    limits = DEFAULT_BINS[start:end + 1]
    return encode_histogram(binned.min, binned.max, binned.num, binned.sum, binned.sum_squares,
                            limits, counts.astype(np.float64))


_EDGES = DEFAULT_BINS.tolist()  # bisect on a list: a fraction of a microsecond per search


def _filled_span(binned: Binned) -> tuple[int, int] | None:
    """The first filled bucket and one past the last; None if every bucket is empty.

    They are the buckets of the values' min and max whenever those lie within the edges (the
    usual case, found by two searches); otherwise, the counts are scanned."""
    counts, last = binned.counts, len(binned.counts) - 1
    start = bisect_right(_EDGES, binned.min) - 1
    end = last if binned.max == _EDGES[-1] else bisect_right(_EDGES, binned.max) - 1
    if 0 <= start <= end <= last and counts[start] and counts[end]:
        return start, end + 1
    filled = np.flatnonzero(counts)
    return (int(filled[0]), int(filled[-1]) + 1) if filled.size else None


class TensorBoardWriter:
    """Writes one process's TensorBoard summaries under ``location``, one file per mode.

    Args:
        location: the TensorBoard folder (local path or a URI of an installed storage backend).
        worker: None for the chief worker, else the worker name (its runs go one level deeper).
        flush_secs: seconds between background flushes (default 5 locally, 60 on object stores).
        max_pending: summaries queued for the background thread before ``add_*`` waits
            (counted in batches of up to ``SUBMIT_EVERY``).
    """

    def __init__(self, location: str, worker: str | None = None, flush_secs: float | None = None,
                 max_pending: int = 1024) -> None:
        self.location = location
        self.storage = open_storage(location)
        self.worker = paths.check_worker_name(worker) if worker else None
        self._local = self.storage.local_path("x") is not None
        self.flush_secs = flush_secs if flush_secs is not None else (
            DEFAULT_FLUSH_SECS if self._local else REMOTE_FLUSH_SECS)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, max_pending // SUBMIT_EVERY))
        self._batch: list[tuple] = []  # summaries not handed to the thread yet
        self._batch_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._buffers: dict[ModeKeys, bytearray] = {}
        self._files: dict[ModeKeys, str] = {}
        self._closed = False
        self._discarding = False
        folder = self.storage.local_path("x")
        if folder is not None:  # the folder is there once the export starts (smdebug made it too)
            os.makedirs(os.path.dirname(folder), exist_ok=True)
        #: encodes and flushes that failed (see mltrace.failure_log).
        self.failures = FailureLog(logger, "the export goes on")
        self.events_written = 0

    # -- training thread ------------------------------------------------------------------------
    def add_scalar(self, mode: ModeKeys, step: int, tag: str, value: float, wall_time: float | None = None) -> None:
        """Queue a scalar summary (written as a float32 ``simple_value``)."""
        self._put(("s", mode, step, clean_tag(tag), float(value), time.time() if wall_time is None else wall_time))

    def add_histogram(self, mode: ModeKeys, step: int, tag: str, values: np.ndarray,
                      wall_time: float | None = None) -> None:
        """Queue a histogram of ``values``; a copy is taken here (the caller's buffer may be a
        framework tensor's memory that the optimizer overwrites) and binned in the background."""
        if values.dtype.kind not in "iuf" or values.size == 0:
            return
        self._put(("h", mode, step, clean_tag(tag), np.array(values, copy=True),
                   time.time() if wall_time is None else wall_time))

    def add_binned_histogram(self, mode: ModeKeys, step: int, tag: str, binned: Binned,
                             wall_time: float | None = None) -> None:
        """Queue a histogram binned already (mltrace.histogram_bins' buckets)."""
        self._put(("b", mode, step, clean_tag(tag), binned,
                   time.time() if wall_time is None else wall_time))

    def _put(self, item: tuple) -> None:
        if self._closed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mltrace-tensorboard", daemon=True)
            self._thread.start()
        with self._batch_lock:
            self._batch.append(item)
            full = len(self._batch) >= SUBMIT_EVERY
        if full:
            self.end_step()

    def end_step(self) -> None:
        """Hand the summaries added so far to the background thread (without waiting for it);
        summaries not handed over are taken by its next periodic flush."""
        batch = self._take_batch()
        if batch:
            self._queue.put(batch)

    def _take_batch(self) -> list[tuple]:
        with self._batch_lock:
            batch, self._batch = self._batch, []
        return batch

    def flush(self) -> None:
        """Write everything added so far to disk (waits for the background thread)."""
        if self._thread is not None and self._thread.is_alive():
            self.end_step()
            done = threading.Event()
            self._queue.put((_FLUSH, done))
            done.wait()

    def discard(self) -> None:
        """Stop without writing the summaries not written yet (the hook found its out_dir
        replaced by another run's)."""
        self._discarding = True
        self.close()

    def close(self) -> None:
        """Flush and stop the background thread; later ``add_*`` calls are ignored."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            self.end_step()
            self._queue.put(_STOP)
            self._thread.join()
        self._thread = None
        self.failures.summarize(f"TensorBoard writes to {self.location} failed")

    # -- background thread ----------------------------------------------------------------------
    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_secs
        while True:
            try:
                item = self._queue.get(timeout=max(0.01, next_flush - time.monotonic()))
            except queue.Empty:
                item = None
            if item is _STOP:
                self._write_out()
                return
            if isinstance(item, tuple) and item[0] is _FLUSH:
                self._write_out()
                item[1].set()
            elif isinstance(item, list):  # a batch of add_* items (None: the get timed out)
                for summary in item:
                    self._encode(summary)
            if time.monotonic() >= next_flush:
                if self._queue.empty():  # added, but no step has ended since: keep their order
                    for summary in self._take_batch():
                        self._encode(summary)
                self._write_out()
                next_flush = time.monotonic() + self.flush_secs

    def _encode(self, item: tuple) -> None:
        kind, mode, step, tag, value, wall_time = item
        try:
            if kind == "s":
                payload = encode_scalar_event(tag, value, step, wall_time)
            else:
                histo = histogram_fields(value) if kind == "h" else encode_binned(value)
                if histo is None:
                    return
                payload = encode_histogram_event(tag, histo, step, wall_time)
        except Exception as exc:  # one odd value must not stop the export
            self.failures.record(f"could not encode summary {tag!r} at step {step}: {type(exc).__name__}: {exc}")
            return
        buffer = self._buffers.get(mode)
        if buffer is None:
            buffer = self._buffers[mode] = bytearray()
        buffer += frame_record(payload, real_crc=True)
        self.events_written += 1
        if len(buffer) >= MAX_BUFFER_BYTES:
            self._write_mode(mode)

    def _write_out(self) -> None:
        for mode in list(self._buffers):
            self._write_mode(mode)

    def _new_file_key(self, mode: ModeKeys) -> str:
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{next(_file_counter)}")
        folder = mode.name if self.worker is None else f"{mode.name}/{self.worker}"
        return f"{folder}/{name}"

    def _write_mode(self, mode: ModeKeys) -> None:
        buffer = self._buffers.get(mode)
        if not buffer:
            return
        if self._discarding:
            buffer.clear()
            return
        header = frame_record(encode_file_version_event(time.time()), real_crc=True)
        key = self._files.get(mode)
        try:
            if self._local:
                if key is None:
                    key = self._new_file_key(mode)
                    data = header + buffer
                else:
                    data = bytes(buffer)
                _append_whole(self.storage.local_path(key), data)  # type: ignore[arg-type]
                self._files[mode] = key  # only once its header is there
            else:
                # No appends on object stores: each flush is a new, complete file that sorts after
                # the previous one, which is what TensorBoard's loader expects of a growing run.
                key = self._new_file_key(mode)
                self.storage.write(key, header + buffer)
        except Exception as exc:
            where = f"{self.location.rstrip('/')}/{key}" if key else self.location
            self.failures.record(f"could not write TensorBoard summaries to {where}: "
                                 f"{type(exc).__name__}: {exc}", TrialWriteError(where, exc))
        buffer.clear()


def _append_whole(path: str, data: bytes) -> None:
    """Append ``data`` to ``path`` entirely or not at all: after a failed write (a full disk) the
    file is cut back to its previous size (removed if it was new), so that TensorBoard never
    reads a partial record, and a later append lands right after the last whole one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        size: int | None = os.path.getsize(path)
    except FileNotFoundError:
        size = None
    try:
        with open(path, "ab") as f:
            f.write(data)
    except OSError:
        try:
            if size is None:
                os.remove(path)
            else:
                os.truncate(path, size)
        except OSError:
            logger.debug("could not cut %s back after a failed write", path, exc_info=True)
        raise


def resolve_tensorboard_dir(out_dir: str, export_tensorboard: bool, tensorboard_dir: str | None) -> str | None:
    """Where a hook exports TensorBoard summaries (smdebug's rule: an explicit ``tensorboard_dir``
    wins, else ``<out_dir>/tensorboard`` when ``export_tensorboard``), or None for no export."""
    if tensorboard_dir:
        return str(tensorboard_dir)
    if export_tensorboard:
        return out_dir.rstrip("/") + "/" + paths.TENSORBOARD_DIR
    return None


__all__ = ["TensorBoardWriter", "clean_tag", "histogram_fields", "resolve_tensorboard_dir", "DEFAULT_BINS"]
