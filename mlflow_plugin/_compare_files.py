"""The files of ``mltrace compare`` and the MLflow run they are logged to.

In the output folder: ``comparison.csv`` (the table, every column in full), ``comparison.json``
(table, series, findings, the tensors left out, where two runs part ways and the ratios), the
series as PNG pages of at most 12 panels (``comparison.png``, or ``comparison-1.png``,
``comparison-2.png``, ... when there are more panels), and for two runs the ratios of the
statistics that differ at some step as ``difference.png`` (or ``difference-<n>.png``). With ``log_to_mlflow`` they are logged as
artifacts (``comparison/``) of a run of type ``comparison``.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from mltrace.analysis.parting import find_parting

from . import _keys, _tracking, links
from .series_plots import Mark

if TYPE_CHECKING:
    from .compare import Comparison

logger = logging.getLogger("mltrace_mlflow.compare")


def write_files(result: Comparison, query: dict[str, Any]) -> None:
    """The CSV, the JSON and the PNG pages of ``result`` in ``result.out_dir`` (``query``:
    experiments, filter, tensors, stats, as asked)."""
    result.table_path = os.path.join(result.out_dir, "comparison.csv")
    with open(result.table_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=result.columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(result.rows)
    result.json_path = os.path.join(result.out_dir, "comparison.json")
    with open(result.json_path, "w", encoding="utf-8") as f:
        json.dump({**query, "title": result.title, "compared_tensors": result.tensors,
                   "left_out_tensors": result.left_out, "rows": result.rows,
                   "series": result.series, "findings": result.findings,
                   "parting": asdict(result.parting) if result.parting else None,
                   "rtol": result.rtol, "difference": result.difference}, f, indent=1,
                  default=str)
    if not result.series:
        logger.warning("no statistic could be read for tensors %s: no plot", query["tensors"])
        return
    from .series_plots import series_pages

    mark = parting_mark(result)
    result.plot_paths = series_pages(result.series,
                                     os.path.join(result.out_dir, "comparison.png"),
                                     rule_markers(result), result.title, mark)
    result.plot_path = result.plot_paths[0]
    differing = differing_panels(result)
    if differing:
        first, second = result.labels
        result.difference_paths = series_pages(
            {panel: result.difference[panel] for panel in differing},
            os.path.join(result.out_dir, "difference.png"),
            title=f"{second} / {first}: the {len(differing)} of {len(result.difference)} "
                  "statistics that differ (a ratio of 1: the runs agree)", mark=mark)


def differing_panels(result: Comparison) -> list[str]:
    """The panels of the difference view where the two runs differ at some step: the others
    are lines at 1, left out of the ratio pages (the text says the runs agree there)."""
    labels = (result.labels[0], result.labels[1]) if len(result.labels) == 2 else None
    if labels is None:
        return []
    return [panel for panel in result.difference
            if find_parting({panel: result.series[panel]}, labels, result.rtol) is not None]


def rule_markers(result: Comparison) -> dict[str, dict[str, int]]:
    """``{run label: {rule: first step}}`` of the rules that fired."""
    return {label: {rule: int(f["first_step"]) for rule, f in found.items()
                    if f.get("status") == "IssuesFound"
                    and str(f.get("first_step", "")).lstrip("-").isdigit()}
            for label, found in result.findings.items()}


def parting_mark(result: Comparison) -> Mark | None:
    """The mark the pages draw where the two runs part ways (None when they do not)."""
    parting = result.parting
    if parting is None:
        return None
    return Mark(parting.step, f"the runs part ways at step {parting.step}: {parting.panel}",
                parting.panel, "► parts ways here: ")


def log_comparison(client: Any, result: Comparison, run_ids: list[str], query: dict[str, Any],
                   log_experiment: str) -> str:
    """Log the files as artifacts of a new run in ``log_experiment``; its id."""
    from mlflow.entities import Param

    exp_id = _tracking.experiment_id_for(client, log_experiment)
    run = client.create_run(exp_id, run_name=f"compare {len(run_ids)} runs", tags={
        _keys.TAG_RUN_TYPE: "comparison",
        "mltrace.compared_runs": _keys.tag_value(",".join(run_ids)),
    })
    params = [Param("experiments", _keys.param_value(",".join(query["experiments"] or [])
                                                     or "all")),
              Param("filter", _keys.param_value(query["filter"] or "-")),
              Param("tensors", _keys.param_value(",".join(query["tensors"]) or "-")),
              Param("stats", _keys.param_value(",".join(query["stats"])))]
    client.log_batch(run.info.run_id, params=params, synchronous=True)
    paths = [result.table_path, result.json_path, *result.plot_paths, *result.difference_paths]
    for path in paths:
        if path:
            client.log_artifact(run.info.run_id, path, "comparison")
    links.end_run(client, run.info.run_id, "FINISHED")
    return str(run.info.run_id)
