"""Trailing-window statistics of a series of values over training steps, framework-neutral.

A series holds one value per step: a scalar (a loss, a gradient norm) or a fixed-length vector
(one value per attention head), statistics running element by element. The stability rules judge
a step's value against the values of the steps before it:

- ``SeriesHistory``: a series' newest values by step, read once;
- ``EmaZScore``: an exponential moving mean and variance with ZClip's update (alpha 0.97), a
  z-score against them;
- plain functions over a window of values (``window_mean_std``, ``window_median``,
  ``window_mad``: the median absolute deviation, ``robust_z``, ``rising_fraction``).

Non-finite values (NaN, +-inf) never enter a statistic: a window's statistics are those of its
finite values, and an element with no finite value in the window has the statistic NaN.
Everything here is deterministic (no sampling) and depends on numpy only.
"""

from __future__ import annotations

import math
import warnings
from bisect import insort
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

#: MAD times this estimates the standard deviation of normally distributed values.
MAD_TO_STD = 1.4826


def as_vector(value: float | Sequence[float] | np.ndarray) -> np.ndarray:
    """``value`` as a float64 1-D array (a scalar becomes one element)."""
    return np.asarray(value, dtype=np.float64).reshape(-1)


def stack(values: Iterable[float | Sequence[float] | np.ndarray]) -> np.ndarray:
    """Values of one series as a (count, size) float64 array, non-finite entries as NaN; a
    window without values gives shape (0, 0).

    Raises:
        ValueError: the values do not all have the same size.
    """
    rows = [as_vector(v) for v in values]
    if not rows:
        return np.zeros((0, 0))
    size = rows[0].size
    if any(r.size != size for r in rows):
        raise ValueError(f"values of one series differ in size: {sorted({r.size for r in rows})}")
    out = np.stack(rows)
    out[~np.isfinite(out)] = np.nan
    return out


def _quiet(fn: Callable[..., Any], arr: np.ndarray, **kwargs: Any) -> np.ndarray:
    """A nan-statistic over axis 0, NaN (without a warning) where a column has no value."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(fn(arr, axis=0, **kwargs), dtype=np.float64)


def _median(arr: np.ndarray) -> np.ndarray:
    """Per column, the median of the finite values (np.median when all are: several times
    faster than np.nanmedian on the short windows the rules read at every step)."""
    if arr.shape[0] and not np.isnan(arr).any():
        return np.asarray(np.median(arr, axis=0), dtype=np.float64)
    return _quiet(np.nanmedian, arr)


def window_mean_std(window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per element, the mean and the sample standard deviation (ddof 1: an unbiased variance,
    slightly larger than the population's on short windows) of a ``stack``-ed window. The
    deviation is NaN where fewer than two values are finite."""
    mean = _quiet(np.nanmean, window)
    count = np.sum(np.isfinite(window), axis=0)
    std = _quiet(np.nanstd, window, ddof=1)
    std[count < 2] = np.nan
    return mean, std


def window_median(window: np.ndarray) -> np.ndarray:
    """Per element, the median of a ``stack``-ed window's finite values."""
    return _median(window)


def window_mad(window: np.ndarray) -> np.ndarray:
    """Per element, the median absolute deviation from the median of a ``stack``-ed window."""
    return _median(np.abs(window - window_median(window)))


def robust_z(value: float | np.ndarray, window: np.ndarray) -> np.ndarray:
    """Per element, ``(value - median) / (MAD_TO_STD * MAD)`` of a ``stack``-ed window: a z-score
    that a few outliers in the window do not move. Where the MAD is 0 (a constant window) the
    score is +inf above the median, -inf below it and 0 at it; NaN where the window has no
    finite value or ``value`` is not finite."""
    x = as_vector(value)
    median = window_median(window)
    spread = MAD_TO_STD * window_mad(window)
    diff = x - median
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(spread > 0, diff / np.where(spread > 0, spread, 1.0),
                     np.sign(diff) * np.where(diff != 0, np.inf, 0.0))
    z[~np.isfinite(x) | np.isnan(median)] = np.nan
    return z


def rising_fraction(window: np.ndarray) -> np.ndarray:
    """Per element, the fraction of consecutive pairs of a ``stack``-ed window whose later value
    is larger (pairs with a non-finite value count as not rising); NaN for fewer than 2 rows."""
    if window.shape[0] < 2:
        return np.full(window.shape[1:], np.nan)
    with np.errstate(invalid="ignore"):
        rising = np.diff(window, axis=0) > 0
    return np.mean(rising, axis=0)


