"""Run against run: one statistic of the same tensors in two runs as the ratio ``run / reference``
at each global step both saved, bucketed like the overview (:func:`heatmap.bucket_rows`), and
where the two runs part ways (:func:`parting.find_parting`: the first step and tensor whose
values differ by more than ``rtol``).

Two runs of the same code, seed and data are ×1 everywhere until something changes; a layer
whose weights were changed, or the first layer a different learning rate moves, is where the
ratio first leaves 1. A ratio is 1 where both values are equal (zeros, equal infinities and two
NaNs included), ±inf where only the reference's value is 0, and NaN where one run's value is NaN
and the other's is not (``parting.ratio_values``): the heat map counts those apart, so they stay
visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mltrace.analysis.heatmap import (
    MAX_COLUMNS,
    Heatmap,
    StatisticCache,
    StepValues,
    bucket_rows,
    check_statistic,
    in_mode,
    read_coarse_first,
    read_statistics,
)
from mltrace.analysis.parting import DEFAULT_RTOL, Line, Parting, find_parting, ratio_line
from mltrace.analysis.series import Damaged
from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys

if TYPE_CHECKING:
    from mltrace.trials import Trial

#: The labels of the two runs in :func:`find_parting`'s series.
_REFERENCE, _RUN = "reference", "run"


@dataclass
class Difference:
    """The ratio heat map of a run against a reference run, and where they part ways (None when
    they agree at every step both saved, or when ``heatmap.complete`` is False: not every step
    was read yet)."""

    heatmap: Heatmap
    parting: Parting | None


def _pair(reference: StepValues, run: StepValues) -> StepValues:
    return StepValues(*ratio_line((reference.steps, reference.values), (run.steps, run.values)))


def difference_heatmap(
    trial: Trial,
    reference: Trial,
    tensors: Sequence[str],
    statistic: str = "l2",
    mode: ModeKeys | None = None,
    columns: int = 400,
    cache: StatisticCache | None = None,
    deadline: float | None = None,
    rtol: float = DEFAULT_RTOL,
) -> Difference:
    """``statistic`` of each of ``tensors`` (which both trials hold) in ``trial`` over the same in
    ``reference``, at the global steps both saved (each trial's first worker), bucketed.

    Args:
        mode: only the steps of this mode (each trial's own).
        columns: at most this many buckets (1 to MAX_COLUMNS).
        cache: keeps what was read of either trial for the next call.
        deadline: a ``time.monotonic()`` after which no more steps are read (as in
            :func:`heatmap.tensor_heatmap`): the answer is then incomplete and has no parting.
        rtol: the relative difference above which two values differ.

    Raises:
        MltraceValueError: an unknown statistic, or a column count out of range.
    """
    check_statistic(statistic)
    if not 1 <= columns <= MAX_COLUMNS:
        raise MltraceValueError(f"columns={columns} is out of range: give 1 to {MAX_COLUMNS}")
    if cache is None:
        cache = StatisticCache()
    damaged: list[Damaged] = []
    read: dict[str, list[tuple[str, StepValues]]] = {}
    complete = True
    for t in (reference, trial):
        t.maybe_refresh()
        complete = read_coarse_first(t, tensors, statistic, None, cache, damaged,
                                     deadline) and complete
    for label, t in ((_REFERENCE, reference), (_RUN, trial)):
        rows = read_statistics(t, tensors, statistic, None, cache, damaged,
                               None if complete else set(), siblings=True)
        read[label] = in_mode(t, list(zip(tensors, rows)), mode)
    pairs = [(name, _pair(a, b)) for (name, a), (_, b) in zip(read[_REFERENCE], read[_RUN])]
    out = bucket_rows(pairs, statistic, columns)
    out.mode, out.damaged, out.complete = mode, list(dict.fromkeys(damaged)), complete
    if not complete:
        return Difference(out, None)
    for t in (reference, trial):
        cache.persist(t)
    series: dict[str, dict[str, Line]] = {
        name: {_REFERENCE: (a.steps, a.values), _RUN: (b.steps, b.values)}
        for (name, a), (_, b) in zip(read[_REFERENCE], read[_RUN])}
    return Difference(out, find_parting(series, (_REFERENCE, _RUN), rtol))
