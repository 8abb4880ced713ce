"""Where a hook's tensors go: the trial writer (smdebug's format), the TensorBoard export and the
tracking sinks (MLflow). One object, so the hook says "write this tensor" once.

A sink is any object with ``log_scalar(name, value, mode, mode_step)`` and ``close()``;
sinks are created through mltrace.plugins (entry point group ``mltrace.sinks``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from mltrace.capture.adapter import Adapter, ReductionItems
from mltrace.capture.clock import StepClock
from mltrace.capture.nonfinite_warning import NonFiniteWarning
from mltrace.capture.out_dir import OutDirGuard
from mltrace.capture.plan import what_to_save
from mltrace.collections import (
    METRIC_COLLECTIONS,
    NON_REDUCTION_COLLECTIONS,
    SCALAR_COLLECTIONS,
    Collection,
)
from mltrace.exceptions import MltraceTypeError
from mltrace.format import SCALAR_PREFIX
from mltrace.reductions import COUNT_REDUCTIONS, canonical_name, reduction_tensor_name
from mltrace.storage.base import Storage
from mltrace.writer import TrialWriter
from mltrace.writer.failure_log import FailureLog
from mltrace.writer.tensorboard import TensorBoardWriter

logger = logging.getLogger("mltrace.capture.hook")


class Outputs:
    """The trial writer, the TensorBoard writer and the sinks of one hook.

    Args:
        storage: the trial's storage.
        tensorboard_dir: where TensorBoard summaries go, or None for no export.
        strict: raise a sink's error (otherwise logged once per sink) and skip no odd tensor.
        adapter: turns framework values into host arrays and reductions.
        clock: the hook's step and mode.
        collections_json: the collections file's content, written with the first step.
        guard: the local out_dir's identity (claimed when writing begins).
    """

    def __init__(self, storage: Storage, tensorboard_dir: str | None, strict: bool, adapter: Adapter,
                 clock: StepClock, collections_json: Callable[[], str], guard: OutDirGuard) -> None:
        self.storage = storage
        self.tensorboard_dir = tensorboard_dir
        self.strict = strict
        self._adapter = adapter
        self._clock = clock
        self._collections_json = collections_json
        self.guard = guard
        #: The writers close() closed, for a strict hook's last look at their failures.
        self.closed_writers: tuple[TrialWriter | TensorBoardWriter | None, ...] = ()
        self.writer: TrialWriter | None = None
        self.tensorboard: TensorBoardWriter | None = None
        self.sinks: list[Any] = []
        #: Scalars saved this step (name, value, wall time), written when the step ends.
        self.pending_scalars: list[tuple[str, np.ndarray, float | None]] = []
        self._sink_failures: dict[int, FailureLog] = {}  # id(sink) -> its failures (see log_to_sinks)
        #: Names written in the current step (a tensor is written once per step).
        self.written: set[str] = set()
        #: Reductions started this step (name, items, adapter's handle), written at its end.
        self._reductions: list[tuple[str, ReductionItems, Any]] = []
        self._unsupported: set[str] = set()
        #: (tensor name, reduction items) -> the reductions' tensor names, made once per tensor
        self._reduction_names: dict[tuple[str, tuple[tuple[str, bool], ...]], list[str]] = {}
        #: a step's reductions' record names and which are counts, per list of tensors and items
        self._blocks: dict[tuple[tuple[str, tuple[tuple[str, bool], ...]], ...], tuple[list[str], list[bool]]] = {}
        #: what_to_save of each list of due collections met this step (ids -> answer); cleared
        #: each step, as a collection's configuration may change between steps
        self._what: dict[tuple[int, ...], tuple[bool, bool, ReductionItems]] = {}
        self._collections_written = False
        #: The log's warning when a value written is not finite (once per run; see the module).
        self.nonfinite = NonFiniteWarning()

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self, worker: str, chief: bool) -> None:
        """Start writing as ``worker`` (the chief also owns the shared TensorBoard files)."""
        self.guard.claim()
        self.writer = TrialWriter(self.storage, worker, batch_steps=not self.strict)
        if self.tensorboard_dir:
            self.tensorboard = TensorBoardWriter(self.tensorboard_dir, None if chief else worker)
        self.write_collections()

    def begin_step(self, open_files: bool) -> None:
        """A new step; ``open_files`` if something may be written in it."""
        self.written.clear()
        self._what.clear()
        if self.writer is not None and open_files:
            self._open_step()

    def _open_step(self) -> None:
        assert self.writer is not None
        if not self.writer.step_open:
            clock = self._clock
            self.writer.open_step(clock.step, clock.mode, clock.mode_step)

    def end_step(self) -> None:
        """Write the step's scalars and close its files (the collections file after the first)."""
        if not self._clock.started or self.writer is None:
            return
        if not (self.writer.step_open or self.pending_scalars):
            return  # nothing to write (a quiet step)
        self.write_pending()
        self.nonfinite.end_step(self._clock)
        if self.tensorboard is not None:
            self.tensorboard.end_step()
        if self.writer.close_step() and not self._collections_written:
            self.write_collections()
            self._collections_written = True

    @property
    def pending(self) -> bool:
        """True if the step has something to write or an open file (a quiet step has neither)."""
        return bool(self._reductions or self.pending_scalars or (self.writer is not None and self.writer.step_open))

    def write_pending(self) -> None:
        """Write the step's reductions and scalars into its file, which stays open."""
        if not self._clock.started or self.writer is None:
            return
        self._write_reductions()
        if self.pending_scalars:
            self._open_step()
            for name, value, ts in self.pending_scalars:
                self._write_record(name, value, ts)
                if self.tensorboard is not None:
                    self.tensorboard.add_scalar(self._clock.step_mode, self._clock.step, name,
                                                float(value.reshape(-1)[0]), ts)
            self.pending_scalars.clear()

    def write_records(self, records: Iterable[tuple[str, np.ndarray]]) -> None:
        """Write finished records (the flight recorder's) into the current step, each unless a
        record of that name is in the step already (saved by the step's own collections)."""
        if self.writer is None:
            return
        self._open_step()
        written = self.writer.record_names()
        for name, value in records:
            if name not in written:
                self._write_record(name, value)

    def write_batch(self, records: list[tuple[str, np.ndarray]]) -> None:
        """Write raw host records of the step together (one wall time; see
        mltrace.capture.host_arrays)."""
        self._open_step()
        assert self.writer is not None
        self.writer.add_tensors(records, self._clock.mode, self._clock.mode_step)
        self.nonfinite.check_records(records)

    def write_collections(self) -> None:
        """(Re)write the collections file: tensor names are added to collections as seen."""
        if self.writer is not None:
            self.writer.write_collections(self._collections_json())

    def finish(self, write_end_marker: bool) -> None:
        """Close the writers (``write_end_marker``: the run ended normally)."""
        if self.writer is None:  # never started (leave no files), a dry run, or another worker's
            return
        self.closed_writers = (self.writer, self.tensorboard)
        self.end_step()
        self.nonfinite.summarize()
        self.write_collections()
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if write_end_marker:
            self.writer.write_end_marker()
        self.writer.close()
        self.writer = None

    def flush(self) -> None:
        """Write the collections file and wait until every file written so far is on storage."""
        if self.writer is None:
            return
        self.write_collections()
        self.writer.flush()
        if self.tensorboard is not None:
            self.tensorboard.flush()

    def abandon_if_replaced(self, out_dir: str) -> bool:
        """True if the out_dir was deleted (and maybe made again for another run) since writing
        began: then nothing more is written there, not even the last step or the end marker, so
        another run's trial in that folder stays intact (see mltrace.capture.out_dir)."""
        if self.writer is None or not self.guard.replaced():
            return False
        logger.warning(
            "out_dir %s was deleted or replaced since this hook began writing into it: the hook "
            "writes nothing more there (not its last steps, not the end marker), so another run's "
            "trial in that folder stays intact. Close a hook (hook.close()) before reusing its "
            "out_dir.", out_dir)
        writer, tensorboard = self.writer, self.tensorboard
        self.writer = self.tensorboard = None
        self.pending_scalars.clear()
        writer.discard()
        if tensorboard is not None:
            tensorboard.discard()
        return True

    def raise_write_failure(self, closed: bool = False) -> None:
        """For strict hooks: raise the first file that could not be written since the last look
        (``closed``: by the writers that close() closed)."""
        for writer in self.closed_writers if closed else (self.writer, self.tensorboard):
            failure = writer.failures.take() if writer is not None else None
            if failure is not None:
                raise failure

    # -- tensors --------------------------------------------------------------------------------
    def write_tensor(self, name: str, value: Any, array: np.ndarray | None,
                     colls: Iterable[Collection], on_host: bool = False,
                     to_sinks: bool = True) -> np.ndarray | None:
        """Write the shape, reductions and raw value that ``colls`` ask for; returns the host
        copy made (None if none was needed). A tensor is written once per step. ``to_sinks=False``
        keeps a loss or metric out of the sinks (another logger sends it to the same run)."""
        if self.writer is None or name in self.written:
            return None
        self.written.add(name)
        try:
            return self._write_parts(name, value, array, list(colls), on_host, to_sinks)
        except MltraceTypeError as exc:
            # One odd tensor (say, a quantized dtype) must not stop the others from being saved.
            if self.strict:
                raise
            if name not in self._unsupported:
                self._unsupported.add(name)
                logger.warning("not saving tensor %r: %s", name, exc)
            return None

    def _write_parts(self, name: str, value: Any, array: np.ndarray | None,
                     colls: list[Collection], on_host: bool, to_sinks: bool = True) -> np.ndarray | None:
        key = tuple(map(id, colls))
        what = self._what.get(key)
        if what is None:
            what = self._what[key] = what_to_save(colls)
        save_raw, save_shape, items = what
        self._open_step()
        assert self.writer is not None
        if (save_raw or save_shape) and array is None:
            array = self._adapter.to_numpy(value)
        if save_shape and array is not None:
            self.writer.add_shape(name, array.shape)
        if items:  # computed now, copied to the host with the step's others at its end
            self._reductions.append(
                (name, items, self._adapter.reduce_on_device(array if on_host else value, items)))
        if save_raw and array is not None and array.size:
            self._write_record(name, array)
            if self.sinks and to_sinks and any(c.name in METRIC_COLLECTIONS for c in colls):
                self.log_to_sinks(name, float(np.mean(array)), self._clock.mode_step)
        if self.tensorboard is not None:
            array = self._export_summaries(name, value, array, colls, on_host)
        return array

    def _export_summaries(self, name: str, value: Any, array: np.ndarray | None,
                          colls: list[Collection], on_host: bool) -> np.ndarray | None:
        """TensorBoard scalars (tensors of scalar collections that squeeze to 0-d) and histograms
        (the first due collection with save_histogram), as smdebug exported them."""
        assert self.tensorboard is not None
        scalar, histo = False, None
        for c in colls:  # a loop, not any() and next(): this runs for every tensor saved
            scalar = scalar or c.name in SCALAR_COLLECTIONS
            if histo is None and c.save_histogram and c.name not in NON_REDUCTION_COLLECTIONS:
                histo = c
        mode, step = self._clock.step_mode, self._clock.step
        if histo is not None and not on_host and self._adapter.bins_on_device(value):
            binned = self._adapter.device_histogram(value)  # only the counts leave the device
            if binned is not None:
                self.tensorboard.add_binned_histogram(mode, step, self.tensorboard.histogram_tag(histo.name, name),
                                                      binned)
            histo = None
        if not scalar and histo is None:
            return array
        if array is None:
            array = value if on_host else self._adapter.to_numpy(value)
        host = getattr(array, "to_float32", lambda: array)()  # bfloat16 bits -> their float32 values
        if scalar and host.size == 1 and host.dtype.kind in "biuf":
            self.tensorboard.add_scalar(mode, step, name, float(host.reshape(-1)[0]))
        if histo is not None:
            self.tensorboard.add_histogram(mode, step, self.tensorboard.histogram_tag(histo.name, name), host)
        return array

    def _write_reductions(self) -> None:
        """Write the step's reductions, their results moved to the host together and encoded
        together (one wall time for all; one block where the adapter hands them over as one
        array: mltrace.format.scalar_block)."""
        if not self._reductions:
            return
        started, self._reductions = self._reductions, []
        assert self.writer is not None
        clock = self._clock
        handles = [handle for _, _, handle in started]
        flat = self._adapter.reductions_to_host_flat(handles)
        if flat is not None:
            tags, integer = self._block_names(started)
            if len(tags) == len(flat):
                self.writer.add_scalars(tags, integer, flat, clock.mode, clock.mode_step)
                self.nonfinite.check_block(started, integer, flat)
                return
        results = self._adapter.reductions_to_host(handles)
        records = []
        for (name, items, _), values in zip(started, results):
            tags = self._tags_of(name, items)
            records += [(tag, result) for tag, result in zip(tags, values) if result is not None]
        self.writer.add_tensors(records, clock.mode, clock.mode_step)
        self.nonfinite.check_records(records)

    def _tags_of(self, name: str, items: ReductionItems) -> list[str]:
        """The record names of ``name``'s reductions ``items``."""
        key = (name, tuple(items))
        tags = self._reduction_names.get(key)
        if tags is None:
            tags = self._reduction_names[key] = [reduction_tensor_name(name, red, abs_) for red, abs_ in items]
        return tags

    def _block_names(self, started: list[tuple[str, ReductionItems, Any]]) -> tuple[list[str], list[bool]]:
        """The record names of a step's reductions, in order, and which of them are counts
        (int64 records); the same every step of a job, so kept per list of tensors and items."""
        key = tuple((name, tuple(items)) for name, items, _ in started)
        found = self._blocks.get(key)
        if found is None:
            if len(self._blocks) >= 16:
                self._blocks.clear()
            tags = [tag for name, items, _ in started for tag in self._tags_of(name, items)]
            integer = [canonical_name(red) in COUNT_REDUCTIONS for _, items, _ in started for red, _ in items]
            found = self._blocks[key] = (tags, integer)
        return found

    def _write_record(self, name: str, array: np.ndarray, wall_time: float | None = None) -> None:
        assert self.writer is not None
        self.writer.add_tensor(name, array, self._clock.mode, self._clock.mode_step, wall_time)
        self.nonfinite.check(name, array)

    # -- sinks ----------------------------------------------------------------------------------
    def add_sinks(self, sinks: dict[str, dict[str, Any]], hook: Any) -> None:
        """Create the tracking sinks named in ``sinks`` (name -> options) through the plugin
        registry (the MLflow sink lives in mltrace_mlflow, which core does not name)."""
        from mltrace import plugins  # entry points are read only by hooks that log somewhere

        self.sinks.extend(plugins.create_sink(name, hook, dict(options)) for name, options in sinks.items())

    def save_scalar(self, name: str, array: np.ndarray, timestamp: float | None) -> None:
        """Keep a one-element ``array`` as ``scalar/<name>`` for the step's end, and hand it to
        the sinks now (at the current mode's step; 0 before the first)."""
        self.pending_scalars.append((SCALAR_PREFIX + name, array, timestamp))
        if self.sinks:
            self.log_to_sinks(name, float(array.reshape(-1)[0]), max(self._clock.mode_step, 0))

    def log_to_sinks(self, name: str, value: float, mode_step: int) -> None:
        """Hand a scalar to every sink. A sink that raises is the sink's problem, not the
        trial's: its first error is logged, the rest are counted (summed up at close), it is
        called again next time, and tensors are saved as usual; strict hooks re-raise."""
        for sink in self.sinks:
            try:
                sink.log_scalar(name, value, self._clock.mode, mode_step)
            except Exception as exc:
                if self.strict:
                    raise
                failures = self._sink_failures.get(id(sink))
                if failures is None:
                    failures = self._sink_failures[id(sink)] = FailureLog(
                        logger, "the trial is still saved; pass strict=True to raise instead",
                        "errors of this sink")
                failures.record(f"sink {sink!r} failed to log {name!r}: {type(exc).__name__}: {exc}")

    def close_sinks(self) -> Exception | None:
        """Close every sink, each even if another fails; return the first error (logged)."""
        first: Exception | None = None
        for sink in self.sinks:
            failures = self._sink_failures.get(id(sink))
            if failures is not None:
                failures.summarize(f"sink {sink!r} failed {{count}} times during the run")
            try:
                sink.close()
            except Exception as exc:
                logger.error("sink %s failed at close: %s", sink, exc)
                first = first or exc
        return first
