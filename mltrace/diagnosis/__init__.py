"""Why did my run break: a root-cause report of a trial (``mltrace diagnose``, ``trial.diagnose()``).

``diagnose(trial)`` reads every tensor of the trial as one number per step
(mltrace.diagnosis.table), finds the step to explain and where the trouble began
(mltrace.diagnosis.detect), and which cause the recorded tensors point to, with the evidence and
what people usually do about it (mltrace.diagnosis.causes). The method and its thresholds are in
mltrace.diagnosis.method and docs/guide/diagnose.md; the result is a
:class:`~mltrace.diagnosis.report.Diagnosis` (``to_dict()``: the versioned JSON).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mltrace.diagnosis.causes import explain
from mltrace.diagnosis.detect import Anomaly, departures, find_anomalies, score
from mltrace.diagnosis.method import Method
from mltrace.diagnosis.report import SCHEMA, Diagnosis
from mltrace.diagnosis.table import read_table

if TYPE_CHECKING:
    from mltrace.trials import Trial


def diagnose(trial: Trial, step: int | None = None, method: Method | None = None,
             worker: str | None = None) -> Diagnosis:
    """Diagnose ``trial``: the first anomaly (or ``step``), its onset, origin and cause.

    Args:
        trial: an open trial (``create_trial``); read, never written.
        step: the global step to explain instead of the first anomaly.
        method: the thresholds (default: :class:`Method`'s).
        worker: the worker whose tensors to read (default: the trial's first).

    Raises:
        MltraceValueError: the trial has no worker ``worker``.
    """
    method = method or Method()
    table = read_table(trial, worker=worker)
    steps = table.steps
    span = (len(steps), int(steps[0]) if len(steps) else -1, int(steps[-1]) if len(steps) else -1)
    report = Diagnosis(trial.path, table.worker, method, span,
                       damaged=table.damaged)
    if not len(steps):
        return report
    scores = score(table, method)
    # a dump the user asked for (hook.dump_flight_recorder, mltrace dump) is no anomaly itself
    dumps = [(d.step, f"{d.trigger}: {d.reason}") for record in _flight_records(trial) for d in record.dumps
             if d.trigger != "manual"]
    report.anomalies = find_anomalies(table, scores, method, dumps)
    if step is not None:
        report.anomaly = Anomaly(int(step), "asked", None, f"the step asked about ({step})")
    elif report.anomalies:
        report.anomaly = report.anomalies[0]
    if report.anomaly is None:
        return report
    report.origin = departures(table, scores, method, report.anomaly.step, report.anomaly.tensor)
    report.cause = explain(table, scores, method, report.origin, report.anomaly.tensor)
    return report


def _flight_records(trial: Trial) -> list:
    try:
        return list(trial.flight_records())
    except Exception:  # noqa: BLE001 - an unreadable record file: the diagnosis goes on without it
        return []


__all__ = ["SCHEMA", "Diagnosis", "Method", "diagnose"]