class SeriesHistory:
    """The values of one series by step: what a rule has read, so that each value is read from
    the trial once.

    Args:
        keep: how many of the newest values to keep (None: all); adding a value beyond that
            forgets the oldest, so a rule scanning a long run holds one window per series.

    Example:
        >>> h = SeriesHistory(keep=128)
        >>> for step, loss in enumerate([2.0, 1.9, 1.95, 1.8]):
        ...     h.add(step, loss)
        >>> h.get(3)
        array([1.8])
    """

    def __init__(self, keep: int | None = None) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"keep={keep!r} must be a positive integer or None")
        self.keep = keep
        self._steps: list[int] = []
        self._values: dict[int, np.ndarray] = {}

    def __contains__(self, step: int) -> bool:
        return step in self._values

    def add(self, step: int, value: float | Sequence[float] | np.ndarray) -> None:
        """Record ``value`` at ``step`` (in any order; a step's earlier value is replaced)."""
        if step not in self._values:
            if not self._steps or step > self._steps[-1]:
                self._steps.append(step)
            else:
                insort(self._steps, step)
        self._values[step] = as_vector(value)
        if self.keep is not None and len(self._steps) > self.keep:
            for old in self._steps[:len(self._steps) - self.keep]:
                del self._values[old]
            del self._steps[:len(self._steps) - self.keep]

    def get(self, step: int) -> np.ndarray | None:
        """The value at ``step``, or None when it is not held."""
        return self._values.get(step)


class EmaZScore:
    """A running mean and variance with ZClip's exponential update, and z-scores against them.

    The first ``warmup`` finite values set the mean and the (population) variance; each later
    ``update(x)`` does ``mean = alpha * mean + (1 - alpha) * x`` and then
    ``var = alpha * var + (1 - alpha) * (x - mean) ** 2`` with the new mean. Whether a value is
    fed to ``update`` is the caller's choice: ZClip leaves spikes out, so that one outlier does
    not inflate the variance that the next one is judged by.

    Args:
        alpha: the weight of the past, in (0, 1); default 0.97 (ZClip). The mean then forgets
            with a time constant of about 1 / (1 - alpha) = 33 updates.
        warmup: how many values initialise the estimate (default 25, ZClip's warm-up).
    """

    def __init__(self, alpha: float = 0.97, warmup: int = 25) -> None:
        if not 0 < alpha < 1:
            raise ValueError(f"alpha={alpha!r} must lie in (0, 1)")
        if warmup < 1:
            raise ValueError(f"warmup={warmup!r} must be a positive integer")
        self.alpha = alpha
        self.warmup = warmup
        self.mean = math.nan
        self.var = math.nan
        self._buffer: list[float] = []

    @property
    def ready(self) -> bool:
        """True once ``warmup`` values have set the estimate."""
        return not math.isnan(self.mean)

    @property
    def std(self) -> float:
        """The standard deviation (NaN before the warm-up ends)."""
        return math.sqrt(self.var) if self.ready else math.nan

    def z(self, x: float) -> float:
        """``(x - mean) / std``; with a zero deviation, +inf above the mean, -inf below, 0 at
        it; NaN before the warm-up ends or for a non-finite ``x``."""
        if not self.ready or not math.isfinite(x):
            return math.nan
        diff = x - self.mean
        if self.var > 0:
            return diff / math.sqrt(self.var)
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)

    def update(self, x: float) -> None:
        """Feed one value (non-finite values are ignored)."""
        if not math.isfinite(x):
            return
        if not self.ready:
            self._buffer.append(x)
            if len(self._buffer) >= self.warmup:
                values = np.asarray(self._buffer)
                self.mean, self.var = float(values.mean()), float(values.var())
                self._buffer = []
            return
        a = self.alpha
        self.mean = a * self.mean + (1 - a) * x
        self.var = a * self.var + (1 - a) * (x - self.mean) ** 2


__all__ = [
    "MAD_TO_STD", "EmaZScore", "SeriesHistory", "as_vector", "rising_fraction", "robust_z",
    "stack", "window_mad", "window_mean_std", "window_median",
]
