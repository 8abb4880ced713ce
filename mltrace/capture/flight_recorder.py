"""The flight recorder: the last N steps of chosen collections kept in memory, written to the
trial when something goes wrong.

A run that saves every 500 steps holds steps 12,000 and 12,500 when its loss turns NaN at 12,345.
With a recorder, every step's reductions of the recorded collections (and raw values where asked)
are computed where the tensors live and kept in a ring of at most ``steps`` steps within a memory
budget. A trigger (a non-finite value, a loss spike, a rule's request, an exception escaping the
training step, or ``hook.dump_flight_recorder(reason)``) writes the ring to the trial as ordinary
steps, keeps writing the next ``after_steps`` steps at full resolution, and records why (see
mltrace.format.flight_record), including the first tensor in execution order that was not finite.

Costs per recorded tensor and step: the reductions (a few device ops, nothing waits for them), or
where the framework has a ring of copies (PyTorch: mltrace.pytorch.copy_ring) and the copies of
the ring's steps fit in half the budget, one copy, reduced only when the step is read; per step:
one device-to-host copy for the non-finite check and the loss spike (with copies: a sum over
them and the other reductions, and the losses' values apart), none otherwise until a dump.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from mltrace.capture.adapter import Adapter, ReductionItems
from mltrace.capture.recorder_config import (
    FlightRecorderConfig,
    check_collections,
    entry_bytes,
)
from mltrace.collections import SCALAR_COLLECTIONS, Collection, CollectionKeys
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.format.flight_record import Dump, FirstNonFinite, FlightRecord, record_key
from mltrace.modes import ModeKeys
from mltrace.reductions import all_finite, reduction_tensor_name

if TYPE_CHECKING:
    from mltrace.writer import TrialWriter

logger = logging.getLogger("mltrace.flight_recorder")

#: a non-finite value of either reduction means the tensor held a NaN or an infinity (min and
#: max propagate NaN); every recorded tensor keeps both
_CHECK_ITEMS = (("min", False), ("max", False))
_SCALAR_ITEMS: ReductionItems = [("mean", False)]
_COUNTS = ("nan_count", "inf_count")
#: how a recorded tensor is kept (FlightRecorder._kind): its reductions alone, with a raw copy,
#: as a scalar collection's value, as a loss (a scalar watched for spikes)
_PLAIN, _RAW, _SCALAR, _LOSS = "plain", "raw", "scalar", "loss"
_UNKNOWN = "unknown"  # not looked up yet


@dataclass(slots=True)
class _Tensor:
    """One recorded tensor of one step."""

    name: str
    items: ReductionItems
    scalar: bool  # a scalar collection's one-element tensor: its value is written raw
    offset: int  # where its reductions start in the step's flat array
    shape: tuple[int, ...] = ()
    dtype: Any = None
    raw: Any = None  # the adapter's snapshot, when raw copies are kept


@dataclass(slots=True)
class _Step:
    step: int
    mode: ModeKeys
    mode_step: int
    wall_time: float
    #: in the order they came: a plain tensor (the recorder's reductions, no raw copy) by its
    #: name alone, anything else as a _Tensor; :meth:`FlightRecorder._layout` makes all _Tensors
    tensors: list[_Tensor | str] = field(default_factory=list)
    #: the adapter's handles of the tensors' reductions (on their device until moved)
    started: list[Any] = field(default_factory=list)
    size: int = 0  # reductions so far
    #: a prefix of tensors whose non-finite values are expected this step (a loss scaler
    #: skipped the step because of them)
    excused: str | None = None
    #: the losses (watched for spikes) and their handles, read at the step's end
    losses: list[tuple[_Tensor, Any]] = field(default_factory=list)
    nbytes: int = 0
    flat: np.ndarray | None = None  # every reduction of the step, on the host, once moved
    saved: bool = False  # written by the hook itself (with these records): never by a dump


class FlightRecorder:
    """The ring of recorded steps of one hook, its triggers and its dumps (see module docstring).

    The hook calls :meth:`begin_step`, :meth:`observe` for each tensor of a recorded collection,
    :meth:`end_step` once the step's own files are written, and :meth:`trigger` for triggers that
    come from outside the step (a rule's request, an exception, the user).

    Args:
        config: what to keep and when to dump.
        adapter: the framework's reductions and copies.
        worker: this process's worker name (in the record file).
    """

    def __init__(self, config: FlightRecorderConfig, adapter: Adapter, worker: str = "worker_0") -> None:
        self.config = config
        self.adapter = adapter
        self.worker = worker
        self.items = config.items
        self._check_positions = [i for i, item in enumerate(self.items) if item in _CHECK_ITEMS]
        reduce = adapter.reducer(self.items)
        # the copies of the ring's steps get at most half the budget; raw=True keeps its own
        self._copies = None if config.raw else adapter.step_copies(
            self.items, config.steps, config.memory_budget // 2, config.nonfinite)
        self._reduce = self._copies.reducer(reduce) if self._copies is not None else reduce
        self._pack = self._copies.pack if self._copies is not None else adapter.pack_reductions
        self._reduce_scalar = adapter.reducer(_SCALAR_ITEMS)
        self._width = len(self.items)
        self._tensor_bytes = entry_bytes(self._width)
        #: the recorded collections, resolved by :meth:`resolve` when the hook prepares
        self.collections: frozenset[Collection] = frozenset()
        #: the collections a tensor name belongs to (the hook's plan sets it; see :meth:`keep`)
        self.collections_of: Callable[[str], Iterable[Collection]] = lambda name: ()
        self._how: dict[str, str | None] = {}  # name -> how keep() keeps it (see _kind)
        self._membership = 0  # see begin_step
        self.enabled = True
        self.ring: deque[_Step] = deque()
        self._kinds: dict[str, tuple[Any, str | None]] = {}  # name -> _kind(its colls)
        self._steps_bytes = 0  # what the ring's steps take (their copies' slots come on top)
        self.current: _Step | None = None
        self.record = FlightRecord(worker)
        self._losses: dict[tuple[str, ModeKeys], deque[float]] = {}
        self._armed = True  # the non-finite trigger (disarmed after firing until a finite step)
        self._pending: tuple[str, str] | None = None  # (trigger, reason) to dump at the step's end
        self._after_left = 0
        self._dump: Dump | None = None  # the dump whose after-steps are being written
        self._first: FirstNonFinite | None = None
        self._last: _Step | None = None  # the step that ended last
        self._record_changed = False
        self._spike_quiet_until = -1
        self._warned_budget = False
        #: called after each dump with the record and the dump (the hook tells its sinks)
        self.on_dump: Callable[[FlightRecord, Dump], None] = lambda record, dump: None
        self._lock = threading.RLock()  # the excepthook may trigger from another thread

    @property
    def ring_bytes(self) -> int:
        """The memory the recorder holds: its ring's steps and the slots of its copies."""
        return self._steps_bytes + (self._copies.nbytes if self._copies is not None else 0)

    # -- set-up ---------------------------------------------------------------------------------
    def resolve(self, saved: Iterable[Collection], known: Mapping[str, Collection]) -> list[Collection]:
        """The recorded collections: those named in the config, else the saved ones.

        Raises:
            MltraceValueError: a named collection the hook does not have.
        """
        names = self.config.collections
        if names is None:
            colls = list(saved)
        else:
            check_collections(names, known)
            colls = [known[n] for n in names]
        self.collections = frozenset(colls)
        self._how.clear()
        return colls

    def check_budget(self, tensors: Iterable[tuple[str, int]],
                     member: Callable[[str], bool]) -> None:
        """Raise if the tensors known before training (a model's parameters and gradients:
        (name, bytes)) that the recorder would keep already take more than the budget per step.

        Raises:
            MltraceValueError: naming the bytes one step needs, the budget and the fixes.
        """
        sizes = [nbytes for name, nbytes in tensors if member(name)]
        need = self.config.step_bytes(sizes)
        if need > self.config.memory_budget:
            raise MltraceValueError(
                f"FlightRecorderConfig(memory_budget={self.config.memory_budget}) cannot hold one "
                f"step: the {len(sizes)} parameters and gradients it records take {need} bytes per "
                f"step ({'raw copies and ' if self.config.raw else ''}{len(self.items)} reductions "
                f"each), more with activations. Raise memory_budget to at least "
                f"{need * self.config.steps} for {self.config.steps} steps, record fewer "
                "collections" + (", or pass raw=False" if self.config.raw else ""))

    # -- each step ------------------------------------------------------------------------------
    def begin_step(self, step: int, mode: ModeKeys, mode_step: int, membership: int = 0) -> None:
        """Start recording ``step``. ``membership`` changes when the collections' memberships
        do (the hook's plan counts them): :meth:`keep` then looks its names up again."""
        self.current = _Step(step, mode, mode_step, time.time()) if self.enabled else None
        if membership != self._membership:
            self._how.clear()
            self._membership = membership

    def records(self, colls: Iterable[Collection]) -> bool:
        """True if a tensor of ``colls`` is recorded this step."""
        return self.current is not None and any(c in self.collections for c in colls)

    def observe(self, name: str, value: Any, colls: Iterable[Collection]) -> None:
        """:meth:`keep`, with ``name``'s collections given (the hook's saving path has them):
        they are the plan's latest, so they also decide how :meth:`keep` keeps the name."""
        if self.current is None:
            return
        kind = self._kinds.get(name)
        if kind is None or kind[0] is not colls:  # the plan memoizes colls per name
            kind = self._kinds[name] = self._kind(colls)
        self._how[name] = kind[1]
        self.keep(name, value)

    def keep(self, name: str, value: Any) -> None:
        """Keep ``value``'s reductions (and a copy, if raw) for the current step, if a recorded
        collection holds ``name`` (looked up with ``collections_of``). Whatever reads ``value``
        happens now (it may change later). A framework callback calls this directly on a step
        that only records (see ``Hook.recording_only``), skipping the hook's saving path.

        It runs for every recorded tensor of every step, so a plain tensor's way is written out
        here (each Python call costs about a microsecond in place, next to a few for the
        reductions themselves), and how a name is kept is remembered until memberships change
        (see :meth:`begin_step`; a change within a step counts from the next)."""
        step = self.current
        if step is None:
            return
        how = self._how.get(name, _UNKNOWN)
        if how is not _PLAIN:  # most tensors are plain ones: their way first
            how = self._other_kind(step, name, value, how)
            if how is None:
                return
        try:
            started = self._reduce(value)  # None: not a value the recorder can keep
        except MltraceTypeError as exc:  # e.g. a quantized tensor: not recorded, said once
            self.adapter.warn_once(f"recorder:{name}", "flight recorder: not recording %s: %s", name, exc)
            return
        if started is None:
            return
        if how is _PLAIN:
            step.started.append(started)
            step.tensors.append(name)
            step.size += self._width
            step.nbytes += self._tensor_bytes
        else:
            self._keep_reductions(step, name, started, self.adapter.snapshot(value))

    def _other_kind(self, step: _Step, name: str, value: Any, how: str | None) -> str | None:
        """:meth:`keep` for a name not known as plain: looks it up (``_UNKNOWN``) and keeps a
        scalar collection's value or a loss; the way left to :meth:`keep` (plain, or raw), or
        None when nothing more is to be done."""
        if how is _UNKNOWN:
            how = self._how[name] = self._kind(self.collections_of(name))[1]
        if how is _SCALAR or how is _LOSS:
            if self.adapter.recordable(value):
                self._observe_scalar(step, name, value, how is _LOSS)
            return None
        return how

    def _keep_reductions(self, step: _Step, name: str, started: Any, raw: Any = None) -> None:
        """Add a tensor's reductions (the adapter's handle ``started``) and its raw copy, if
        any, to ``step``."""
        step.tensors.append(_Tensor(name, self.items, False, step.size, raw=raw))
        step.started.append(started)
        step.size += self._width
        step.nbytes += self._tensor_bytes + (self.adapter.nbytes(raw) if raw is not None else 0)

    def excuse_gradients(self, prefix: str) -> None:
        """Non-finite values of the current step's tensors named ``prefix...`` are expected
        (mixed precision: the loss scaler found them and skipped the optimizer step), so they
        trigger no dump; the step is still recorded as it was."""
        if self.current is not None:
            self.current.excused = prefix

    def _observe_scalar(self, step: _Step, name: str, value: Any, loss: bool) -> None:
        """A scalar collection's tensor: one element is kept as its value (written raw, with its
        shape and dtype); more are reduced like any tensor."""
        shape, dtype = self.adapter.shape_and_dtype(value)
        if not all(d == 1 for d in shape):
            self._keep_reductions(step, name, self._reduce(value))
            return
        tensor = _Tensor(name, _SCALAR_ITEMS, True, step.size, shape, dtype)
        started = self._reduce_scalar(value)
        step.tensors.append(tensor)
        step.started.append(started)
        if loss:
            step.losses.append((tensor, started))
        step.size += 1
        step.nbytes += entry_bytes(1)

    def _kind(self, colls: Any) -> tuple[Any, str | None]:
        """(colls, how a tensor of ``colls`` is kept: None if it is not recorded)."""
        recorded = [c for c in colls if c in self.collections]
        if not recorded:
            return colls, None
        if any(c.name == CollectionKeys.LOSSES for c in recorded):
            return colls, _LOSS
        if any(c.name in SCALAR_COLLECTIONS for c in recorded):
            return colls, _SCALAR
        return colls, _RAW if self.config.raw else _PLAIN

    def end_step(self, write_current: Callable[[list[tuple[str, np.ndarray]]], None],
                 saved: bool = False) -> None:
        """Close the current step: check it (non-finite values, a loss spike), then either write
        it with ``write_current`` (into the step's own file, still open) because a trigger is
        pending or the step is one of those after a trigger, or keep it in the ring. The ring is
        written by :meth:`dump_pending`, once the step's file is closed. A step the hook saves
        itself (``saved``) gets its records now and is kept in the ring as written already: a
        dump rewriting its file would lose what the hook saved there."""
        step, self.current = self.current, None
        if step is None:
            return
        with self._lock:
            self._last = step
            config = self.config
            spikes = config.loss_spike is not None
            if step.started:
                step.started = self._pack(step.started)
            losses = self._loss_values(step) if spikes else None
            if config.nonfinite or spikes:
                first = self._check_nonfinite(step) if config.nonfinite else None
                spike = self._check_loss_spike(step, losses) if losses else None
                if first is not None and self._armed:
                    self._armed = False
                    self._request("nonfinite", f"{first.tensor} held a NaN or an infinity at step "
                                  f"{first.step}", first)
                elif spike is not None and step.step >= self._spike_quiet_until:
                    if self._request("loss_spike", spike):
                        # the loss takes a while to settle after a spike: one dump per spike
                        self._spike_quiet_until = step.step + self.config.loss_window
            keep = self._after_left > 0 or self._pending is not None
            if keep or saved:
                write_current(self._records(step))
            if not keep:
                step.saved = saved
                self._push(step)
            elif self._pending is None and self._dump is not None:
                self._dump.steps_after.append(step.step)
                self._after_left -= 1
                self._record_changed = True

    def dump_pending(self, writer: TrialWriter | None) -> bool:
        """Between steps (no step file open): write the ring's steps if a trigger is pending, and
        the record file if it changed; True if a dump happened."""
        if self._pending is None and not self._record_changed:
            return False  # most steps (read without the lock: a trigger it misses waits a step)
        with self._lock:
            if writer is None:
                return False
            if self._pending is None:
                if self._record_changed and self._after_left == 0:
                    self.write_record(writer)
                    if len(self.record.dumps) >= self.config.max_dumps:
                        # nothing more can be dumped: stop paying for the recording
                        self._stop_recording()
                        logger.warning("flight recorder: stops recording after %d dumps (max_dumps)",
                                       len(self.record.dumps))
                return False
            (kind, reason), first = self._pending, self._first
            self._pending = self._first = None
            at = self._last or _Step(-1, ModeKeys.GLOBAL, -1, time.time())
            before = [s for s in self._write_ring(writer) if s != at.step]
            dump = Dump(kind, reason, at.step, at.mode.name, at.mode_step, time.time(), before, [],
                        first)
            self.record.dumps.append(dump)
            if first is not None and self.record.first_nonfinite is None:
                self.record.first_nonfinite = first
            self._dump, self._after_left = dump, self.config.after_steps
            self.write_record(writer)
            log = logger.error if kind in ("nonfinite", "exception") else logger.warning
            log("flight recorder: %s at step %s (%s): wrote the %d steps before it; the next %d "
                "steps are written at full resolution%s", kind, at.step, reason, len(before),
                self.config.after_steps,
                f". First non-finite tensor: {first.tensor} ({first.phase}, tensor "
                f"{first.position} of step {first.step}, {first.worker})" if first else "")
            self.on_dump(self.record, dump)
            return True

    def trigger(self, kind: str, reason: str) -> bool:
        """Ask for a dump at the end of the current step (a rule's request, an exception, the
        user); False if the run has had its ``max_dumps`` already."""
        with self._lock:
            return self._request(kind, reason, None)

    def write_record(self, writer: TrialWriter) -> None:
        """(Re)write this worker's record file (at a dump, after its after-steps, at close)."""
        self._record_changed = False
        if self.record.dumps:
            writer.write_file(record_key(self.worker), self.record.to_json())

    # -- inside ---------------------------------------------------------------------------------

    def _request(self, kind: str, reason: str, first: FirstNonFinite | None = None) -> bool:
        if self._after_left > 0 and self._pending is None and self._dump is not None:
            # The steps after a dump are being written at full resolution already: a trigger
            # now (a loss spike's aftermath, the NaN that followed it) adds no dump.
            if first is not None and self.record.first_nonfinite is None:
                self.record.first_nonfinite = first
                self.record.dumps[-1] = self._dump = replace(self._dump, first_nonfinite=first)
                self._record_changed = True
                logger.error("flight recorder: first non-finite tensor: %s (%s, tensor %d of step "
                             "%d, %s), in the steps written after the %s dump", first.tensor,
                             first.phase, first.position, first.step, first.worker,
                             self._dump.trigger)
            logger.info("flight recorder: %s (%s) while writing the steps after a dump", kind, reason)
            return False
        if len(self.record.dumps) + (self._pending is not None) >= self.config.max_dumps:
            logger.warning("flight recorder: not dumping for %s (%s): this run dumped %d times "
                           "already (max_dumps)", kind, reason, self.config.max_dumps)
            return False
        if self._pending is None:
            self._pending, self._first = (kind, reason), first
        elif first is not None and self._first is None:
            self._first = first
        return True

    def _to_host(self, step: _Step) -> np.ndarray:
        """The step's reductions on the host, moved in one copy (per device) the first time."""
        if step.flat is None:
            step.flat = self.adapter.reductions_to_flat(step.started) if step.started else np.zeros(0)
            step.started = []
        return step.flat

    def _check_nonfinite(self, step: _Step) -> FirstNonFinite | None:
        # Every reduction finite means every tensor is (each has its min and max among them).
        # Most steps end here, so this takes one copy and no numpy call (the first numpy call
        # of a step costs ~9 us on a CPU after the training step has run: measured).
        if step.flat is not None:
            finite = all_finite(step.flat.tolist())
        else:  # a step that recorded nothing is finite
            finite = not step.started or self.adapter.reductions_finite(step.started)
        if finite:
            self._armed = True
            return None
        flat = self._to_host(step)
        bad = []
        for position, tensor in enumerate(self._layout(step)):
            if step.excused is not None and tensor.name.startswith(step.excused):
                continue
            checked = [tensor.offset] if tensor.scalar else [tensor.offset + i for i in self._check_positions]
            if not np.isfinite(flat[checked]).all():
                bad.append((position, tensor.name))
        if not bad:  # only a std, a norm or the sum overflowed, or excused gradients
            self._armed = True
            return None
        position, name = bad[0]
        return FirstNonFinite(name, step.step, step.mode.name, step.mode_step, self.worker,
                              self.adapter.tensor_phase(name), position, [n for _, n in bad[:20]])

    def _loss_values(self, step: _Step) -> list[tuple[str, float]]:
        """The step's losses read on the host. Without copies the whole step is moved (one
        copy, which the non-finite check then reads too); with copies that would compute every
        reduction of the step, so the losses' own handles are read (one small copy)."""
        losses, step.losses = step.losses, []
        if not losses:
            return []
        if self._copies is None:
            flat = self._to_host(step)
            return [(tensor.name, float(flat[tensor.offset])) for tensor, _ in losses]
        values = self.adapter.reductions_to_flat([started for _, started in losses])
        return [(tensor.name, float(value)) for (tensor, _), value in zip(losses, values.tolist())]

    def _check_loss_spike(self, step: _Step, losses: list[tuple[str, float]]) -> str | None:
        limit = self.config.loss_spike
        if limit is None:
            return None
        found = None
        for name, value in losses:
            # per mode: an evaluation's loss is not a spike of the training loss
            history = self._losses.setdefault((name, step.mode), deque(maxlen=self.config.loss_window))
            if len(history) == history.maxlen and np.isfinite(value):
                median = statistics.median(history)
                if median > 0 and value > limit * median and found is None:
                    found = (f"{name}={value:.6g} at step {step.step} is above {limit:g} x "
                             f"its median {median:.6g} over the last {len(history)} steps")
            if np.isfinite(value):
                history.append(value)
        return found

    def _push(self, step: _Step) -> None:
        budget = self.config.memory_budget
        if step.nbytes > budget:
            if not self._warned_budget:
                self._warned_budget = True
                logger.error(
                    "flight recorder turned off: one step takes %d bytes, above "
                    "FlightRecorderConfig(memory_budget=%d); raise the budget (for %d steps: %d) or "
                    "record fewer collections%s", step.nbytes, budget, self.config.steps,
                    step.nbytes * self.config.steps, " or pass raw=False" if self.config.raw else "")
            self._stop_recording()
            return
        self.ring.append(step)
        self._steps_bytes += step.nbytes
        budget -= self._copies.nbytes if self._copies is not None else 0
        while len(self.ring) > self.config.steps or self._steps_bytes > budget:
            self._steps_bytes -= self.ring.popleft().nbytes

    def _stop_recording(self) -> None:
        """Record nothing more and free the ring (the hook's callbacks skip steps again)."""
        self.enabled = False
        self.ring.clear()
        self._steps_bytes = 0
        if self._copies is not None:
            self._copies.release()

    def _write_ring(self, writer: TrialWriter) -> list[int]:
        steps, self.ring = list(self.ring), deque()
        self._steps_bytes = 0
        written = []
        for step in steps:
            if step.saved:  # in the trial already, with its records
                written.append(step.step)
                continue
            self._to_host(step)
            writer.open_step(step.step, step.mode, step.mode_step)
            for name, array in self._records(step):
                writer.add_tensor(name, array, step.mode, step.mode_step, step.wall_time)
            if writer.close_step():
                written.append(step.step)
        return written

    def _layout(self, step: _Step) -> list[_Tensor]:
        """The step's tensors as _Tensors, a plain tensor's made here at the offset its place in
        the step gives it (when a check fails or the step is written; kept in the step)."""
        layout: list[_Tensor] = []
        offset = 0
        for entry in step.tensors:
            tensor = _Tensor(entry, self.items, False, offset) if isinstance(entry, str) else entry
            layout.append(tensor)
            offset += len(tensor.items)
        step.tensors = list(layout)
        return layout

    def _records(self, step: _Step) -> list[tuple[str, np.ndarray]]:
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
        return out


def _numpy_dtype(dtype: Any) -> Any:
    try:
        return np.dtype(dtype)
    except TypeError:
        return np.float64
