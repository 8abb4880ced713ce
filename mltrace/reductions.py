"""The reference definition of every reduction (numpy), and how reductions are named on disk.

One definition everywhere (DESIGN.md, format contract point 6): computed over the flattened
tensor, in float64 for ints and bools, float32 for float16/bfloat16, the tensor's dtype otherwise; std and
variance with ddof=0; l1 = sum(|x|), l2 = sqrt(sum(x**2)); ``abs_`` applies ``np.abs`` first;
NaN propagates as numpy does; an empty tensor has no reductions. Adapters compute the same with
their framework's ops on the device; readers use these to compute from raw tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

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


_OPS: dict[str, Callable[[np.ndarray], np.generic]] = {
    "min": np.min,
    "max": np.max,
    "mean": np.mean,
    "std": np.std,
    "variance": np.var,
    "sum": np.sum,
    "prod": np.prod,
    "median": np.median,
    "l1": lambda a: np.sum(np.abs(a)),
    "l2": lambda a: np.sqrt(np.sum(np.square(np.abs(a)))),
    "nan_count": lambda a: np.int64(np.count_nonzero(np.isnan(a))) if a.dtype.kind in "fc" else np.int64(0),
    "inf_count": lambda a: np.int64(np.count_nonzero(np.isinf(a))) if a.dtype.kind in "fc" else np.int64(0),
    "zero_fraction": lambda a: np.float64(np.count_nonzero(a == 0) / a.size),
}
REDUCTION_NAMES = tuple(_OPS)
_NORM_ALIASES = {"l1_norm": "l1", "l2_norm": "l2"}


def canonical_name(name: str) -> str:
    """Map user spellings (``l1_norm``) to the stored reduction name (``l1``), or raise."""
    name = _NORM_ALIASES.get(name, name)
    if name not in _OPS:
        raise MltraceValueError(f"unknown reduction {name!r}: choose from {', '.join(REDUCTION_NAMES)}")
    return name


def compute(name: str, value: np.ndarray, abs: bool = False) -> np.ndarray | None:
    """Compute one reduction of ``value`` as a 0-d array; None for an empty tensor.

    Args:
        name: a name from REDUCTION_NAMES (``l1_norm``/``l2_norm`` accepted).
        value: the tensor.
        abs: reduce ``abs(value)`` instead.
    """
    name = canonical_name(name)
    arr = _work_array(value)
    if arr.size == 0 or arr.dtype.kind not in "biufc":
        return None
    if abs:
        arr = np.abs(arr)
    with np.errstate(all="ignore"):
        result = np.asarray(_OPS[name](arr))
    # Stored and computed reductions alike are float64 (counts int64), whatever the input dtype.
    return result if result.dtype.kind in "ic" else result.astype(np.float64)


def reduction_tensor_name(tensor_name: str, name: str, abs: bool) -> str:
    """The name a stored reduction gets: ``smdebug/reductions/[abs_]<name>/<tensor>``."""
    return f"{REDUCTIONS_PREFIX}{'abs_' if abs else ''}{canonical_name(name)}/{tensor_name}"


@functools.lru_cache(maxsize=1 << 16)  # the same names come back in every index file of a trial
def parse_reduction_tensor_name(stored: str) -> tuple[str, str, bool] | None:
    """Split a stored reduction name into (base tensor name, reduction, abs); None if not one."""
    if not stored.startswith(REDUCTIONS_PREFIX):
        return None
    red, _, base = stored[len(REDUCTIONS_PREFIX):].partition("/")
    if not base:
        return None
    is_abs = red.startswith("abs_")
    return base, red[4:] if is_abs else red, is_abs
