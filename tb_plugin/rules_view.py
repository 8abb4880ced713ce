"""The Rules panel's data: one entry per rule with its history of executions, findings first, and
a link to each execution's MLflow run found from the trial's own MLflow record; above them, the
flight recorder's first non-finite tensor and its dumps (``flight_recorder``).

Steps: a rule is evaluated at global steps (``invoke_rule``), so ``fired_steps`` are global
steps; each is also given as (mode, mode step), the numbers a rule's message and MLflow's
per-mode metrics use (``eval/...`` at EVAL step 10 is global step 210 here).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

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

#: Order of the panel: what needs a look first, what found nothing last (folded by the frontend).
STATUS_ORDER = {ISSUES_FOUND: 0, ERROR: 1, IN_PROGRESS: 2, NOTHING_CHECKED: 3, NO_ISSUES_FOUND: 4}
#: Where ``mlflow ui`` serves by default: the UI of a database-backed tracking store the trial
#: recorded (sqlite, postgresql...) once the user starts it with the command the panel shows.
MLFLOW_UI_DEFAULT = "http://127.0.0.1:5000"
MAX_STEPS_LISTED = 200


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
    """Where the MLflow UI of the trial's runs is: the plugin flag wins; else an http(s) tracking
    URI is the UI itself; else (a database) ``mlflow ui`` on its default port, with the command
    that starts it."""
    if flag_uri:
        return {"base": flag_uri, "command": None}
    uri = record.get("tracking_uri")
    if not isinstance(uri, str) or not uri:
        return {"base": None, "command": None}
    if uri.startswith(("http://", "https://")):
        return {"base": uri, "command": None}
    return {"base": MLFLOW_UI_DEFAULT,
            "command": f"mlflow ui --backend-store-uri {uri} --port 5000"}


def _step(trial: Trial, step: int) -> dict[str, Any]:
    mode, mode_step = trial.mode_modestep(step)
    return {"step": step, "mode": mode.name if mode is not None else None, "mode_step": mode_step}


def _execution(trial: Trial, result: RuleResult, base: str | None) -> dict[str, Any]:
    fired = result.fired_steps
    return {
        "status": result.status,
        "started": result.started,
        "ended": result.ended,
        "evaluated_steps": result.evaluated_steps,
        "fired_count": len(fired),
        "fired": [_step(trial, s) for s in fired[:MAX_STEPS_LISTED]],
        "first": _step(trial, result.first_step) if result.first_step is not None else None,
        "message": result.message,
        "error": result.error,
        "parameters": result.parameters,
        "mlflow_run_id": result.mlflow_run_id,
        "mlflow_experiment_id": result.mlflow_experiment_id,
        "mlflow_url": mlflow_link(base, result.mlflow_experiment_id, result.mlflow_run_id),
    }


def rules(trial: Trial, mlflow_uri: str | None) -> dict[str, Any]:
    """The Rules panel: ``rules`` holds one entry per rule name, findings first; each entry's
    ``history`` lists its executions newest first (the entry's status is its newest one's)."""
    ui = mlflow_ui(mlflow_uri, trial_mlflow_record(trial))
    by_rule: dict[str, list[RuleResult]] = {}
    for result in read_results(trial.storage):  # oldest first
        by_rule.setdefault(result.rule, []).append(result)
    out = []
    for name, found in by_rule.items():
        history = [_execution(trial, r, ui["base"]) for r in reversed(found)]
        out.append({"rule": name, "status": history[0]["status"], "runs": len(history),
                    "history": history})
    out.sort(key=lambda r: (STATUS_ORDER.get(r["status"], 2), -r["history"][0]["started"]))
    return {"run": trial.name, "rules": out, "mlflow": ui,
            "flight_recorder": flight_recorder(trial)}


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
    fired global steps, and which of ``tensors`` its message names."""
    newest: dict[str, RuleResult] = {}
    for result in read_results(trial.storage):
        newest[result.rule] = result
    out = []
    for result in newest.values():
        if result.status != ISSUES_FOUND:
            continue
        message = result.message or ""
        out.append({"rule": result.rule, "steps": result.fired_steps[:MAX_STEPS_LISTED],
                    "tensors": [t for t in tensors if t and t in message], "message": message})
    return out
