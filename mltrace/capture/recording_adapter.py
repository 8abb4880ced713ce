"""What the flight recorder asks of a framework, beyond the capture core's protocol.

An adapter whose hook can run a flight recorder (mltrace.capture.flight_recorder) subclasses
:class:`RecordingAdapter` instead of :class:`~mltrace.capture.adapter.Adapter`. The recorder keeps
a ring of the last steps' reductions (or copies) of the tensors it records, checks each step for
non-finite values, and dumps the ring when something goes wrong; it needs to know which values
it can keep, how to reduce them without holding the framework's lock on the device, how to keep
a step's results in few objects, and their shapes and sizes. The defaults fit host (numpy)
values, as the core protocol's do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from mltrace.capture.adapter import Adapter, ReductionItems
from mltrace.collections import GRADIENT_PREFIX
from mltrace.reductions import all_finite


class StepCopies(Protocol):
    """A framework's ring of step copies for the flight recorder (:meth:`RecordingAdapter.step_copies`):
    a recorded tensor is copied into a preallocated slot and reduced only when its step is read.
    The handles it makes are read by the adapter's :meth:`RecordingAdapter.reductions_finite` and
    :meth:`RecordingAdapter.reductions_to_flat`, as the reducer's are."""

    nbytes: int  # what its slots take

    def reducer(self, fallback: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """The per-tensor call: a copy's handle, or ``fallback(value)``."""

    def pack(self, started: list[Any]) -> list[Any]:
        """Close a step whose handles are ``started`` (in place of ``pack_reductions``)."""

    def release(self) -> None:
        """Copy nothing more and free the slots."""


class RecordingAdapter(Adapter):
    """An adapter the flight recorder can record through (defaults: numpy values)."""

    def reducer(self, items: ReductionItems) -> Callable[[Any], Any]:
        """The flight recorder's per-tensor call: ``reduce_on_device(value, items)`` for a value
        it can keep (:meth:`recordable`), None for one it cannot. An adapter may return a faster
        equivalent decided once for ``items`` (it runs for every recorded tensor of every
        step)."""
        return lambda value: self.reduce_on_device(value, items) if self.recordable(value) else None

    def recordable(self, value: Any) -> bool:
        """True if the flight recorder can keep ``value`` (its reductions need no collective)."""
        return True

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        """``value``'s shape and its numpy dtype (or the framework's, where numpy has none),
        read without copying it."""
        array = np.asarray(value) if not hasattr(value, "shape") else value
        return tuple(int(s) for s in array.shape), getattr(array, "dtype", np.float64)

    def snapshot(self, value: Any) -> Any:
        """A copy of ``value`` that later changes to it do not reach, kept where it lives (the
        recorder's raw copies); :meth:`to_numpy` turns it into a host array when dumped."""
        return np.array(self.to_numpy(value), copy=True, subok=True)

    def nbytes(self, snapshot: Any) -> int:
        """The memory a :meth:`snapshot` takes."""
        return int(snapshot.nbytes)

    def tensor_phase(self, name: str) -> str:
        """The phase in which the tensor ``name`` was produced, named with the flight recorder's
        first non-finite tensor: ``forward`` for a module's inputs and outputs, ``backward`` for
        a gradient, ``other`` otherwise. Default: the PyTorch and MXNet names
        (``<module>_output_<i>``, ``gradient/<param>``)."""
        if name.startswith(GRADIENT_PREFIX):
            return "backward"
        if "_output_" in name or "_input_" in name:
            return "forward"
        return "other"

    def reductions_to_flat(self, started: list[Any]) -> np.ndarray:
        """The results of :meth:`reduce_on_device` handles ``started``, concatenated into one
        float array in their order (the flight recorder keeps a step's reductions this way;
        every handle's reductions have values: it records no empty tensor). Float64 here; an
        adapter may keep the reductions' own float dtype."""
        return np.array([float(np.real(v)) if v is not None else np.nan
                         for result in self.reductions_to_host(started) for v in result],
                        dtype=np.float64)

    def reductions_finite(self, started: list[Any]) -> bool:
        """True if every result of the handles ``started`` is finite (the flight recorder's check
        of each step); False may also mean a sum that overflowed (mltrace.reductions.all_finite):
        the caller then looks value by value."""
        return all_finite(self.reductions_to_flat(started).tolist())

    def pack_reductions(self, started: list[Any]) -> list[Any]:
        """:meth:`reduce_on_device` handles kept a while (the flight recorder's ring) in as few
        objects as the adapter can (one tensor per device); :meth:`reductions_to_flat` reads
        them. Default: as they are."""
        return started

    def step_copies(self, items: ReductionItems, ring_steps: int, max_bytes: int,
                    checked: bool) -> StepCopies | None:
        """The flight recorder's ring of copies (see :class:`StepCopies`) for a ring of
        ``ring_steps`` steps, within ``max_bytes``, where copying a tensor is cheaper than
        reducing it (``checked``: each step is checked for non-finite values); None (the
        default) reduces every tensor as it comes."""
        return None
