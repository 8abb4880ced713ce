"""One analysis layer, many views: a tensor's statistics over steps, histograms, and a trial's
overview, computed once here from the public reader API (``Trial``, ``Tensor``) for the
TensorBoard plugin, the MLflow summary, comparison and plots, and ``mltrace info``.

- :mod:`~mltrace.analysis.statistics`: ``thin`` (the one step thinning), ``step_statistics``,
  ``value_statistics`` (reductions as ``mltrace.reductions`` defines them).
- :mod:`~mltrace.analysis.series`: ``tensor_series`` per mode and worker, ``SeriesCache``,
  ``tensor_modes``, ``tensor_workers``.
- :mod:`~mltrace.analysis.histograms`: ``histogram``, ``tensor_histograms``, ``finite_values``,
  ``common_edges``.
- :mod:`~mltrace.analysis.overview`: ``trial_overview``, ``match_tensors``, ``format_statistic``.
- :mod:`~mltrace.analysis.heatmap`: ``tensor_heatmap`` (one statistic of many tensors over step
  buckets, min/max per bucket, non-finite values counted apart), ``statistic_steps``.
- :mod:`~mltrace.analysis.statistic_cache`: ``StatisticCache`` (what the overview read, per
  tensor and statistic) and ``StepValues``; :mod:`~mltrace.analysis.stored` keeps a trial's on
  disk (``MLTRACE_CACHE_DIR``), so that a trial is decoded once per machine.
- :mod:`~mltrace.analysis.difference`: ``difference_heatmap`` (run against run: the ratio of
  one statistic at each step, and where the runs part ways, :mod:`~mltrace.analysis.parting`).
- :mod:`~mltrace.analysis.cache`: ``LruCache``, the bounded cache of steps already read behind
  ``SeriesCache`` and ``StatisticCache``.
- :mod:`~mltrace.analysis.utils`: smdebug's ``no_refresh`` and ``refresh`` (hold a trial still
  while reading it), at smdebug's place (``smdebug.analysis.utils``).

Core: imports only the standard library, numpy and mltrace.

Example:
    >>> from mltrace.analysis import tensor_series, trial_overview
    >>> overview = trial_overview(trial)
    >>> loss = tensor_series(trial, "CrossEntropyLoss_output_0", ModeKeys.TRAIN, max_points=200)
    >>> loss.steps, loss.values["value"]
"""

from mltrace.analysis.difference import Difference, difference_heatmap
from mltrace.analysis.heatmap import (
    OVERVIEW_STATISTICS,
    Heatmap,
    HeatmapRow,
    StatisticCache,
    StepValues,
    bucket_rows,
    statistic_steps,
    tensor_heatmap,
)
from mltrace.analysis.histograms import (
    Histogram,
    HistogramSeries,
    common_edges,
    finite_values,
    histogram,
    tensor_histograms,
)
from mltrace.analysis.overview import (
    StepSpan,
    TrialOverview,
    format_statistic,
    match_tensors,
    trial_overview,
)
from mltrace.analysis.series import (
    Coverage,
    Damaged,
    Series,
    SeriesCache,
    tensor_modes,
    tensor_series,
    tensor_workers,
)
from mltrace.analysis.statistics import (
    RAW_STATISTICS,
    UNREADABLE,
    VALUE,
    step_statistics,
    thin,
    value_statistics,
)

__all__ = [
    "Difference",
    "difference_heatmap",
    "OVERVIEW_STATISTICS",
    "Heatmap",
    "HeatmapRow",
    "StatisticCache",
    "StepValues",
    "bucket_rows",
    "statistic_steps",
    "tensor_heatmap",
    "RAW_STATISTICS",
    "UNREADABLE",
    "VALUE",
    "Coverage",
    "Damaged",
    "Histogram",
    "HistogramSeries",
    "Series",
    "SeriesCache",
    "StepSpan",
    "TrialOverview",
    "common_edges",
    "finite_values",
    "format_statistic",
    "histogram",
    "match_tensors",
    "step_statistics",
    "tensor_histograms",
    "tensor_modes",
    "tensor_series",
    "tensor_workers",
    "thin",
    "trial_overview",
    "value_statistics",
]
