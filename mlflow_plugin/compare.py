"""Compare training runs across MLflow experiments by their trials: chosen tensor statistics per
step, and what the rules found. API ``compare_runs`` and the command ``mltrace compare``.

Runs are the training runs (tag ``mltrace.trial``; rule and comparison runs are left out) of the
named experiments, or of all experiments, narrowed by an MLflow filter string, or given by id.
For each run the trial named by its ``mltrace.trial`` tag is opened and, for each chosen tensor
(names or regexes; default: the ``losses`` collection) and statistic (a reduction name: mean,
std, l2, abs_max, ...), the statistic is read at each saved step (a stored reduction when the
hook saved one, else computed from the saved value). Rule findings come from the run's
``mltrace.rule.<Rule>.*`` tags and from the rule results in the trial.

Output (``out_dir``): ``comparison.csv`` (the table, every column in full), ``comparison.json``
(table, series, findings), ``comparison.png`` (plots.series_figure: 1600 px, one panel per tensor
and statistic over global steps, one line per run, log axes where values span decades, dotted
lines where a rule first fired). ``Comparison.to_text`` is the table within 100 columns
(_table.py). With ``log_to_mlflow`` the three files are also logged as artifacts
(``comparison/``) of a run in experiment ``mltrace-comparisons`` (or ``log_experiment``).

Errors name the valid values: an unknown statistic, a tensor pattern that matches no tensor of
the trials, no statistic readable; a missing tracking store is an error, never created.

Example:
    >>> from mltrace_mlflow.compare import compare_runs
    >>> result = compare_runs(["baseline", "lr-sweep"], tensors=["gradient/.*conv1"], stats=["l2"])
    >>> print(result.to_text()); result.plot_path
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mltrace import analysis
from mltrace.exceptions import MltraceError, MltraceValueError
from mltrace.reductions import parse_statistic

from . import _keys, _tracking, links
from ._table import comparison_text

if TYPE_CHECKING:
    from mltrace.trials import Trial

logger = logging.getLogger(__name__)

DEFAULT_LOG_EXPERIMENT = "mltrace-comparisons"


@dataclass
class Comparison:
    """What compare_runs found and wrote."""

    rows: list[dict[str, Any]]
    series: dict[str, dict[str, tuple[list[int], list[float]]]]
    findings: dict[str, dict[str, dict[str, Any]]]
    out_dir: str
    plot_path: str | None = None
    table_path: str | None = None
    json_path: str | None = None
    mlflow_run_id: str | None = None
    columns: list[str] = field(default_factory=list)

    def to_dataframe(self) -> Any:
        """The table as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=self.columns or None)

    def to_text(self, width: int = 100) -> str:
        """The table as text of at most ``width`` columns (names shortened in the middle; the
        CSV has every column in full)."""
        values = [c for c in self.columns if c.endswith(" (last)")]
        return comparison_text(self.rows, values, self.findings, width)


def _find_runs(client: Any, experiments: list[str] | None, filter_string: str,
               run_ids: list[str] | None, max_runs: int) -> tuple[list[Any], dict[str, str]]:
    names: dict[str, str] = {}
    if run_ids:
        runs = [client.get_run(r) for r in run_ids]
    else:
        if experiments:
            ids = []
            for name in experiments:
                exp = client.get_experiment_by_name(name)
                if exp is None:
                    known = sorted(e.name for e in client.search_experiments())
                    raise MltraceValueError(
                        f"no MLflow experiment named {name!r} at {client.tracking_uri}; "
                        f"experiments there: {known}")
                ids.append(exp.experiment_id)
        else:
            ids = [e.experiment_id for e in client.search_experiments()]
        clause = f"tags.`{_keys.TAG_TRIAL}` IS NOT NULL"
        full = f"{filter_string} AND {clause}" if filter_string.strip() else clause
        try:
            runs = list(client.search_runs(ids, full, max_results=max_runs * 4,
                                           order_by=["attributes.start_time ASC"]))
        except Exception as exc:
            raise MltraceValueError(
                f"MLflow could not search runs with filter {filter_string!r}: {exc}") from None
    training = [r for r in runs if r.data.tags.get(_keys.TAG_RUN_TYPE, "training") == "training"]
    runs = training[:max_runs]
    for r in runs:
        if r.info.experiment_id not in names:
            names[r.info.experiment_id] = client.get_experiment(r.info.experiment_id).name
    return runs, names


