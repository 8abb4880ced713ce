"""The reference definition of every reduction (numpy), and how reductions are named on disk.

One definition everywhere (the writer, the reader and every view use these): computed over the
flattened tensor, in float64 for ints and bools, float32 for float16/bfloat16, the tensor's dtype
otherwise; std and variance with ddof=0; l1 = sum(|x|), l2 = sqrt(sum(x**2)); ``abs_`` applies
``np.abs`` first; NaN propagates as numpy does; an empty tensor has no reductions. Adapters compute
the same with their framework's ops on the device; readers and every view (``mltrace.analysis``)
use these to compute from raw tensors.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.format import REDUCTIONS_PREFIX
from mltrace.format.tensors import BFloat16Bits


def _work_array(x: np.ndarray) -> np.ndarray:
    if isinstance(x, BFloat16Bits):
        x = x.to_float32()
    flat = np.asarray(x).reshape(-1)
    if flat.dtype.kind in "biu" or flat.dtype.name == "bfloat16":
        return flat.astype(np.float64)
    if flat.dtype == np.float16:  # as the adapters do: halves overflow in sums and norms
        return flat.astype(np.float32)
    return flat


def _count_floats(test: Callable[[np.ndarray], np.ndarray], a: np.ndarray,
                  axis: int | None) -> np.ndarray:
    """How many elements ``test`` holds for over ``axis``, as int64 (0 for ints and bools,
    which are never NaN or infinite)."""
    if a.dtype.kind in "fc":
        return np.asarray(np.count_nonzero(test(a), axis=axis), dtype=np.int64)
    return np.zeros(() if axis is None else a.shape[0], dtype=np.int64)


#: Each reduction over ``axis`` of a work array (None: all of it; 1: each row of a stack).
_OPS: dict[str, Callable[[np.ndarray, int | None], np.ndarray]] = {
    "min": lambda a, axis: np.min(a, axis=axis),
    "max": lambda a, axis: np.max(a, axis=axis),
    "mean": lambda a, axis: np.mean(a, axis=axis),
    "std": lambda a, axis: np.std(a, axis=axis),
    "variance": lambda a, axis: np.var(a, axis=axis),
    "sum": lambda a, axis: np.sum(a, axis=axis),
    "prod": lambda a, axis: np.prod(a, axis=axis),
    "median": lambda a, axis: np.median(a, axis=axis),
    "l1": lambda a, axis: np.sum(np.abs(a), axis=axis),
    "l2": lambda a, axis: np.sqrt(np.sum(np.square(np.abs(a)), axis=axis)),
    "nan_count": lambda a, axis: _count_floats(np.isnan, a, axis),
    "inf_count": lambda a, axis: _count_floats(np.isinf, a, axis),
    "zero_fraction": lambda a, axis: np.asarray(
        np.count_nonzero(a == 0, axis=axis) / (a.size if axis is None else a.shape[1]),
        dtype=np.float64),
}
REDUCTION_NAMES = tuple(_OPS)
#: The reductions whose records are int64 (every other one is a float64).
COUNT_REDUCTIONS = ("nan_count", "inf_count")
_NORM_ALIASES = {"l1_norm": "l1", "l2_norm": "l2"}


def canonical_name(name: str) -> str:
    """Map user spellings (``l1_norm``) to the stored reduction name (``l1``), or raise."""
    name = _NORM_ALIASES.get(name, name)
    if name not in _OPS:
        raise MltraceValueError(
            f"unknown reduction {name!r}: choose from {', '.join(REDUCTION_NAMES)}"
        )
    return name


def statistic_name(name: str, abs: bool) -> str:
    """The name of a reduction as a statistic (charts, tables, summaries): ``l2``, ``abs_max``."""
    return f"abs_{name}" if abs else name


def parse_statistic(statistic: str) -> tuple[str, bool]:
    """Split a statistic name (``abs_max``, ``l2_norm``) into (stored reduction, abs), or raise.

    Raises:
        MltraceValueError: not a reduction this module defines (the message lists them).
    """
    is_abs = statistic.startswith("abs_")
    return canonical_name(statistic[4:] if is_abs else statistic), is_abs


def as_numeric(value: np.ndarray) -> np.ndarray:
    """``value`` with bfloat16 (ml_dtypes', or mltrace's bit patterns) as exact float32; any other
    array unchanged, so callers can test ``dtype.kind`` for numbers."""
    if isinstance(value, BFloat16Bits):
        return value.to_float32()
    arr = np.asarray(value)
    return arr.astype(np.float32) if arr.dtype.name == "bfloat16" else arr


def compute_many(value: np.ndarray, statistics: Iterable[str]) -> dict[str, np.ndarray]:
    """Several reductions of one tensor, each exactly as :func:`compute` defines it.

    The value is flattened and converted once, and ``abs`` taken once, for all of them: charts over
    long series of small tensors would otherwise spend more on the conversions than on reading.

    Args:
        value: the tensor.
        statistics: statistic names (``mean``, ``abs_max``, ``l2_norm``; see parse_statistic).

    Returns:
        ``{statistic: 0-d array}`` keyed by the names as given; empty for an empty or
        non-numeric tensor.

    Raises:
        MltraceValueError: an unknown name (even when the tensor is empty).
    """
    wanted = {s: parse_statistic(s) for s in statistics}
    arr = _work_array(value)
    if arr.size == 0 or arr.dtype.kind not in "biufc":
        return {}
    return _reduce(arr, wanted, None)


def compute_rows(stack: np.ndarray, statistics: Iterable[str]) -> dict[str, np.ndarray]:
    """:func:`compute_many` of each of the tensors stacked along the first axis of ``stack``
    (one tensor's values at many steps), in one call per statistic: ``{statistic: array with
    one value per tensor}``. The same definitions and the same numbers as one by one (each row
    is reduced over its own contiguous elements); empty for empty or non-numeric tensors.

    Raises:
        MltraceValueError: an unknown name.
    """
    wanted = {s: parse_statistic(s) for s in statistics}
    rows = len(stack)
    arr = _work_array(stack).reshape(rows, -1) if rows else np.empty((0, 0))
    if arr.size == 0 or arr.dtype.kind not in "biufc":
        return {}
    return _reduce(arr, wanted, 1)


def _reduce(arr: np.ndarray, wanted: dict[str, tuple[str, bool]],
            axis: int | None) -> dict[str, np.ndarray]:
    """The reductions ``wanted`` (``{statistic: (reduction, abs)}``) of work array ``arr`` over
    ``axis``, ``abs`` taken once for all of them."""
    absolute = np.abs(arr) if any(is_abs for _, is_abs in wanted.values()) else arr
    out = {}
    with np.errstate(all="ignore"):
        for statistic, (name, is_abs) in wanted.items():
            result = np.asarray(_OPS[name](absolute if is_abs else arr, axis))
            # Stored and computed reductions alike are float64 (counts int64), whatever the dtype.
            out[statistic] = result if result.dtype.kind in "ic" else result.astype(np.float64)
    return out


def compute(name: str, value: np.ndarray, abs: bool = False) -> np.ndarray | None:
    """Compute one reduction of ``value`` as a 0-d array; None for an empty tensor.

    Args:
        name: a name from REDUCTION_NAMES (``l1_norm``/``l2_norm`` accepted).
        value: the tensor.
        abs: reduce ``abs(value)`` instead.
    """
    statistic = statistic_name(canonical_name(name), abs)
    return compute_many(value, [statistic]).get(statistic)


def all_finite(values: Iterable[float]) -> bool:
    """True if every one of ``values`` is finite, found by summing them as Python floats (no
    numpy call): a NaN or an infinity carries into the sum. A sum that overflowed answers
    False too, so False means "look value by value", not "one is not finite"."""
    return math.isfinite(sum(values))


def reduction_tensor_name(tensor_name: str, name: str, abs: bool) -> str:
    """The name a stored reduction gets: ``smdebug/reductions/[abs_]<name>/<tensor>``."""
    return f"{REDUCTIONS_PREFIX}{statistic_name(canonical_name(name), abs)}/{tensor_name}"


@functools.lru_cache(maxsize=1 << 16)  # the same names come back in every index file of a trial
def parse_reduction_tensor_name(stored: str) -> tuple[str, str, bool] | None:
    """Split a stored reduction name into (base tensor name, reduction, abs); None if not one."""
    if not stored.startswith(REDUCTIONS_PREFIX):
        return None
    red, _, base = stored[len(REDUCTIONS_PREFIX) :].partition("/")
    if not base:
        return None
    is_abs = red.startswith("abs_")
    return base, red[4:] if is_abs else red, is_abs
