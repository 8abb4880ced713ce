"""The Rules panel's data: one entry per rule with its history of executions, findings first; above
them, the flight recorder's first non-finite tensor and its dumps (``flight_recorder``) and every
tensor that held a NaN or an infinity, found with no rule run (``nonfinite``, see
:mod:`nonfinite_view`). The overview's rule markers come from :func:`findings`.

Steps: a rule is evaluated at global steps (``invoke_rule``), so ``fired_steps`` are global
steps; each is also given as (mode, mode step), the numbers a rule's message and MLflow's
per-mode metrics use (``eval/...`` at EVAL step 10 is global step 210 here). Every fired step is
given; past MAX_MARKED_STEPS they are thinned evenly from the first to the last (``thinned``).

Tensors: a finding names the tensors its message names exactly (:mod:`mentions`): one about
``gradient/Sequential_0.bias`` is not about the parameter ``Sequential_0.bias``. The message's
``mentions`` say where, so the panel links each name to its tensor's detail at the first step.

MLflow: a rule run's link is the page its MLflow listener recorded (``mlflow_url`` in the
result), or one under the UI that ``--mltrace_mlflow_uri`` names; never a guessed default.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import numpy as np

from mltrace.analysis import heatmap
from mltrace.exceptions import MltraceError
from mltrace.format import paths
from mltrace.format.flight_record import earliest_first_nonfinite
from mltrace.rules.results import (
    ERROR,
    IN_PROGRESS,
    ISSUES_FOUND,
    NO_ISSUES_FOUND,
    NOTHING_CHECKED,
    RuleResult,
    read_results,
)
from mltrace.trials import Trial

from . import nonfinite_view
from .mentions import mentions, named_tensors

#: Order of the panel: what needs a look first, what found nothing last (folded by the frontend).
STATUS_ORDER = {ISSUES_FOUND: 0, ERROR: 1, IN_PROGRESS: 2, NOTHING_CHECKED: 3, NO_ISSUES_FOUND: 4}
#: Fired steps given per execution and finding; beyond it, that many spread evenly over them.
MAX_MARKED_STEPS = 10_000
#: A flight-recorder dump's written steps listed (the count is always given).
MAX_STEPS_LISTED = 200
#: Seconds an answer spends looking for non-finite values (the tab asks again for the rest).
NONFINITE_BUDGET_S = nonfinite_view.READ_BUDGET_S


def thinned(steps: list[int], limit: int = MAX_MARKED_STEPS) -> list[int]:
    """``steps`` sorted, all of them up to ``limit``; past it, ``limit`` of them spread evenly
    by position from the first to the last (both kept): a long firing is never cut short."""
    ordered = sorted(steps)
    if len(ordered) <= limit:
        return ordered
    keep = np.unique(np.linspace(0, len(ordered) - 1, limit).round().astype(np.int64))
    return [ordered[i] for i in keep.tolist()]


def mlflow_link(base: str | None, experiment_id: str | None, run_id: str | None) -> str | None:
    """The MLflow UI page of a run (its overview in the machine-learning run view), when the base
    URL is http(s) and the ids are known."""
    if not base or not run_id or not experiment_id or not base.startswith(("http://", "https://")):
        return None
    # workflowType: MLflow 3.17's UI opens the GenAI view without it (mlflow_plugin/links.py)
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
            "?workflowType=machine_learning")


def trial_mlflow_record(trial: Trial) -> dict[str, Any]:
    """What the training hook recorded in the trial (``mltrace_mlflow_run.json``): run id,
    experiment id, tracking URI; empty when there is none or it cannot be read."""
    try:
        if not trial.storage.exists(paths.MLFLOW_RUN_FILE):
            return {}
        data = json.loads(trial.storage.read(paths.MLFLOW_RUN_FILE))
    except (OSError, ValueError, AttributeError, MltraceError):
        return {}
    return data if isinstance(data, dict) else {}


def mlflow_ui(flag_uri: str | None, record: dict[str, Any]) -> dict[str, Any]:
    """Where the MLflow UI of the trial's runs is, as far as anything says: ``base``, the UI the
    plugin flag names (None without one: links are then only those the results recorded);
    ``command``, how to look at runs kept in a database tracking store the trial recorded
    (``mlflow ui --backend-store-uri ...``), which the panel shows as a hint, never as a link:
    nothing says that a UI serves there."""
    uri = record.get("tracking_uri")
    command = None
    if not flag_uri and isinstance(uri, str) and uri and not uri.startswith(("http://", "https://")):
        command = f"mlflow ui --backend-store-uri {uri}"
    return {"base": flag_uri or None, "command": command}


def _run_link(result: RuleResult, flag_uri: str | None) -> str | None:
    """The rule run's MLflow page: under the UI the plugin flag names, else the one its listener
    recorded (an http(s) URL), else None."""
    if flag_uri:
        return mlflow_link(flag_uri, result.mlflow_experiment_id, result.mlflow_run_id)
    url = result.mlflow_url
    return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None


def _step(trial: Trial, step: int) -> dict[str, Any]:
    mode, mode_step = trial.mode_modestep(step)
    return {"step": step, "mode": mode.name if mode is not None else None, "mode_step": mode_step}


def _execution(trial: Trial, result: RuleResult, flag_uri: str | None,
               names: list[str]) -> dict[str, Any]:
    fired = thinned(result.fired_steps)
    return {
        "status": result.status,
        "started": result.started,
        "ended": result.ended,
        "evaluated_steps": result.evaluated_steps,
        "fired_count": len(result.fired_steps),
        "fired": [_step(trial, s) for s in fired],
        "fired_thinned": len(fired) < len(result.fired_steps),
        "first": _step(trial, result.first_step) if result.first_step is not None else None,
        "message": result.message,
        "mentions": [list(m) for m in mentions(result.message, names)],
        "error": result.error,
        "parameters": result.parameters,
        "mlflow_run_id": result.mlflow_run_id,
        "mlflow_experiment_id": result.mlflow_experiment_id,
        "mlflow_url": _run_link(result, flag_uri),
    }


def rules(trial: Trial, mlflow_uri: str | None, cache: heatmap.StatisticCache | None = None,
          budget_s: float | None = None) -> dict[str, Any]:
    """The Rules panel: ``rules`` holds one entry per rule name, findings first; each entry's
    ``history`` lists its executions newest first (the entry's status is its newest one's).

    Args:
        trial: the trial.
        mlflow_uri: the MLflow UI the plugin flag names (None: only recorded links).
        cache: values already read, for the non-finite scan (the plugin's, shared with the
            overview); None: a new one.
        budget_s: seconds the non-finite scan may read (None: all of it).
    """
    ui = mlflow_ui(mlflow_uri, trial_mlflow_record(trial))
    names = trial.tensor_names()
    by_rule: dict[str, list[RuleResult]] = {}
    for result in read_results(trial.storage):  # oldest first
        by_rule.setdefault(result.rule, []).append(result)
    out = []
    for name, found in by_rule.items():
        history = [_execution(trial, r, mlflow_uri, names) for r in reversed(found)]
        out.append({"rule": name, "status": history[0]["status"], "runs": len(history),
                    "history": history})
    out.sort(key=lambda r: (STATUS_ORDER.get(r["status"], 2), -r["history"][0]["started"]))
    return {"run": trial.name, "rules": out, "mlflow": ui,
            "flight_recorder": flight_recorder(trial),
            "nonfinite": nonfinite_view.nonfinite(trial, cache, budget_s)}


def _steps(steps: list[int]) -> dict[str, Any]:
    """A dump's written steps: the first ``MAX_STEPS_LISTED`` and their count."""
    ordered = sorted(steps)
    return {"count": len(ordered), "steps": ordered[:MAX_STEPS_LISTED]}


