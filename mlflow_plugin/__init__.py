"""MLflow side of mltrace: a hook's MLflow sink (``Hook(..., mlflow=True)``), rule executions as
MLflow runs, the run-context provider, comparison of runs across experiments, and the plots of
the SageMaker Debugger tensor-analysis notebook. mltrace's core never imports this package; names are loaded on first use, so that
``import mltrace_mlflow`` imports neither MLflow nor matplotlib.

    sink.py      MlflowSink: batched metrics off the training thread, params, tags, artifacts
                 (one part per concern in _sink_*.py)
    rules.py     MlflowRuleListener (entry point mltrace.rule_listeners)
    context.py   MltraceRunContextProvider (entry point mlflow.run_context_provider)
    compare.py   compare_runs / `mltrace compare` (mltrace.analysis.parting: where two runs part;
                 series_plots.py: its PNG pages)
    plots.py     plot_distributions, compare_trials, create_interactive_matplotlib_histogram
    summary.py   trial_summary, summary_html (the run's summary artifact)
    description.py  the training run's Markdown description (trial, steps, rule findings)
    links.py     links into the MLflow UI's machine-learning view (workflowType, experiment kind)
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "compare_runs": "compare", "Comparison": "compare",
    "plot_distributions": "plots", "compare_trials": "plots",
    "create_interactive_matplotlib_histogram": "plots", "tensor_values": "plots",
    "trial_summary": "summary", "summary_html": "summary",
    "MlflowSink": "sink", "create_sink": "sink",
    "MlflowRuleListener": "rules", "MltraceRunContextProvider": "context",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'mltrace_mlflow' has no attribute {name!r}")
    return getattr(importlib.import_module(f"mltrace_mlflow.{module}"), name)
