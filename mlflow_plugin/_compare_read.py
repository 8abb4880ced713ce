"""What ``mltrace compare`` reads from the runs' trials: which tensors (in natural order, at most
``max_tensors``), their statistics over steps, and the errors that name the valid choices.

Tensors: each pattern's matches in every trial, in natural order (``Sequential_2`` before
``Sequential_10``: mltrace.analysis.order.natural_key), the patterns in the order given, each
tensor once; the first ``max_tensors`` are compared and the rest are named as left out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mltrace import analysis
from mltrace.analysis.order import natural_sorted
from mltrace.exceptions import MltraceError, MltraceValueError
from mltrace.modes import ModeKeys

from . import _keys

if TYPE_CHECKING:
    from mltrace.trials import Trial

logger = logging.getLogger("mltrace_mlflow.compare")

#: ``{(tensor, statistic): (global steps, values)}``
Statistics = dict[tuple[str, str], tuple[list[int], list[float]]]


def open_trials(runs: list[Any]) -> tuple[dict[str, Trial], dict[str, str]]:
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


def default_tensors(trial: Trial | None) -> list[str]:
    """The tensors compared when none are named: the first trial's losses, else its first four
    (natural order)."""
    if trial is None:
        return []
    try:
        losses = natural_sorted(trial.tensor_names(collection="losses"))[:4]
    except MltraceError:
        losses = []
    return losses or natural_sorted(trial.tensor_names())[:4]


def check_tensors(trials: dict[str, Trial], patterns: list[str]) -> None:
    """Raise MltraceValueError when a pattern matches no tensor of any trial, listing the
    tensors there are (the first 40 in natural order, and how many in all)."""
    if not trials:
        return
    for pattern in patterns:
        try:
            matched = any(analysis.match_tensors(t, [pattern]) for t in trials.values())
        except Exception as exc:  # re.error: not a valid regular expression
            raise MltraceValueError(f"--tensor {pattern!r} is not a valid regular expression: "
                                    f"{exc}") from None
        if not matched:
            names = natural_sorted({n for t in trials.values() for n in t.tensor_names()})
            shown = ", ".join(names[:40]) + (f", ... ({len(names)} in all)" if len(names) > 40
                                              else "")
            raise MltraceValueError(
                f"--tensor {pattern!r} matches no tensor of the {len(trials)} trial(s) compared "
                f"(a name or a regular expression, re.search); valid tensors: {shown}")


def select_tensors(trials: dict[str, Trial], patterns: list[str],
                   max_tensors: int) -> tuple[list[str], list[str]]:
    """(the tensors compared, the tensors left out by ``max_tensors``; 0: none left out)."""
    names: list[str] = []
    for pattern in patterns:
        found = {n for t in trials.values() for n in analysis.match_tensors(t, [pattern])}
        names += [n for n in natural_sorted(found) if n not in names]
    if max_tensors > 0 and len(names) > max_tensors:
        return names[:max_tensors], names[max_tensors:]
    return names, []


def available_statistics(trials: dict[str, Trial], patterns: list[str]) -> str:
    """Which statistics the first matching tensor has at its last step, as a sentence."""
    for trial in trials.values():
        for name in analysis.match_tensors(trial, patterns):
            steps = trial.tensor(name).steps()
            if steps:
                row = analysis.step_statistics(trial.tensor(name), steps[-1])
                return f"{name} has: {', '.join(sorted(row or {})) or 'nothing readable'}"
    return "no matching tensor has a step"


def read_statistics(trial: Trial | None, names: Sequence[str], stats: list[str],
                    max_steps: int) -> Statistics:
    """The statistics of the tensors ``names`` that ``trial`` has (global steps, at most
    ``max_steps`` spread evenly; steps without the statistic left out), in the order of
    ``names``."""
    out: Statistics = {}
    if trial is None:
        return out
    for name in names:
        if not trial.has_tensor(name):
            continue
        series = analysis.tensor_series(trial, name, max_points=max_steps, names=stats)
        for stat in stats:
            values = series.values.get(stat, [])
            points = [(s, v) for s, v in zip(series.steps, values) if v is not None]
            if points:
                out[(name, stat)] = ([s for s, _ in points], [v for _, v in points])
    return out


def read_between(trial: Trial, name: str, stat: str, after: int,
                 before: int) -> tuple[list[int], list[float]]:
    """``stat`` of ``name`` at every saved global step strictly between ``after`` and
    ``before`` (the steps an evenly thinned series skipped there)."""
    if not trial.has_tensor(name):
        return [], []
    tensor = trial.tensor(name)
    steps, values = [], []
    for step in tensor.steps(ModeKeys.GLOBAL):
        if after < step < before:
            try:
                row = analysis.step_statistics(tensor, step, ModeKeys.GLOBAL, None, [stat])
            except MltraceError:
                continue
            if row and stat in row:
                steps.append(step)
                values.append(row[stat])
    return steps, values
