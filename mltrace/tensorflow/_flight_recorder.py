"""The flight recorder's fast path for TensorFlow values (mltrace.capture.flight_recorder).

The recorder reduces every recorded tensor of every step, due or not, so its reductions stay on
the device where the value lives and a step's results cross to the host in one copy per device.
It also keeps raw copies (snapshots) on the device until a dump, and names the phase (forward,
backward) of the first tensor that went non-finite. Nothing here runs without a recorder.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from mltrace.capture.adapter import ReductionItems
from mltrace.capture.hook import Hook
from mltrace.capture.recording_adapter import RecordingAdapter
from mltrace.collections import Collection
from mltrace.tensorflow import _tensors
from mltrace.tensorflow._tensors import LAYER_IO, MODEL_IO, dense


class RecorderFastPath(RecordingAdapter):
    """What the flight recorder asks of the TensorFlow adapter: on-device reductions, their copy
    to the host by device, snapshots and the phase of a tensor name."""

    hook: Hook  # set by attach(), which the hook calls as it is built

    def reduce_on_device(self, value: Any, items: ReductionItems) -> Any:
        """The reductions as one float64 vector left where the value lives (a _Started), or the
        results at once where numpy computes them (host values, complex and string tensors)."""
        if _tensors.is_tf_value(value):
            started = _tensors.start_reductions(value, items)
            if isinstance(started, tf.Tensor):
                return _Started(items, started)
            if started is not None:
                return started
        return super().reduce(value, items)

    def reductions_to_host(self, started: list[Any]) -> list[list[np.ndarray | None]]:
        """A step's reductions left on devices, concatenated and copied to the host together:
        one copy per device (one per step on one device)."""
        pending = [s for s in started if isinstance(s, _Started)]
        host: dict[int, np.ndarray] = {}
        for device in {s.values.device for s in pending}:
            here = [s for s in pending if s.values.device == device]
            values = tf.concat([s.values for s in here], axis=0).numpy()
            offsets = np.cumsum([0] + [len(s.items) for s in here])
            host.update({id(s): values[a:b] for s, a, b in zip(here, offsets, offsets[1:])})
        return [_tensors.host_results(s.items, host[id(s)]) if isinstance(s, _Started) else s
                for s in started]

    def reductions_to_flat(self, started: list[Any]) -> np.ndarray:
        """The flight recorder's step: its reductions all on one device are concatenated there
        and copied once, already flat (counts stay float64: the recorder casts them)."""
        if started and all(isinstance(s, _Started) for s in started):
            if len({s.values.device for s in started}) == 1:
                return np.asarray(tf.concat([s.values for s in started], axis=0).numpy())
        return super().reductions_to_flat(started)

    def recordable(self, value: Any) -> bool:
        """Not empty tensors (no reduction has a value), nor strings."""
        if _tensors.is_tf_value(value):
            shape = tuple(value.shape)  # a keras.Variable's is a tuple, a tensor's a TensorShape
            return tf.as_dtype(value.dtype) != tf.string and all(d != 0 for d in shape)
        return np.asarray(value).dtype.kind in "biufc" and np.size(value) > 0

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        """A TF value's shape and numpy dtype (the recorder writes a loss back with it)."""
        if _tensors.is_tf_value(value):
            dtype = tf.as_dtype(value.dtype)
            return tuple(int(d) for d in value.shape), (
                np.float32 if dtype == tf.bfloat16 else dtype.as_numpy_dtype)
        array = self.to_numpy(value)  # as it is saved: a Python number (``batch``) as shape [1]
        return tuple(array.shape), array.dtype

    def snapshot(self, value: Any) -> Any:
        """A copy where the value lives (a variable's value as it is now); no host transfer
        until a dump."""
        if _tensors.is_tf_value(value):
            return tf.identity(dense(value))
        return super().snapshot(value)

    def nbytes(self, snapshot: Any) -> int:
        """A tensor's bytes."""
        if isinstance(snapshot, tf.Tensor):
            return int(snapshot.shape.num_elements() or 0) * snapshot.dtype.size
        return super().nbytes(snapshot)

    def tensor_phase(self, name: str) -> str:
        """``backward`` for ``gradients/...Grad``, ``forward`` for layer and model inputs and
        outputs (``<layer>/outputs``, ``inputs``, ``labels``, ``predictions``)."""
        if name.startswith("gradients/"):
            return "backward"
        if LAYER_IO.match(name) or MODEL_IO.match(name):
            return "forward"
        return "other"

    def recording(self, colls: Iterable[Collection]) -> bool:
        """True if the flight recorder keeps a tensor of ``colls`` this step: it is fetched on
        every step, due or not."""
        recorder = self.hook.recorder
        return recorder is not None and recorder.records(colls)


class _Started:
    """Reductions started on a device: ``values`` (float64, one per item) not yet copied."""

    __slots__ = ("items", "values")

    def __init__(self, items: ReductionItems, values: tf.Tensor) -> None:
        self.items = items
        self.values = values