def _findings(run: Any, trial: Any) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    prefix = _keys.RULE_TAG_PREFIX
    for key, value in run.data.tags.items():
        if key.startswith(prefix) and key.count(".") >= 3:
            rule, _, fld = key[len(prefix):].rpartition(".")
            found.setdefault(rule, {})[fld] = value
    if trial is not None:
        try:
            from mltrace.rules.results import read_results

            for r in read_results(trial.storage):
                entry = found.setdefault(r.rule, {})
                entry.setdefault("status", r.status)
                if r.first_step is not None:
                    entry.setdefault("first_step", str(r.first_step))
                    entry.setdefault("message", r.message or "")
        except Exception as exc:
            logger.debug("rule results of %s: %s", trial.path, exc)
    return found


def compare_runs(experiments: list[str] | None = None, filter_string: str = "",
                 run_ids: list[str] | None = None, tensors: list[str] | None = None,
                 stats: list[str] | None = None, out_dir: str | None = None, max_runs: int = 20,
                 max_steps: int = 500, tracking_uri: str | None = None, log_to_mlflow: bool = True,
                 log_experiment: str = DEFAULT_LOG_EXPERIMENT) -> Comparison:
    """Compare the training runs of ``experiments`` (names) matching ``filter_string`` (or the
    runs ``run_ids``) by tensor statistics per step and rule findings (see the module docstring).

    Args:
        experiments: experiment names (default: all experiments).
        filter_string: an MLflow search filter, e.g. ``"params.lr = '0.1'"``.
        run_ids: compare exactly these runs instead.
        tensors: tensor names or regexes (default: the ``losses`` collection, at most 4).
        stats: statistics per step (default ``["mean"]``); ``abs_`` prefixes allowed.
        out_dir: where the files go (default: a new temporary folder).
        max_runs, max_steps: caps on runs, and on steps per series (spread evenly).
        tracking_uri: the MLflow tracking URI (default: MLflow's).
        log_to_mlflow: also log the files as artifacts of a comparison run.
        log_experiment: that run's experiment.

    Returns:
        a Comparison (rows, series, findings, file paths, the comparison run id).

    Raises:
        MltraceValueError: unknown experiment or statistic, bad filter, or no run found.
    """
    from mlflow import MlflowClient

    stats = list(stats or ["mean"])
    for stat in stats:  # an unknown name fails now, with the valid ones listed
        _check_statistic(stat)
    client = MlflowClient(tracking_uri=_tracking.existing_store(tracking_uri))
    runs, exp_names = _find_runs(client, experiments, filter_string, run_ids, max_runs)
    if not runs:
        raise MltraceValueError(
            f"no mltrace training run (tag {_keys.TAG_TRIAL}) in experiments {experiments or 'all'}"
            + (f" matching {filter_string!r}" if filter_string else ""))
    out_dir = out_dir or tempfile.mkdtemp(prefix="mltrace-compare-")
    os.makedirs(out_dir, exist_ok=True)
    trials, errors = _open_trials(runs)
    patterns = list(tensors or []) or _default_tensors(next(iter(trials.values()), None))
    _check_tensors(trials, patterns)
    result = _tabulate(runs, exp_names, trials, errors, patterns, stats, max_steps, out_dir)
    if trials and not result.series:
        raise MltraceValueError(
            f"none of the statistics {stats} could be read for tensors {patterns} in these runs: "
            "the hooks saved neither the raw values nor these reductions. Choose another "
            f"--stat; {_available_statistics(trials, patterns)}")
    _write(result, runs, experiments, filter_string, patterns, stats)
    if log_to_mlflow:
        result.mlflow_run_id = _log(client, result, runs, experiments, filter_string, patterns,
                                    stats, log_experiment)
    return result


