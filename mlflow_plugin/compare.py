"""Compare training runs across MLflow experiments by their trials: chosen tensor statistics per
step, and what the rules found. API ``compare_runs`` and the command ``mltrace compare``.

Runs are the training runs (tag ``mltrace.trial``; rule and comparison runs are left out) of the
named experiments, or of all experiments, narrowed by an MLflow filter string, or given by id.
For each run the trial named by its ``mltrace.trial`` tag is opened and, for each chosen tensor
(names or regexes, each one's matches in natural order: ``_2`` before ``_10``; default: the
``losses`` collection; at most ``max_tensors``, the others named as left out) and statistic (a
reduction name: mean, std, l2, abs_max, ...), the statistic is read at each saved step (a stored
reduction when the hook saved one, else computed from the saved value). Rule findings come from
the run's ``mltrace.rule.<Rule>.*`` tags and from the rule results in the trial.

Two runs get a difference view (parting.py): the ratio of each statistic of the second run to
the first's at each step both saved, and the first step and tensor where they part ways (differ
by more than ``rtol``), found at every saved step (steps the thinned series skipped are read
where it matters). The text names them; the plots mark them.

Output (``out_dir``, _compare_files.py): ``comparison.csv``, ``comparison.json``, the series as
PNG pages of at most 12 panels (series_plots.py: 1600 px wide, one panel per tensor and
statistic over global steps, one line per run, log axes where values span decades, dotted lines
where a rule first fired, a dashed line where the runs part ways) and, for two runs,
``difference.png`` pages. ``Comparison.to_text`` is the table within 100 columns (_table.py) and
the notes. With ``log_to_mlflow`` the files are also logged as artifacts (``comparison/``) of a
run in experiment ``mltrace-comparisons`` (or ``log_experiment``).

Errors name the valid values: an unknown statistic, a tensor pattern that matches no tensor of
the trials, no statistic readable; a missing tracking store is an error, never created.

Example:
    >>> from mltrace_mlflow.compare import compare_runs
    >>> result = compare_runs(["baseline", "lr-sweep"], tensors=["gradient/.*conv1"], stats=["l2"])
    >>> print(result.to_text()); result.plot_paths
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mltrace.analysis.parting import DEFAULT_RTOL, Parting, find_parting, ratio_panels
from mltrace.exceptions import MltraceValueError
from mltrace.reductions import parse_statistic

from . import _compare_files, _compare_read, _keys, _tracking
from ._table import comparison_text, shorten

if TYPE_CHECKING:
    from mltrace.trials import Trial

logger = logging.getLogger(__name__)

DEFAULT_LOG_EXPERIMENT = "mltrace-comparisons"
#: Tensors compared at most (the first in natural order); 0 compares every tensor matched.
DEFAULT_MAX_TENSORS = 48

#: ``{panel: {run label: (steps, values)}}``
Series = dict[str, dict[str, tuple[list[int], list[float]]]]


@dataclass
class Comparison:
    """What compare_runs found and wrote."""

    rows: list[dict[str, Any]]
    series: Series
    findings: dict[str, dict[str, dict[str, Any]]]
    out_dir: str
    plot_path: str | None = None
    table_path: str | None = None
    json_path: str | None = None
    mlflow_run_id: str | None = None
    columns: list[str] = field(default_factory=list)
    #: the figures' title: "1 run", "3 runs"
    title: str = ""
    #: the tensors compared, in order, and those ``max_tensors`` left out
    tensors: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    #: every page of the series (``plot_path`` is the first)
    plot_paths: list[str] = field(default_factory=list)
    #: the run labels, in the rows' order
    labels: list[str] = field(default_factory=list)
    #: two runs: the ratios ``{panel: {"b / a": (steps, ratios)}}``, where they part ways (None:
    #: they agree within ``rtol``) and the ratio pages
    difference: Series = field(default_factory=dict)
    parting: Parting | None = None
    rtol: float = DEFAULT_RTOL
    difference_paths: list[str] = field(default_factory=list)

    def to_dataframe(self) -> Any:
        """The table as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=self.columns or None)

    def to_text(self, width: int = 100) -> str:
        """The table as text of at most ``width`` columns (names shortened in the middle; the
        CSV has every column in full), then the tensors left out and where two runs part ways."""
        values = [c for c in self.columns if c.endswith(" (last)")]
        notes = [line for note in (self._left_out_note(), self._parting_note()) if note
                 for line in ["", *textwrap.wrap(note, width, subsequent_indent="  ")]]
        return "\n".join([comparison_text(self.rows, values, self.findings, width), *notes])

    def _left_out_note(self) -> str | None:
        if not self.left_out:
            return None
        total = len(self.tensors) + len(self.left_out)
        names = ", ".join(shorten(n, 40) for n in self.left_out[:3])
        if len(self.left_out) > 3:
            names += f", …, {shorten(self.left_out[-1], 40)}"
        return (f"compared the first {len(self.tensors)} of {total} tensors (natural order; "
                f"--max-tensors 0 compares them all); left out {len(self.left_out)}: {names} "
                "(every name in comparison.json)")

    def _parting_note(self) -> str | None:
        if len(self.labels) != 2 or not self.difference:
            return None
        if self.parting is None:
            return (f"runs 1 and 2 agree at every step both saved (within {self.rtol:g} of "
                    "each value)")
        p = self.parting
        also = f"; also parting there: {', '.join(p.others)}" if p.others else ""
        return (f"runs 1 and 2 part ways at step {p.step}: {p.tensor} {p.statistic} is "
                f"{p.ratio:.4g} x (run 1: {p.value_a:.5g}, run 2: {p.value_b:.5g}){also}")


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
                 log_experiment: str = DEFAULT_LOG_EXPERIMENT,
                 max_tensors: int = DEFAULT_MAX_TENSORS, rtol: float = DEFAULT_RTOL) -> Comparison:
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
        max_tensors: compare at most this many tensors, the first in natural order (0: all).
        rtol: two runs part ways where a statistic differs by more than this fraction.

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
    trials, errors = _compare_read.open_trials(runs)
    patterns = list(tensors or []) or _compare_read.default_tensors(next(iter(trials.values()),
                                                                         None))
    _compare_read.check_tensors(trials, patterns)
    chosen, left_out = _compare_read.select_tensors(trials, patterns, max_tensors)
    result = _tabulate(runs, exp_names, trials, errors, chosen, stats, max_steps, out_dir)
    if trials and not result.series:
        raise MltraceValueError(
            f"none of the statistics {stats} could be read for tensors {patterns} in these runs: "
            "the hooks saved neither the raw values nor these reductions. Choose another "
            f"--stat; {_compare_read.available_statistics(trials, patterns)}")
    result.left_out, result.rtol = left_out, rtol
    if len(runs) == 2:
        _difference(result, [trials.get(r.info.run_id) for r in runs])
    query = {"experiments": experiments, "filter": filter_string, "tensors": patterns,
             "stats": stats}
    _compare_files.write_files(result, query)
    if log_to_mlflow:
        result.mlflow_run_id = _compare_files.log_comparison(
            client, result, [r.info.run_id for r in runs], query, log_experiment)
    return result