def flight_recorder(trial: Trial) -> dict[str, Any]:
    """The flight recorder's part of the panel: ``first_nonfinite`` (the earliest over the
    workers, or None) and ``dumps`` of every worker, oldest first, each with its trigger,
    reason, step (global, and mode step) and the steps it wrote before and after the trigger."""
    records = trial.flight_records()
    first = earliest_first_nonfinite(records)
    dumps = []
    for record in records:
        for dump in record.dumps:
            dumps.append({
                "worker": record.worker, "trigger": dump.trigger, "reason": dump.reason,
                "step": dump.step, "mode": dump.mode, "mode_step": dump.mode_step,
                "time": dump.time, "before": _steps(dump.steps_before),
                "after": _steps(dump.steps_after),
                "first_nonfinite": dump.first_nonfinite.tensor if dump.first_nonfinite else None,
            })
    dumps.sort(key=lambda d: (d["time"], d["step"], d["worker"]))
    return {"first_nonfinite": asdict(first) if first is not None else None, "dumps": dumps}


def findings(trial: Trial, tensors: list[str]) -> list[dict[str, Any]]:
    """Each rule's newest execution that found issues, for marking the overview: the rule, its
    fired global ``steps`` (every one; past MAX_MARKED_STEPS spread evenly, first and last kept,
    ``thinned`` True), ``fired_count``, ``first_step`` (the step its message is about), and
    which of ``tensors`` its message names exactly (``tensors``, see :mod:`mentions`)."""
    newest: dict[str, RuleResult] = {}
    for result in read_results(trial.storage):
        newest[result.rule] = result
    out = []
    for result in newest.values():
        if result.status != ISSUES_FOUND:
            continue
        steps = thinned(result.fired_steps)
        out.append({"rule": result.rule, "steps": steps, "fired_count": len(result.fired_steps),
                    "thinned": len(steps) < len(result.fired_steps),
                    "first_step": result.first_step,
                    "tensors": named_tensors(result.message, tensors),
                    "message": result.message or ""})
    return out
