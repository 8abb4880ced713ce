"""Normalizations of one tensor's statistic over steps, so that change shows where absolute size
hides it: a gradient that shrank a thousandfold stays one colour on a scale that spans weights
and gradients of every layer.

- ``none``: the values as saved.
- ``row``: each value over the row's largest finite value (the row's own scale: 1 at its peak).
- ``first``: each value over the row's first finite positive value (1 where it started).
- ``change``: each value over the previous saved step's (step-to-step change; 1 is no change;
  a first step has none).

Ratios are what a view colours on a log scale around 1. A ratio that has no meaning (a division
by zero or by a non-finite value) is NaN: left out, never reported as a NaN of the tensor (the
heat map counts NaN and infinities from the values themselves).

Example:
    >>> normalize_values(np.array([2.0, 4.0, 1.0]), "first").tolist()
    [1.0, 2.0, 0.5]
"""

from __future__ import annotations

import numpy as np

from mltrace.exceptions import MltraceValueError

NONE = "none"
#: The normalizations a view offers, ``none`` first.
NORMALIZATIONS = (NONE, "row", "first", "change")
#: The normalizations whose values are ratios around 1 (a diverging colour scale).
RATIOS = ("first", "change")


def check_normalization(how: str) -> str:
    """``how`` when it is one of NORMALIZATIONS, else MltraceValueError listing them."""
    if how not in NORMALIZATIONS:
        raise MltraceValueError(
            f"normalize={how!r} is not a normalization: choose from {', '.join(NORMALIZATIONS)}")
    return how


def _ratio(values: np.ndarray, by: np.ndarray | float) -> np.ndarray:
    """values / by where ``by`` is finite and positive, 0/0 counted as 1 (no change), NaN
    where the ratio means nothing."""
    by = np.broadcast_to(np.asarray(by, dtype=np.float64), values.shape)
    out = np.full(values.shape, np.nan)
    ok = np.isfinite(values) & np.isfinite(by) & (by > 0)
    out[ok] = values[ok] / by[ok]
    out[np.isfinite(values) & (values == 0) & (by == 0)] = 1.0
    return out


def normalize_values(values: np.ndarray, how: str) -> np.ndarray:
    """One row's values (in step order) normalized ``how`` (see the module docstring).

    Args:
        values: one statistic of one tensor at its saved steps, ascending.
        how: one of NORMALIZATIONS.

    Returns:
        A new float64 array of the same length; NaN where the normalization has no value.

    Raises:
        MltraceValueError: an unknown normalization.
    """
    check_normalization(how)
    v = np.asarray(values, dtype=np.float64)
    if how == NONE or not v.size:
        return v.copy()
    finite = v[np.isfinite(v)]
    if how == "row":
        peak = float(finite.max()) if finite.size else np.nan
        kept = np.where(np.isfinite(v), v, np.nan)
        return kept / peak if peak > 0 else kept  # a row of zeros stays zeros
    if how == "first":
        positive = finite[finite > 0]
        return _ratio(v, float(positive[0]) if positive.size else np.nan)
    previous = np.concatenate([[np.nan], v[:-1]])
    return _ratio(v, previous)