def _tabulate(runs: list[Any], exp_names: dict[str, str], trials: dict[str, Trial],
              errors: dict[str, str], names: list[str], stats: list[str], max_steps: int,
              out_dir: str) -> Comparison:
    """One row per run (its last value of each statistic, its rule findings), and the series,
    in the order of ``names`` and ``stats``."""
    labels = _labels(runs, exp_names)
    result = Comparison(rows=[], series={}, findings={}, out_dir=out_dir, tensors=names,
                        title=f"{len(runs)} run{'' if len(runs) == 1 else 's'}",
                        labels=[labels[r.info.run_id] for r in runs])
    read: dict[tuple[str, str], dict[str, tuple[list[int], list[float]]]] = {}
    for run in runs:
        rid, label = run.info.run_id, labels[run.info.run_id]
        trial = trials.get(rid)
        row: dict[str, Any] = {
            "run": label, "run_id": rid, "experiment": exp_names.get(run.info.experiment_id),
            "status": run.info.status, "trial": run.data.tags.get(_keys.TAG_TRIAL),
            "steps": len(trial.steps()) if trial is not None else None}
        for key, (steps, values) in _compare_read.read_statistics(trial, names, stats,
                                                                  max_steps).items():
            read.setdefault(key, {})[label] = (steps, values)
            row[f"{key[0]} {key[1]} (last)"] = values[-1]
        found = result.findings[label] = _findings(run, trial)
        row["rules"] = _rules_cell(found)
        if rid in errors:
            row["error"] = errors[rid]
        result.rows.append(row)
    order = [(n, s) for n in names for s in stats if (n, s) in read]
    result.series = {f"{n} · {s}": read[(n, s)] for n, s in order}
    result.columns = ["run", "experiment", "run_id", "status", "steps",
                      *[f"{n} {s} (last)" for n, s in order], "rules", "trial",
                      *(["error"] if errors else [])]
    return result


