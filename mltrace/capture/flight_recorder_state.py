"""The flight recorder's state (mltrace.capture.flight_recorder): a recorded step as it is kept,
the attributes every part of the recorder shares, and how a kept step is read back.

A step keeps its tensors' reductions as the adapter's handles until a check or a write needs
them on the host; :meth:`RecorderState._records` turns it into the (name, value) pairs the hook
writes for a saved step, so a dumped step reads like any other.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mltrace.capture.adapter import ReductionItems
from mltrace.capture.recorder_config import FlightRecorderConfig, entry_bytes
from mltrace.capture.recording_adapter import RecordingAdapter, StepCopies
from mltrace.collections import Collection
from mltrace.format.flight_record import Dump, FirstNonFinite, FlightRecord
from mltrace.modes import ModeKeys
from mltrace.reductions import reduction_tensor_name

#: a non-finite value of either reduction means the tensor held a NaN or an infinity (min and
#: max propagate NaN); every recorded tensor keeps both
CHECK_ITEMS = (("min", False), ("max", False))
SCALAR_ITEMS: ReductionItems = [("mean", False)]
_COUNTS = ("nan_count", "inf_count")
#: how a recorded tensor is kept (see RecorderKeep._kind): its reductions alone, with a raw
#: copy, as a scalar collection's value, as a loss (a scalar watched for spikes), whole (a
#: small tensor of the ``samples`` collection: its values alone, no reductions)
PLAIN, RAW, SCALAR, LOSS, WHOLE = "plain", "raw", "scalar", "loss", "whole"
UNKNOWN = "unknown"  # not looked up yet


@dataclass(slots=True)
class RecordedTensor:
    """One recorded tensor of one step."""

    name: str
    items: ReductionItems
    scalar: bool  # a scalar collection's one-element tensor: its value is written raw
    offset: int  # where its reductions start in the step's flat array
    shape: tuple[int, ...] = ()
    dtype: Any = None
    raw: Any = None  # the adapter's snapshot, when raw copies are kept


@dataclass(slots=True)
class RecordedStep:
    """One recorded step: its tensors, their reductions' handles and what it takes in memory."""

    step: int
    mode: ModeKeys
    mode_step: int
    wall_time: float
    #: in the order they came: a plain tensor (the recorder's reductions, no raw copy) by its
    #: name alone, anything else as a RecordedTensor; :meth:`RecorderState._layout` makes all
    #: RecordedTensors
    tensors: list[RecordedTensor | str] = field(default_factory=list)
    #: the adapter's handles of the tensors' reductions (on their device until moved)
    started: list[Any] = field(default_factory=list)
    size: int = 0  # reductions so far
    #: a prefix of tensors whose non-finite values are expected this step (a loss scaler
    #: skipped the step because of them)
    excused: str | None = None
    #: the losses (watched for spikes) and their handles, read at the step's end
    losses: list[tuple[RecordedTensor, Any]] = field(default_factory=list)
    #: tensors kept whole, (name, the adapter's snapshot), apart from the reductions: their
    #: values are written as they are, and the non-finite check does not read them
    whole: list[tuple[str, Any]] = field(default_factory=list)
    nbytes: int = 0
    flat: np.ndarray | None = None  # every reduction of the step, on the host, once moved
    saved: bool = False  # written by the hook itself (with these records): never by a dump


