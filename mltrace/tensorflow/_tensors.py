"""TensorFlow values -> numpy, reductions with TF ops, and smdebug's TensorFlow tensor names."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import tensorflow as tf

from mltrace.capture.adapter import as_numpy
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.reductions import canonical_name

_COUNTS = ("nan_count", "inf_count")


def is_tf_value(value: Any) -> bool:
    """True for TF tensors, variables (tf and Keras 3) and IndexedSlices."""
    return isinstance(value, (tf.Tensor, tf.Variable, tf.IndexedSlices)) or is_keras_variable(value)


def is_keras_variable(value: Any) -> bool:
    """True for a Keras 3 ``keras.Variable`` (it wraps a tf.Variable; it is not one)."""
    return isinstance(value, tf.keras.Variable)


def dense(value: Any) -> tf.Tensor:
    """A dense tensor of ``value`` (IndexedSlices gradients of embeddings are densified)."""
    return tf.convert_to_tensor(value)


def to_numpy(value: Any) -> np.ndarray:
    """A host copy: tensors and variables through ``.numpy()`` (bfloat16 stays bfloat16 via
    ml_dtypes, strings become bytes arrays), anything else as mltrace.capture.adapter.as_numpy."""
    if not is_tf_value(value):
        return as_numpy(value)
    tensor = dense(value)
    if not hasattr(tensor, "numpy"):
        raise MltraceTypeError(
            f"cannot read the value of the symbolic tensor {getattr(tensor, 'name', tensor)!r} "
            "here: "
            "values exist only while the step runs (the hook captures them itself)"
        )
    return np.asarray(tensor.numpy())


def reduce_on_device(value: Any, items: list[tuple[str, bool]]) -> list[np.ndarray | None] | None:
    """The reductions ``items`` of a TF value with TF ops where it lives, copied to the host
    once; None when numpy must do it (complex or string tensors)."""
    started = start_reductions(value, items)
    if started is None or isinstance(started, list):
        return started
    return host_results(items, started.numpy())  # one device-to-host copy per tensor


def start_reductions(
    value: Any, items: list[tuple[str, bool]]
) -> tf.Tensor | list[np.ndarray | None] | None:
    """The reductions ``items`` of a TF value as one float64 vector left where the value lives
    (:func:`host_results` reads it once copied); ``[None, ...]`` for an empty tensor, None when
    numpy must do it (complex or string tensors)."""
    t = tf.reshape(dense(value), [-1])
    if t.dtype.is_complex or t.dtype == tf.string:
        return None
    if t.shape.num_elements() == 0:
        return [None] * len(items)
    if t.dtype.is_integer or t.dtype == tf.bool:
        t = tf.cast(t, tf.float64)  # ints and bools reduce in float64, as numpy's definition here
    elif t.dtype in (tf.float16, tf.bfloat16):
        t = tf.cast(t, tf.float32)
    names = [canonical_name(name) for name, _ in items]
    return tf.stack(
        [tf.cast(_tf_reduction(t, name, abs_), tf.float64) for name, (_, abs_) in zip(names, items)]
    )


def host_results(items: list[tuple[str, bool]], host: np.ndarray) -> list[np.ndarray | None]:
    """The results of :func:`start_reductions` once on the host (counts as int64, as numpy's)."""
    names = [canonical_name(name) for name, _ in items]
    return [np.asarray(np.int64(h) if n in _COUNTS else h) for n, h in zip(names, host)]


def _tf_reduction(t: tf.Tensor, name: str, abs_: bool) -> tf.Tensor:
    """numpy's definitions (ddof=0, flattened norms) with TF ops; ``t`` is flat and non-empty."""
    if abs_:
        t = tf.abs(t)
    simple = {
        "min": tf.reduce_min,
        "max": tf.reduce_max,
        "mean": tf.reduce_mean,
        "std": tf.math.reduce_std,
        "variance": tf.math.reduce_variance,
        "sum": tf.reduce_sum,
        "prod": tf.reduce_prod,
    }
    if name in simple:
        return simple[name](t)
    if name == "l1":
        return tf.reduce_sum(tf.abs(t))
    if name == "l2":
        return tf.sqrt(tf.reduce_sum(tf.square(t)))
    if name == "median":
        ordered = tf.sort(t)
        n = tf.size(ordered)
        return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    if name == "nan_count":
        return tf.math.count_nonzero(tf.math.is_nan(t)) if t.dtype.is_floating else tf.constant(0)
    if name == "inf_count":
        return tf.math.count_nonzero(tf.math.is_inf(t)) if t.dtype.is_floating else tf.constant(0)
    if name == "zero_fraction":
        return tf.math.count_nonzero(tf.equal(t, 0), dtype=tf.float64) / tf.cast(
            tf.size(t), tf.float64
        )
    raise MltraceValueError(f"unknown reduction {name!r}")


# -- names (smdebug's TensorFlow hooks) ---------------------------------------------------------
def variable_name(var: Any) -> str:
    """The TF name of a variable, ``<path>:0`` (Keras 3 creates its tf.Variable under its path)."""
    if is_keras_variable(var):
        return f"{var.path}:0"
    name = getattr(var, "name", None)
    if not isinstance(name, str) or not name:
        raise MltraceTypeError(f"{type(var).__name__} has no TensorFlow name")
    return name


def gradient_name(var: Any) -> str:
    """``gradients/<variable name without :N>Grad``, as smdebug's TF2 hooks name gradients."""
    return f"gradients/{variable_name(var).split(':')[0]}Grad"


def layer_weight_name(layer_name: str, var: Any) -> str:
    """``<layer>/weights/<variable name>`` (Keras weights in model.fit)."""
    return f"{layer_name}/weights/{variable_name(var)}"


def io_names(prefix: str, value: Any) -> list[tuple[str, Any]]:
    """(name, tensor) pairs of a (nested) value: ``prefix`` for one tensor, ``prefix_<i>`` for
    several
    (smdebug's layer and model input/output names); non-tensor leaves are skipped."""
    flat = [v for v in tf.nest.flatten(value) if is_tf_value(v) or isinstance(v, np.ndarray)]
    if len(flat) == 1:
        return [(prefix, flat[0])]
    return [(f"{prefix}_{i}", v) for i, v in enumerate(flat)]


#: The names io_names gives a layer's inputs and outputs (``<layer>/outputs``, ``<layer>/inputs_1``).
LAYER_IO = re.compile(r"^(?P<layer>[^/]+)/(inputs|outputs)(_\d+)?$")
#: The names io_names gives the model's inputs, labels and predictions (``inputs``, ``labels_0``).
MODEL_IO = re.compile(r"^(inputs|labels|predictions)(_\d+)?$")
