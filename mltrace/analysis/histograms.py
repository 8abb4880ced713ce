"""Histograms of a tensor's raw values, at one step and over steps.

Only finite values are counted (a NaN or an infinity has no bucket; the ``nan_count`` and
``inf_count`` statistics count them), over equal-width buckets as TensorBoard draws them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mltrace.analysis.series import Coverage, left_out
from mltrace.analysis.statistics import UNREADABLE, thin
from mltrace.modes import ModeKeys
from mltrace.reductions import as_numeric

if TYPE_CHECKING:
    from mltrace.trials import Trial


def finite_values(value: np.ndarray) -> np.ndarray:
    """The finite values of a tensor, flat, as float64 (bfloat16 included); empty when it holds
    no real numbers (strings, complex)."""
    arr = as_numeric(value).reshape(-1)
    if arr.dtype.kind not in "biuf":
        return np.empty(0, dtype=np.float64)
    arr = arr.astype(np.float64)
    return arr[np.isfinite(arr)]


@dataclass(frozen=True)
class Histogram:
    """Counts per bucket: bucket ``i`` spans ``edges[i]`` to ``edges[i + 1]``."""

    edges: np.ndarray
    counts: np.ndarray

    def buckets(self) -> list[list[float]]:
        """``[[left, right, count], ...]``, TensorBoard's form of a histogram."""
        return [
            [float(self.edges[i]), float(self.edges[i + 1]), float(c)]
            for i, c in enumerate(self.counts)
        ]


def histogram(value: np.ndarray, bins: int) -> Histogram | None:
    """The histogram of a tensor's finite values over ``bins`` equal buckets from its minimum to
    its maximum (one bucket when all are equal); None when it has no finite value."""
    arr = finite_values(value)
    if arr.size == 0:
        return None
    lo, hi = float(arr.min()), float(arr.max())
    if lo == hi:
        return Histogram(np.array([lo, hi]), np.array([arr.size]))
    counts, edges = np.histogram(arr, bins=bins, range=(lo, hi))
    return Histogram(edges, counts)


def common_edges(values: Iterable[np.ndarray], bins: int) -> np.ndarray:
    """``bins + 1`` bucket edges spanning the finite values of all ``values``, so that histograms
    of several steps (or runs) can be compared bucket by bucket (a unit span around a single
    value; 0..1 when there is none)."""
    finite = [v for v in (finite_values(x) for x in values) if v.size]
    lo = min((float(v.min()) for v in finite), default=0.0)
    hi = max((float(v.max()) for v in finite), default=1.0)
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    return np.linspace(lo, hi, bins + 1)


@dataclass
class HistogramSeries:
    """Histograms of one tensor over the steps of one mode (steps that saved the raw value).

    Attributes:
        steps: the mode steps shown, each with a histogram in ``histograms``.
        coverage: how many steps had a raw value, how many were read, which were damaged.
    """

    tensor: str
    mode: ModeKeys
    coverage: Coverage
    steps: list[int] = field(default_factory=list)
    histograms: list[Histogram] = field(default_factory=list)


def tensor_histograms(
    trial: Trial,
    tensor: str,
    mode: ModeKeys = ModeKeys.GLOBAL,
    worker: str | None = None,
    bins: int = 30,
    max_steps: int | None = None,
) -> HistogramSeries:
    """Histograms of ``tensor``'s raw values over the steps of ``mode`` (see :func:`histogram`).

    Args:
        trial, tensor, mode: what to read; ``worker``: whose values (default: each step's first).
        bins: buckets per histogram.
        max_steps: at most this many steps, thinned evenly (None: all).
    """
    t = trial.tensor(tensor)
    raw = t.value_steps(mode, worker)
    shown = thin(raw, max_steps)
    out = HistogramSeries(tensor, mode, Coverage(len(raw), len(shown)))
    for step in shown:
        try:
            h = histogram(t.value(step, mode, worker), bins)
        except UNREADABLE as exc:
            out.coverage.damaged.append(left_out(tensor, step, exc))
            continue
        if h is not None:
            out.steps.append(step)
            out.histograms.append(h)
    return out
