"""Where two runs part ways: the difference view of two runs (``mltrace compare`` on two runs,
the TensorBoard tab's ratio view).

For each tensor and statistic both runs have, the ratio of the second run's value to the first
run's at each step both saved; the runs *part ways* at the first step where, for some tensor,
the two values differ by more than ``rtol`` of the larger one (``|b - a| > rtol * max(|a|, |b|)``;
two NaNs, or two equal infinities, agree). Two runs of the same code, seed and data agree
exactly until something changes; the first step and tensor that differ are where to look (a
layer whose weights were changed, the first layer a different learning rate moves). When
several tensors part ways at that step, the one with the largest difference (by
``|log(b / a)|``; ties in natural order) is named, and the others are listed.

The ratios are the view to plot: a flat line at 1 while the runs agree.

Example:
    >>> series = {"fc1.weight · mean": {"a": ([0, 5, 10], [1.0, 1.0, 1.0]),
    ...                                 "b": ([0, 5, 10], [1.0, 1.0, 1.5])}}
    >>> find_parting(series, ("a", "b")).step
    10
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from mltrace.analysis.order import natural_key

#: Relative difference above which two values differ (0.1%): float noise of a non-deterministic
#: kernel stays far below it, a changed layer or learning rate goes far above.
DEFAULT_RTOL = 1e-3

#: ``(steps, values)`` of one run (lists or numpy arrays)
Line = tuple[Sequence[int] | np.ndarray, Sequence[float] | np.ndarray]


@dataclass
class Parting:
    """The first step where two runs differ, and the panel (``tensor · statistic``) that
    differs most there."""

    step: int
    panel: str
    value_a: float
    value_b: float
    #: value_b / value_a (inf where value_a is 0 and value_b is not)
    ratio: float
    #: the other panels that part ways at the same step, most different first
    others: list[str] = field(default_factory=list)

    @property
    def tensor(self) -> str:
        """The tensor of :attr:`panel`."""
        return self.panel.rsplit(" · ", 1)[0]

    @property
    def statistic(self) -> str:
        """The statistic of :attr:`panel`."""
        return self.panel.rsplit(" · ", 1)[-1]


def ratio_values(a: np.ndarray | Sequence[float], b: np.ndarray | Sequence[float]) -> np.ndarray:
    """``b / a`` element by element: 1 where both are equal (zeros, equal infinities and two
    NaNs included), ±inf where only ``a`` is 0, NaN where only one side is NaN.

    Example:
        >>> ratio_values([1.0, 0.0, 2.0], [1.5, 0.0, 1.0]).tolist()
        [1.5, 1.0, 0.5]
    """
    x = np.atleast_1d(np.asarray(a, dtype=np.float64))
    y = np.atleast_1d(np.asarray(b, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = y / x
    out[x == 0] = np.copysign(np.inf, y[x == 0])
    out[(x == y) | (np.isnan(x) & np.isnan(y))] = 1.0
    return out


def ratio(a: float, b: float) -> float:
    """:func:`ratio_values` of one pair."""
    return float(ratio_values([a], [b])[0])


def ratio_line(a: Line, b: Line) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, b / a)`` at each step both lines have, in step order."""
    steps, ia, ib = np.intersect1d(np.asarray(a[0], dtype=np.int64),
                                   np.asarray(b[0], dtype=np.int64), return_indices=True)
    return steps, ratio_values(np.asarray(a[1], dtype=np.float64)[ia],
                               np.asarray(b[1], dtype=np.float64)[ib])


def ratio_panels(series: Mapping[str, Mapping[str, Line]],
                 labels: tuple[str, str]) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """The difference view: ``{panel: {"b / a": (steps, ratios)}}`` for each panel where both
    runs have a line; infinite ratios are left out of the lines (a plot cannot show them)."""
    first, second = labels
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for panel, lines in series.items():
        if first in lines and second in lines:
            steps, ratios = ratio_line(lines[first], lines[second])
            finite = np.isfinite(ratios)
            out[panel] = {f"{second} / {first}": (steps[finite].tolist(), ratios[finite].tolist())}
    return out


def first_difference(a: Line, b: Line, rtol: float = DEFAULT_RTOL) -> tuple[int, float, float] | None:
    """``(step, a's value, b's value)`` at the first step both lines have where they differ by
    more than ``rtol`` of the larger (see the module docstring: NaN differs from any number but
    not from NaN, an infinity from anything but itself), or None. One pass of numpy."""
    steps, ia, ib = np.intersect1d(np.asarray(a[0], dtype=np.int64),
                                   np.asarray(b[0], dtype=np.int64), return_indices=True)
    if not len(steps):
        return None
    x = np.asarray(a[1], dtype=np.float64)[ia]
    y = np.asarray(b[1], dtype=np.float64)[ib]
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(y - x) <= rtol * np.maximum(np.abs(x), np.abs(y))
    same = (x == y) | (np.isnan(x) & np.isnan(y)) | (close & np.isfinite(x) & np.isfinite(y))
    where = np.flatnonzero(~same)
    if not len(where):
        return None
    k = int(where[0])
    return int(steps[k]), float(x[k]), float(y[k])


def find_parting(series: Mapping[str, Mapping[str, Line]], labels: tuple[str, str],
                 rtol: float = DEFAULT_RTOL) -> Parting | None:
    """Where runs ``labels[0]`` and ``labels[1]`` part ways in ``series`` (``{panel: {label:
    (steps, values)}}``), or None when they agree at every step both have."""
    first, second = labels
    found: list[tuple[int, float, str, float, float]] = []  # (step, -distance, panel, a, b)
    for panel, lines in series.items():
        if first not in lines or second not in lines:
            continue
        hit = first_difference(lines[first], lines[second], rtol)
        if hit is not None:
            step, a, b = hit
            found.append((step, -_distance(a, b), panel, a, b))
    if not found:
        return None
    step = min(f[0] for f in found)
    there = sorted((f for f in found if f[0] == step), key=lambda f: (f[1], natural_key(f[2])))
    _, _, panel, a, b = there[0]
    return Parting(step, panel, a, b, ratio(a, b), [f[2] for f in there[1:]])


def _distance(a: float, b: float) -> float:
    """How far apart two differing values are: ``|log(b / a)|``, infinite for a sign change, a
    zero or a NaN on one side."""
    r = ratio(a, b)
    return abs(math.log(r)) if math.isfinite(r) and r > 0 else math.inf