def _tabulate(runs: list[Any], exp_names: dict[str, str], trials: dict[str, Trial],
              errors: dict[str, str], patterns: list[str], stats: list[str], max_steps: int,
              out_dir: str) -> Comparison:
    """One row per run (its last value of each statistic, its rule findings), and the series."""
    labels = _labels(runs, exp_names)
    result = Comparison(rows=[], series={}, findings={}, out_dir=out_dir)
    value_columns: list[str] = []
    for run in runs:
        rid, label = run.info.run_id, labels[run.info.run_id]
        trial = trials.get(rid)
        row: dict[str, Any] = {
            "run": label, "run_id": rid, "experiment": exp_names.get(run.info.experiment_id),
            "status": run.info.status, "trial": run.data.tags.get(_keys.TAG_TRIAL),
            "steps": len(trial.steps()) if trial is not None else None}
        for (name, stat), (steps, values) in _statistics(trial, patterns, stats, max_steps).items():
            result.series.setdefault(f"{name} · {stat}", {})[label] = (steps, values)
            column = f"{name} {stat} (last)"
            row[column] = values[-1]
            if column not in value_columns:
                value_columns.append(column)
        found = result.findings[label] = _findings(run, trial)
        row["rules"] = _rules_cell(found)
        if rid in errors:
            row["error"] = errors[rid]
        result.rows.append(row)
    result.columns = ["run", "experiment", "run_id", "status", "steps", *value_columns, "rules",
                      "trial", *(["error"] if errors else [])]
    return result


def _check_statistic(stat: str) -> None:
    """Raise MltraceValueError naming ``stat`` and every valid statistic."""
    from mltrace.reductions import REDUCTION_NAMES

    try:
        parse_statistic(stat)
    except MltraceValueError:
        raise MltraceValueError(
            f"--stat {stat!r} is not a statistic; valid: {', '.join(REDUCTION_NAMES)}, each also "
            "as abs_<name> (e.g. abs_max)") from None


def _check_tensors(trials: dict[str, Trial], patterns: list[str]) -> None:
    """Raise MltraceValueError when a pattern matches no tensor of any trial, listing the
    tensors there are (the first 40 of the first trial, and how many in all)."""
    if not trials:
        return
    for pattern in patterns:
        try:
            matched = any(analysis.match_tensors(t, [pattern]) for t in trials.values())
        except Exception as exc:  # re.error: not a valid regular expression
            raise MltraceValueError(f"--tensor {pattern!r} is not a valid regular expression: "
                                    f"{exc}") from None
        if not matched:
            names = sorted({n for t in trials.values() for n in t.tensor_names()})
            shown = ", ".join(names[:40]) + (f", ... ({len(names)} in all)" if len(names) > 40
                                              else "")
            raise MltraceValueError(
                f"--tensor {pattern!r} matches no tensor of the {len(trials)} trial(s) compared "
                f"(a name or a regular expression, re.search); valid tensors: {shown}")


def _available_statistics(trials: dict[str, Trial], patterns: list[str]) -> str:
    """Which statistics the first matching tensor has at its last step, as a sentence."""
    for trial in trials.values():
        for name in analysis.match_tensors(trial, patterns):
            steps = trial.tensor(name).steps()
            if steps:
                row = analysis.step_statistics(trial.tensor(name), steps[-1])
                return f"{name} has: {', '.join(sorted(row or {})) or 'nothing readable'}"
    return "no matching tensor has a step"


def _open_trials(runs: list[Any]) -> tuple[dict[str, Trial], dict[str, str]]:
    """The trial of each run (its ``mltrace.trial`` tag), and why the others cannot be read."""
    from mltrace.trials import create_trial

    trials: dict[str, Trial] = {}
    errors: dict[str, str] = {}
    for run in runs:
        try:
            trials[run.info.run_id] = create_trial(run.data.tags[_keys.TAG_TRIAL], timeout=2)
        except Exception as exc:
            errors[run.info.run_id] = f"{type(exc).__name__}: {exc}"
            logger.warning("run %s: trial %s unreadable: %s", run.info.run_id,
                           run.data.tags[_keys.TAG_TRIAL], exc)
    return trials, errors


def _default_tensors(trial: Trial | None) -> list[str]:
    """The tensors compared when none are named: the first trial's losses, else its first four."""
    if trial is None:
        return []
    try:
        losses = trial.tensor_names(collection="losses")[:4]
    except MltraceError:
        losses = []
    return losses or trial.tensor_names()[:4]


def _labels(runs: list[Any], exp_names: dict[str, str]) -> dict[str, str]:
    """``experiment/run name`` per run id, made unique with the run id where names repeat."""
    labels: dict[str, str] = {}
    for run in runs:
        experiment = exp_names.get(run.info.experiment_id, run.info.experiment_id)
        label = f"{experiment}/{run.info.run_name}"
        if label in labels.values():
            label = f"{label} ({run.info.run_id[:8]})"
        labels[run.info.run_id] = label
    return labels