class RecorderState:
    """What every part of the flight recorder shares, set up from its arguments (see
    :class:`mltrace.capture.flight_recorder.FlightRecorder`), and the reading of a kept step."""

    def __init__(self, config: FlightRecorderConfig, adapter: RecordingAdapter, worker: str = "worker_0") -> None:
        self.config = config
        self.adapter = adapter
        self.worker = worker
        self.items = config.items
        self._check_positions = [i for i, item in enumerate(self.items) if item in CHECK_ITEMS]
        reduce = adapter.reducer(self.items)
        # the copies of the ring's steps get at most half the budget; raw=True keeps its own
        self._copies: StepCopies | None = None if config.raw else adapter.step_copies(
            self.items, config.steps, config.memory_budget // 2, config.nonfinite)
        self._reduce = self._copies.reducer(reduce) if self._copies is not None else reduce
        self._pack = self._copies.pack if self._copies is not None else adapter.pack_reductions
        self._reduce_scalar = adapter.reducer(SCALAR_ITEMS)
        self._width = len(self.items)
        self._tensor_bytes = entry_bytes(self._width)
        #: the recorded collections, resolved by ``resolve`` when the hook prepares
        self.collections: frozenset[Collection] = frozenset()
        #: the collections a tensor name belongs to (the hook's plan sets it; see ``keep``)
        self.collections_of: Callable[[str], Iterable[Collection]] = lambda name: ()
        self._how: dict[str, str | None] = {}  # name -> how keep() keeps it (see _kind)
        self._membership = 0  # see begin_step
        self.enabled = True
        self.ring: deque[RecordedStep] = deque()
        self._kinds: dict[str, tuple[Any, str | None]] = {}  # name -> _kind(its colls)
        self._steps_bytes = 0  # what the ring's steps take (their copies' slots come on top)
        self.current: RecordedStep | None = None
        self.record = FlightRecord(worker)
        self._losses: dict[tuple[str, ModeKeys], deque[float]] = {}
        self._armed = True  # the non-finite trigger (disarmed after firing until a finite step)
        self._pending: tuple[str, str] | None = None  # (trigger, reason) to dump at the step's end
        self._after_left = 0
        self._dump: Dump | None = None  # the dump whose after-steps are being written
        self._first: FirstNonFinite | None = None
        self._last: RecordedStep | None = None  # the step that ended last
        self._record_changed = False
        self._spike_quiet_until = -1
        self._warned_budget = False
        #: called after each dump with the record and the dump (the hook tells its sinks)
        self.on_dump: Callable[[FlightRecord, Dump], None] = lambda record, dump: None
        #: called once a dump is complete: its ``after_steps`` steps written and the record
        #: rewritten with them (the hook diagnoses its trial then)
        self.on_dump_complete: Callable[[FlightRecord, Dump], None] = lambda record, dump: None
        self._lock = threading.RLock()  # the excepthook may trigger from another thread

    def _to_host(self, step: RecordedStep) -> np.ndarray:
        """The step's reductions on the host, moved in one copy (per device) the first time."""
        if step.flat is None:
            step.flat = self.adapter.reductions_to_flat(step.started) if step.started else np.zeros(0)
            step.started = []
        return step.flat

    def _layout(self, step: RecordedStep) -> list[RecordedTensor]:
        """The step's tensors as RecordedTensors, a plain tensor's made here at the offset its
        place in the step gives it (when a check fails or the step is written; kept in the step)."""
        layout: list[RecordedTensor] = []
        offset = 0
        for entry in step.tensors:
            tensor = RecordedTensor(entry, self.items, False, offset) if isinstance(entry, str) else entry
            layout.append(tensor)
            offset += len(tensor.items)
        step.tensors = list(layout)
        return layout

    def _records(self, step: RecordedStep) -> list[tuple[str, np.ndarray]]:
        """The (record name, value) pairs of a step, as the hook writes reductions and raw values."""
        flat = self._to_host(step)
        out: list[tuple[str, np.ndarray]] = []
        for tensor in self._layout(step):
            if tensor.scalar:
                out.append((tensor.name, np.asarray(flat[tensor.offset]).astype(
                    _numpy_dtype(tensor.dtype)).reshape(tensor.shape)))
                continue
            if tensor.raw is not None:
                out.append((tensor.name, self.adapter.to_numpy(tensor.raw)))
            for i, (red, abs_) in enumerate(tensor.items):
                value = flat[tensor.offset + i]
                out.append((reduction_tensor_name(tensor.name, red, abs_),
                            np.asarray(np.int64(value) if red in _COUNTS else np.float64(value))))
        out.extend((name, self.adapter.to_numpy(snapshot)) for name, snapshot in step.whole)
        return out


def _numpy_dtype(dtype: Any) -> Any:
    try:
        return np.dtype(dtype)
    except TypeError:
        return np.float64
