"""Reductions with MXNet ops on the tensor's context: numpy's definitions (mltrace.reductions),
one device-to-host copy per tensor, or one per step for the flight recorder (start_reductions,
then host_results on a step's concatenated vectors)."""

from __future__ import annotations

import mxnet as mx
import numpy as np
from mxnet.ndarray import NDArray

from mltrace.reductions import canonical_name


def reduce_on_device(value: NDArray, items: list[tuple[str, bool]]) -> list[np.ndarray]:
    """Each (reduction, abs) of ``items`` over the flattened ``value`` (a non-empty, dense,
    real-valued NDArray), as 0-d float64 arrays (int64 for counts)."""
    return host_results(items, start_reductions(value, items).asnumpy())


def start_reductions(value: NDArray, items: list[tuple[str, bool]]) -> NDArray:
    """The reductions of ``items``, then the NaN count, as one float64 vector left on the
    value's context (:func:`host_results` reads it once copied to the host)."""
    names = [canonical_name(name) for name, _ in items]
    # Forward hooks run inside autograd.record(): these ops must stay out of the user's graph.
    with mx.autograd.pause():
        return _device_reductions(value, names, [a for _, a in items])


def host_results(items: list[tuple[str, bool]], host: np.ndarray) -> list[np.ndarray]:
    """The results of :func:`start_reductions` on the host: numpy's NaN propagation applied,
    counts as int64."""
    names = [canonical_name(name) for name, _ in items]
    has_nan = host[-1] > 0
    return [np.asarray(np.int64(h) if n in _COUNTS else
                       np.float64("nan") if has_nan and n not in NAN_SAFE else h)
            for n, h in zip(names, host[:-1])]


def _device_reductions(value: NDArray, names: list[str], abs_flags: list[bool]) -> NDArray:
    """The reductions, then the NaN count, as one float64 vector on the value's context."""
    if isinstance(value, mx.np.ndarray):
        value = value.as_nd_ndarray()
    t = value.reshape((-1,))
    if np.dtype(t.dtype).kind in "biu":
        t = t.astype("float64")  # ints and bools reduce in float64, as numpy's definition here
    elif t.dtype == np.float16:
        t = t.astype("float32")
    outs = [_MX_OPS[name](mx.nd.abs(t) if abs_ else t) for name, abs_ in zip(names, abs_flags)]
    outs.append(mx.nd.contrib.isnan(t).astype("float64").sum())
    return mx.nd.concat(*[o.reshape((1,)).astype("float64") for o in outs], dim=0)


_COUNTS = ("nan_count", "inf_count")
# numpy propagates NaN through every reduction but these; MXNet's min/max/sort may not.
NAN_SAFE = ("nan_count", "inf_count", "zero_fraction")


def _variance(t: NDArray) -> NDArray:
    return mx.nd.mean(mx.nd.square(mx.nd.broadcast_sub(t, mx.nd.mean(t))))


def _median(t: NDArray) -> NDArray:
    s, n = mx.nd.sort(t), t.size
    return (s[(n - 1) // 2] + s[n // 2]) / 2


# numpy's definitions (ddof=0, flattened norms) with MXNet ops, on the tensor's context.
_MX_OPS = {
    "min": mx.nd.min, "max": mx.nd.max, "mean": mx.nd.mean, "sum": mx.nd.sum, "prod": mx.nd.prod,
    "variance": _variance, "std": lambda t: mx.nd.sqrt(_variance(t)), "median": _median,
    "l1": lambda t: mx.nd.sum(mx.nd.abs(t)), "l2": lambda t: mx.nd.sqrt(mx.nd.sum(mx.nd.square(t))),
    "nan_count": lambda t: mx.nd.contrib.isnan(t).astype("float64").sum(),
    "inf_count": lambda t: mx.nd.contrib.isinf(t).astype("float64").sum(),
    "zero_fraction": lambda t: (t == 0).astype("float64").sum() / t.size,
}