def _statistics(trial: Trial | None, patterns: list[str], stats: list[str],
                max_steps: int) -> dict[tuple[str, str], tuple[list[int], list[float]]]:
    """``{(tensor, statistic): (steps, values)}`` of the tensors matching ``patterns`` (global
    steps, at most ``max_steps`` spread evenly; steps without the statistic left out)."""
    out: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    if trial is None:
        return out
    for name in analysis.match_tensors(trial, patterns):
        series = analysis.tensor_series(trial, name, max_points=max_steps, names=stats)
        for stat in stats:
            values = series.values.get(stat, [])
            points = [(s, v) for s, v in zip(series.steps, values) if v is not None]
            if points:
                out[(name, stat)] = ([s for s, _ in points], [v for _, v in points])
    return out


def _rules_cell(found: dict[str, dict[str, Any]]) -> str | None:
    """The table's ``rules`` cell: ``Rule: status @first step; ...`` (None when no rule ran)."""
    return "; ".join(
        f"{rule}: {f.get('status', '?')}" + (f" @{f['first_step']}" if f.get("first_step") else "")
        for rule, f in sorted(found.items())) or None


def _write(result: Comparison, runs: list[Any], experiments: Any, filter_string: str,
           patterns: list[str], stats: list[str]) -> None:
    """comparison.csv, comparison.json and (when a statistic was read) comparison.png."""
    result.table_path = os.path.join(result.out_dir, "comparison.csv")
    with open(result.table_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=result.columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(result.rows)
    result.json_path = os.path.join(result.out_dir, "comparison.json")
    with open(result.json_path, "w", encoding="utf-8") as f:
        json.dump({"experiments": experiments, "filter": filter_string, "tensors": patterns,
                   "stats": stats, "rows": result.rows, "series": result.series,
                   "findings": result.findings}, f, indent=1, default=str)
    if result.series:
        from .plots import plot_series

        markers = {label: {rule: int(f["first_step"]) for rule, f in found.items()
                           if f.get("status") == "IssuesFound"
                           and str(f.get("first_step", "")).lstrip("-").isdigit()}
                   for label, found in result.findings.items()}
        png = os.path.join(result.out_dir, "comparison.png")
        result.plot_path = plot_series(result.series, png, markers, title=f"{len(runs)} runs")
    else:
        logger.warning("no statistic could be read for tensors %s: no plot", patterns)


def _log(client: Any, result: Comparison, runs: list[Any], experiments: Any, filter_string: str,
         patterns: list[str], stats: list[str], log_experiment: str) -> str:
    exp_id = _tracking.experiment_id_for(client, log_experiment)
    run = client.create_run(exp_id, run_name=f"compare {len(runs)} runs", tags={
        _keys.TAG_RUN_TYPE: "comparison",
        "mltrace.compared_runs": _keys.tag_value(",".join(r.info.run_id for r in runs)),
    })
    from mlflow.entities import Param

    params = [Param("experiments", _keys.param_value(",".join(experiments or []) or "all")),
              Param("filter", _keys.param_value(filter_string or "-")),
              Param("tensors", _keys.param_value(",".join(patterns) or "-")),
              Param("stats", _keys.param_value(",".join(stats)))]
    client.log_batch(run.info.run_id, params=params, synchronous=True)
    for path in (result.table_path, result.json_path, result.plot_path):
        if path:
            client.log_artifact(run.info.run_id, path, "comparison")
    links.end_run(client, run.info.run_id, "FINISHED")
    return run.info.run_id


def _terminal_width() -> int:
    """100 columns, or fewer on a narrower terminal (COLUMNS, else the terminal's size)."""
    import shutil

    return max(60, min(100, shutil.get_terminal_size((100, 24)).columns))


# -- the `mltrace compare` command (its arguments are declared in mltrace.cli) ---------------------
def run_cli(args: argparse.Namespace) -> int:
    """Run ``mltrace compare``; prints the table and where the files are."""
    result = compare_runs(args.experiments or None, args.filter, args.run_id, args.tensor,
                          args.stat, args.out, max_runs=args.max_runs,
                          tracking_uri=args.tracking_uri, log_to_mlflow=not args.no_log,
                          log_experiment=args.log_experiment)
    print(result.to_text(width=_terminal_width()))
    print(f"\nevery column in full (CSV):\n  {result.table_path}\nplot (PNG):\n  "
          f"{result.plot_path or '-'}")
    if result.mlflow_run_id:
        print(f"logged as MLflow run {result.mlflow_run_id} (artifacts under comparison/)")
    return 0
