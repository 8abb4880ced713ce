"""What the MCP server's tools answer: plain functions over a :class:`~mltrace.mcp.root.TrialRoot`
that return JSON-ready dicts, so that they are tested, and usable, without the MCP SDK
(mltrace.mcp.server registers them as tools).

Every answer is bounded (at most a given number of trials, tensors, steps or results, with a note
saying how many more there are and how to see them), and every bad argument raises an
MltraceError that names the value and the fix. Values come from the reader and the analysis
layer that the TensorBoard tab uses (mltrace.analysis), so an agent sees the numbers a person sees.

Example:
    >>> root = TrialRoot("/data/runs")
    >>> list_trials(root)["trials"][0]["trial"]
    'exp1/run3'
    >>> read_tensor(root, "exp1/run3", "gradient/Net_fc1.weight", statistic="l2")["values"]
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict
from typing import Any

from mltrace.analysis import UNREADABLE, step_statistics, thin, trial_overview
from mltrace.exceptions import MltraceError, MltraceRuntimeError, MltraceValueError
from mltrace.format.flight_record import FlightRecord, earliest_first_nonfinite
from mltrace.format.json_safe import json_safe
from mltrace.mcp.answers import bounded, first_of
from mltrace.mcp.root import TrialRoot
from mltrace.modes import ModeKeys, mode_from
from mltrace.reductions import parse_statistic
from mltrace.rules.results import RuleResult, read_results
from mltrace.trials import Tensor, Trial

DEFAULT_MAX_TRIALS, MAX_TRIALS = 50, 500
DEFAULT_MAX_TENSORS, MAX_TENSORS = 100, 2000
DEFAULT_MAX_POINTS, MAX_POINTS = 200, 2000
DEFAULT_MAX_RESULTS, MAX_RESULTS = 20, 200
#: Steps listed of one rule result's fired steps, or of one flight recorder dump's.
MAX_LISTED_STEPS = 100
#: Flight recorder dumps listed by describe_trial (the latest ones).
MAX_DUMPS = 20
#: The end of an error's traceback kept in a rule result.
MAX_TRACEBACK_CHARS = 2000


def list_trials(root: TrialRoot, max_trials: int = DEFAULT_MAX_TRIALS) -> dict[str, Any]:
    """The trials at or below the root: path relative to the root, complete steps saved, last
    global step, workers, whether training ended, steps per mode.

    A trial that cannot be read is listed with its ``error`` instead of failing the answer.

    Args:
        root: the root served.
        max_trials: list at most this many (1 to MAX_TRIALS); ``more`` counts the others.

    Raises:
        MltraceValueError: ``max_trials`` out of bounds.
        MltraceRuntimeError: the root cannot be listed (S3 without listing permission, say).
    """
    bounded("max_trials", max_trials, 1, MAX_TRIALS)
    found = root.find()
    shown, more = first_of(found, max_trials, "trials",
                           f"pass max_trials (at most {MAX_TRIALS})")
    trials = []
    for item in shown:
        entry: dict[str, Any] = {"trial": root.relative(item.location)}
        try:
            _, trial = root.open(entry["trial"])
            steps = trial.steps()
            entry.update(steps=len(steps), last_step=steps[-1] if steps else None,
                         workers=trial.workers(), training_ended=trial.loaded_all_steps,
                         modes={m.name: len(trial.steps(m)) for m in trial.modes()})
        except (MltraceError, OSError) as exc:  # one damaged trial must not hide the others
            entry["error"] = f"{type(exc).__name__}: {exc}"
        trials.append(entry)
    return json_safe({"root": root.location, "count": len(found), "trials": trials, **more})


def describe_trial(root: TrialRoot, trial: str, collection: str | None = None,
                   pattern: str | None = None,
                   max_tensors: int = DEFAULT_MAX_TENSORS) -> dict[str, Any]:
    """What a trial holds: steps per mode, workers, whether training ended, collections with
    their tensor counts, tensor names (of ``collection`` and/or matching the regular expression
    ``pattern``, at most ``max_tensors``), the flight recorder's dumps and first non-finite
    tensor, and a summary of the stored rule results.

    Args:
        root: the root served.
        trial: the trial's path relative to the root.
        collection: list only the tensors of this collection.
        pattern: list only the tensor names this regular expression finds (``re.search``).
        max_tensors: list at most this many names (1 to MAX_TENSORS).

    Raises:
        MltraceValueError: a bad trial, an unknown collection, an invalid pattern.
    """
    bounded("max_tensors", max_tensors, 1, MAX_TENSORS)
    rel, opened = root.open(trial)
    info = trial_overview(opened)
    names = info.tensors
    if collection is not None:
        if collection not in info.members:
            raise MltraceValueError(
                f"collection {collection!r} is not in trial {rel!r}: use one of "
                f"{', '.join(info.members) or '(none)'}")
        names = info.members[collection]
    if pattern:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise MltraceValueError(
                f"pattern {pattern!r} is not a valid regular expression ({exc}): pass one such "
                "as 'gradient/' or '^loss', or re.escape a literal name") from None
        names = [n for n in names if regex.search(n)]
    shown, more = first_of(names, max_tensors, "tensor names",
                           "narrow them with collection or pattern, or raise max_tensors")
    return json_safe({
        "trial": rel, "location": info.location, "workers": info.workers,
        "training_ended": info.ended,
        "modes": {mode: span.to_dict() for mode, span in info.modes.items()},
        "collections": {name: {"tensors": len(members)} for name, members in info.members.items()},
        "tensor_count": len(info.tensors), "tensors_matching": len(names), "tensors": shown,
        **more, "flight_recorder": _flight_recorder(opened.flight_records()),
        "rule_results": _rule_summary(read_results(opened.storage)),
    })


def read_tensor(root: TrialRoot, trial: str, name: str, statistic: str | None = None,
                mode: str = "GLOBAL", start_step: int | None = None, end_step: int | None = None,
                max_points: int = DEFAULT_MAX_POINTS, worker: str | None = None) -> dict[str, Any]:
    """A tensor's values over the steps of ``mode`` from ``start_step`` to ``end_step``
    (inclusive), thinned evenly to at most ``max_points`` (first and last kept, a note says so).

    ``statistic`` None gives what each step has: a one-element tensor's ``value`` (a loss, a
    metric), the reductions stored at the step, or else min, max, mean, std, l1, l2, nan_count
    and inf_count of the raw value. A name (``mean``, ``l2``, ``abs_max``, ``nan_count``, ...)
    gives that statistic only, stored or computed from the raw value; ``value`` gives only a
    one-element tensor's value.

    Args:
        root: the root served.
        trial: the trial's path relative to the root.
        name: the tensor name.
        statistic: the one statistic wanted, or None for what each step has.
        mode: a mode name (GLOBAL: global steps; TRAIN, EVAL, PREDICT: that mode's steps).
        start_step: the first step of ``mode`` to read (None: the first saved).
        end_step: the last step of ``mode`` to read (None: the last saved).
        max_points: at most this many steps (1 to MAX_POINTS).
        worker: whose data (None: each step's first worker).

    Raises:
        MltraceValueError: a bad trial, an unknown tensor, statistic, mode or worker, or a range
            or max_points out of bounds.
    """
    bounded("max_points", max_points, 1, MAX_POINTS)
    mode_key = mode_from(mode)
    if statistic not in (None, "value"):
        _check_statistic(statistic)
    rel, opened = root.open(trial)
    tensor = opened.tensor(_tensor_name(opened, rel, name))
    if worker is not None and worker not in opened.workers():
        raise MltraceValueError(
            f"worker {worker!r} is not in trial {rel!r}: use one of {', '.join(opened.workers())} "
            "(or leave worker out for each step's first)")
    if start_step is not None and end_step is not None and start_step > end_step:
        raise MltraceValueError(
            f"start_step={start_step} is after end_step={end_step}: pass start_step <= end_step")
    steps = [s for s in tensor.steps(mode_key) if (start_step is None or s >= start_step)
             and (end_step is None or s <= end_step)]
    shown = thin(steps, max_points)
    rows, damaged = _rows(tensor, shown, mode_key, worker, statistic)
    if statistic == "value" and shown and not rows and not damaged:
        raise MltraceValueError(
            f"tensor {name!r} has no one-element value at these steps (it is larger, or only "
            "reductions were saved): pass a statistic such as mean, l2 or max instead")
    answer: dict[str, Any] = {
        "trial": rel, "tensor": name, "mode": mode_key.name, "worker": worker,
        "steps": [s for s, _ in rows],
        "global_steps": [opened.global_step(mode_key, s) for s, _ in rows],
        "values": {k: [r.get(k) for _, r in rows] for k in sorted({k for _, r in rows for k in r})},
        "steps_in_range": len(steps), "returned": len(shown),
    }
    if len(shown) < len(steps):
        answer["note"] = (f"thinned evenly from {len(steps)} steps to {len(shown)} (first and last "
                          "kept): narrow start_step/end_step or raise max_points to see more")
    if not steps:
        answer["note"] = (f"tensor {name!r} has no step of mode {mode_key.name} in this range; "
                          f"its modes: {_tensor_modes(opened, name)}")
    if damaged:
        answer["damaged"] = damaged
    return json_safe(answer)


def read_rule_results(root: TrialRoot, trial: str, rule: str | None = None,
                      max_results: int = DEFAULT_MAX_RESULTS) -> dict[str, Any]:
    """The rule results stored in a trial (``mltrace_rules/``), of ``rule`` when given: the
    latest ``max_results``, oldest first, each with its status, message, steps evaluated and the
    steps where it fired (at most MAX_LISTED_STEPS listed).

    Args:
        root: the root served.
        trial: the trial's path relative to the root.
        rule: only the results of the rule of this name (None: every rule's).
        max_results: at most this many, the latest (1 to MAX_RESULTS).

    Raises:
        MltraceValueError: a bad trial or max_results.
    """
    bounded("max_results", max_results, 1, MAX_RESULTS)
    rel, opened = root.open(trial)
    stored = read_results(opened.storage)
    chosen = [r for r in stored if rule is None or r.rule == rule]
    left = max(0, len(chosen) - max_results)
    answer: dict[str, Any] = {"trial": rel, "rule": rule, "count": len(chosen),
                              "results": [_result(r) for r in chosen[left:]]}
    if left:
        answer.update(more=left, note=f"{left} older results not shown: raise max_results (at "
                                      f"most {MAX_RESULTS}) or pass rule")
    if rule is not None and not chosen:
        answer["note"] = (f"no result of rule {rule!r} in trial {rel!r}; rules with results: "
                          f"{', '.join(sorted({r.rule for r in stored})) or '(none)'}")
    return json_safe(answer)


def diagnose(root: TrialRoot, trial: str, step: int | None = None) -> dict[str, Any]:
    """mltrace.diagnosis' diagnosis of a trial, at ``step`` (a global step) or over the whole
    run: what went wrong, where and when, and what to do.

    Args:
        root: the root served.
        trial: the trial's path relative to the root.
        step: the global step to explain (None: the first anomaly of the run).

    Returns:
        ``Diagnosis.to_dict()``, with ``trial`` the path relative to the root and ``location``
        the trial's full path.

    Raises:
        MltraceValueError: a bad trial or step.
        MltraceRuntimeError: this mltrace has no mltrace.diagnosis.
    """
    try:
        from mltrace.diagnosis import diagnose as run_diagnosis
    except ImportError as exc:
        if not (exc.name or "").startswith("mltrace.diagnosis"):
            raise
        raise MltraceRuntimeError(
            "this mltrace has no mltrace.diagnosis: upgrade mltrace, or read the trial with "
            "describe_trial, read_tensor and read_rule_results") from None
    rel, opened = root.open(trial)
    # the report names the trial by its full path: the agent's name for it is the relative one
    return json_safe({**run_diagnosis(opened, step=step).to_dict(), "trial": rel,
                      "location": opened.path})


def _check_statistic(statistic: str) -> None:
    """MltraceValueError naming the valid statistics, unless ``statistic`` names a reduction."""
    try:
        parse_statistic(statistic)
    except MltraceValueError as exc:
        raise MltraceValueError(
            f"statistic {statistic!r} is unknown ({exc}); prefix abs_ for absolute values, or "
            "leave statistic out for what each step has") from None


def _rows(tensor: Tensor, steps: list[int], mode: ModeKeys, worker: str | None,
          statistic: str | None) -> tuple[list[tuple[int, dict[str, float]]], list[dict[str, Any]]]:
    """(step, statistics) of each of ``steps`` that has the statistics asked for (all of them
    when ``statistic`` is None, a one-element tensor's value only for ``value``), and the steps
    whose record cannot be read, each with its error (the others are still shown)."""
    names = None if statistic in (None, "value") else [str(statistic)]
    rows, damaged = [], []
    for step in steps:
        try:
            row = step_statistics(tensor, step, mode, worker, names)
        except UNREADABLE as exc:
            damaged.append({"step": step, "error": str(exc)})
            continue
        if row and statistic == "value":
            row = {k: v for k, v in row.items() if k == "value"}
        if row:
            rows.append((step, row))
    return rows, damaged


def _tensor_name(trial: Trial, rel: str, name: str) -> str:
    """``name`` if the trial holds it, else MltraceValueError with the closest names."""
    if trial.has_tensor(name):
        return name
    close = difflib.get_close_matches(name, trial.tensor_names(), n=3)
    raise MltraceValueError(
        f"tensor {name!r} is not in trial {rel!r}"
        + (f"; did you mean {', '.join(map(repr, close))}?" if close else "")
        + " describe_trial lists the tensor names (with pattern= to search them)")


def _tensor_modes(trial: Trial, name: str) -> list[str]:
    tensor = trial.tensor(name)
    return [m.name for m in trial.modes() if tensor.steps(m)] or [ModeKeys.GLOBAL.name]


def _flight_recorder(records: list[FlightRecord]) -> dict[str, Any]:
    """The flight recorder's first non-finite tensor and its latest dumps (MAX_DUMPS)."""
    first = earliest_first_nonfinite(records)
    dumps = sorted(((r.worker, d) for r in records for d in r.dumps), key=lambda wd: wd[1].time)
    listed = []
    for worker, dump in dumps[-MAX_DUMPS:]:
        written = sorted({*dump.steps_before, *dump.steps_after})
        listed.append({"worker": worker, "trigger": dump.trigger, "reason": dump.reason,
                       "step": dump.step, "mode": dump.mode, "mode_step": dump.mode_step,
                       "steps_written": len(written),
                       "first_written": written[0] if written else None,
                       "last_written": written[-1] if written else None})
    out: dict[str, Any] = {"first_nonfinite": asdict(first) if first else None,
                           "dumps": listed, "dump_count": len(dumps)}
    if len(dumps) > MAX_DUMPS:
        out["note"] = f"the latest {MAX_DUMPS} of {len(dumps)} dumps are listed"
    return out


def _rule_summary(results: list[RuleResult]) -> list[dict[str, Any]]:
    """Per rule with results: how many executions, and the latest one's status and findings."""
    latest: dict[str, RuleResult] = {}
    runs: dict[str, int] = {}
    for result in results:  # oldest first: the last one kept is the latest
        latest[result.rule] = result
        runs[result.rule] = runs.get(result.rule, 0) + 1
    return [{"rule": name, "executions": runs[name], "latest_status": r.status,
             "fired_steps": len(r.fired_steps), "first_step": r.first_step}
            for name, r in sorted(latest.items())]


def _result(result: RuleResult) -> dict[str, Any]:
    """One stored rule result, bounded: fired steps listed up to MAX_LISTED_STEPS, the end of
    an error's traceback only."""
    out = asdict(result)
    out["fired_count"] = len(result.fired_steps)
    out["fired_steps"] = result.fired_steps[:MAX_LISTED_STEPS]
    if result.traceback:
        out["traceback"] = result.traceback[-MAX_TRACEBACK_CHARS:]
    return {k: v for k, v in out.items() if v is not None}