def _difference(result: Comparison, trials: list[Trial | None]) -> None:
    """The ratios of the two runs, and where they part ways: first in the series read, then
    in the steps the thinned series skipped before that step (read now)."""
    labels = (result.labels[0], result.labels[1])
    result.difference = ratio_panels(result.series, labels)
    parting = find_parting(result.series, labels, result.rtol)
    if parting is None or None in trials:
        result.parting = parting
        return
    window: Series = {}
    for panel, lines in result.series.items():
        if labels[0] not in lines or labels[1] not in lines:
            continue
        before = [s for s in lines[labels[0]][0] if s < parting.step]
        name, stat = panel.rsplit(" · ", 1)
        after = before[-1] if before else -1
        window[panel] = {label: _compare_read.read_between(trial, name, stat, after,
                                                           parting.step)
                         for label, trial in zip(labels, trials) if trial is not None}
    earlier = find_parting(window, labels, result.rtol)
    result.parting = earlier if earlier is not None and earlier.step < parting.step else parting


def _check_statistic(stat: str) -> None:
    """Raise MltraceValueError naming ``stat`` and every valid statistic."""
    from mltrace.reductions import REDUCTION_NAMES

    try:
        parse_statistic(stat)
    except MltraceValueError:
        raise MltraceValueError(
            f"--stat {stat!r} is not a statistic; valid: {', '.join(REDUCTION_NAMES)}, each also "
            "as abs_<name> (e.g. abs_max)") from None


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


def _rules_cell(found: dict[str, dict[str, Any]]) -> str | None:
    """The table's ``rules`` cell: ``Rule: status @first step; ...`` (None when no rule ran)."""
    return "; ".join(
        f"{rule}: {f.get('status', '?')}" + (f" @{f['first_step']}" if f.get("first_step") else "")
        for rule, f in sorted(found.items())) or None


def _terminal_width() -> int:
    """100 columns, or fewer on a narrower terminal (COLUMNS, else the terminal's size)."""
    import shutil

    return max(60, min(100, shutil.get_terminal_size((100, 24)).columns))


# -- the `mltrace compare` command (its arguments are declared in command.py) --------------
def run_cli(args: argparse.Namespace) -> int:
    """Run ``mltrace compare``; prints the table and where the files are."""
    result = compare_runs(args.experiments or None, args.filter, args.run_id, args.tensor,
                          args.stat, args.out, max_runs=args.max_runs,
                          tracking_uri=args.tracking_uri, log_to_mlflow=not args.no_log,
                          log_experiment=args.log_experiment, max_tensors=args.max_tensors,
                          rtol=args.rtol)
    print(result.to_text(width=_terminal_width()))
    pages = "\n  ".join(result.plot_paths) or "-"
    print(f"\nevery column in full (CSV):\n  {result.table_path}\nplot (PNG):\n  {pages}")
    if result.difference_paths:
        print("ratios of run 2 to run 1 (PNG):\n  " + "\n  ".join(result.difference_paths))
    if result.mlflow_run_id:
        print(f"logged as MLflow run {result.mlflow_run_id} (artifacts under comparison/)")
    return 0
