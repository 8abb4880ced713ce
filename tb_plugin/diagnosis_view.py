"""The diagnosis view's data: the root-cause report of a trial (schema ``mltrace.diagnosis/1``,
docs/guide/diagnose.md) for the overview, which marks its onset step and origin tensor on the
heatmap and shows the cause, evidence and advice beside it.

Read-only: the report the trial keeps (``mltrace_diagnosis/<worker>.json``, written after a
flight-recorder dump or by ``mltrace watch``) when it has one, else one computed here with
``mltrace.diagnosis.diagnose`` and never written into the trial. A computed report is kept per
trial and reused while the trial holds the same steps, so a refresh or a poll does not read the
whole trial again; it is computed from a Trial of its own, so that the tab's other requests for
that run are not held while it reads. Every answer is bounded in size, a stored file's too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mltrace.diagnosis import SCHEMA, diagnose
from mltrace.diagnosis.stored import read_reports
from mltrace.trials import Trial, create_trial

logger = logging.getLogger(__name__)

#: The report's fields (schema mltrace.diagnosis/1) an answer keeps; any other is left out.
FIELDS = ("schema", "trial", "worker", "found", "message", "steps", "anomaly", "anomalies", "onset",
          "origin", "origin_layer", "cause", "samples", "record_next", "method", "damaged")
#: Items kept of each list field (the rest is counted in ``left_out``).
LIST_LIMITS = {"anomalies": 20, "origin": 10, "samples": 50, "record_next": 20, "damaged": 20}
#: Items kept of the cause's lists.
CAUSE_LIMITS = {"evidence": 40, "advice": 10}
#: Bounds of any value of a report: characters of a string, items of a list, keys of an object,
#: levels of nesting (a stored file is read as it is; what it holds beyond these is cut).
MAX_TEXT = 1000
MAX_ITEMS = 50
MAX_KEYS = 40
MAX_DEPTH = 4
#: Seconds a live trial's computed report is reused while new steps come in; an ended trial's is
#: recomputed only when what it holds changes.
LIVE_REUSE_S = 30.0

StateKey = tuple[Any, ...]


def state_key(trial: Trial) -> StateKey:
    """What a computed diagnosis depends on: the trial's workers, how many steps it holds, its
    last step, and whether training ended (a live trial is refreshed first)."""
    trial.maybe_refresh()
    steps = trial.saved_steps()
    return (tuple(trial.workers()), len(steps), steps[-1] if len(steps) else -1,
            bool(trial.loaded_all_steps))


def _bounded(value: Any, depth: int = 0) -> Any:
    """``value`` cut to MAX_TEXT, MAX_ITEMS, MAX_KEYS and MAX_DEPTH (JSON types only)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 1] + "…"
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, (list, tuple)):
        return [_bounded(v, depth + 1) for v in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items() if isinstance(k, str)][:MAX_KEYS]
        return {k: _bounded(v, depth + 1) for k, v in items}
    return _bounded(str(value), depth)


def bounded_report(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` (the JSON of a Diagnosis) with its documented fields only, each list cut to
    its limit and every value bounded; ``left_out`` counts the items cut from each list."""
    out: dict[str, Any] = {}
    left_out: dict[str, int] = {}
    for name in FIELDS:
        value = report.get(name)
        if name in LIST_LIMITS and isinstance(value, list):
            if len(value) > LIST_LIMITS[name]:
                left_out[name] = len(value) - LIST_LIMITS[name]
            value = value[: LIST_LIMITS[name]]
        out[name] = _bounded(value)
    cause = report.get("cause")
    if isinstance(cause, dict):
        for name, limit in CAUSE_LIMITS.items():
            items = cause.get(name)
            if isinstance(items, list) and len(items) > limit:
                left_out[f"cause.{name}"] = len(items) - limit
            if isinstance(items, list):
                out["cause"][name] = _bounded(items[:limit], 1)
    out["left_out"] = left_out
    return out


def choose_stored(reports: list[dict[str, Any]], worker: str | None) -> dict[str, Any] | None:
    """The stored report to show: ``worker``'s when it has one; else the one whose anomaly came
    first; else the first (None when there is none)."""
    if not reports:
        return None
    for report in reports:
        if worker is not None and report.get("worker") == worker:
            return report
    found = [r for r in reports if r.get("found") and isinstance(r.get("anomaly"), dict)]

    def anomaly_step(r: dict[str, Any]) -> float:
        step = r["anomaly"].get("step")
        return step if isinstance(step, (int, float)) else float("inf")

    return min(found, key=anomaly_step) if found else reports[0]


@dataclass
class _Computed:
    key: StateKey
    at: float
    answer: dict[str, Any]


class DiagnosisCache:
    """Computed diagnoses by trial location, each with the state of the trial it was computed
    from; one computation at a time per trial (a second request waits for the first's answer).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._computed: dict[str, _Computed] = {}

    def get(self, location: str, key: StateKey,
            compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The answer computed for ``location`` at ``key`` (a :func:`state_key`), computed with
        ``compute()`` when there is none. A live trial's (its key's last item, ``ended``, false)
        is reused for LIVE_REUSE_S seconds after it was computed even when ``key`` moved on."""
        with self._lock:
            lock = self._locks.setdefault(location, threading.Lock())
        with lock:
            kept = self._computed.get(location)
            live = not key[-1] and kept is not None and not kept.key[-1]
            if kept is not None and (kept.key == key or (
                    live and time.monotonic() - kept.at < LIVE_REUSE_S)):
                return kept.answer
            answer = compute()
            self._computed[location] = _Computed(key, time.monotonic(), answer)
            return answer


def compute(location: str, name: str) -> dict[str, Any]:
    """A diagnosis of the trial at ``location``, read by a Trial of its own; a failure is the
    answer's ``error`` (the overview goes on without the diagnosis)."""
    try:
        report = diagnose(create_trial(location, name=name, timeout=0)).to_dict()
    except Exception as exc:  # noqa: BLE001 - any failure of the analysis is shown, never a 500
        logger.warning("mltrace: diagnosis of %s failed: %s: %s", location, type(exc).__name__, exc)
        return {"source": "computed", "diagnosis": None,
                "error": f"the diagnosis failed: {type(exc).__name__}: {exc}"[:MAX_TEXT]}
    return {"source": "computed", "diagnosis": bounded_report(report), "error": None}


def diagnosis(trial: Trial, lock: threading.RLock, cache: DiagnosisCache,
              worker: str | None = None) -> dict[str, Any]:
    """The diagnosis view of ``trial`` (its shared ``lock`` is held only to read its stored
    reports and state): ``source`` ``stored`` or ``computed``, ``stored_workers`` (workers with
    a stored report), ``diagnosis`` (the bounded report, None on failure) and ``error``."""
    with lock:
        stored = read_reports(trial.storage)
        key = state_key(trial) if not stored else ()
    chosen = choose_stored(stored, worker)
    if chosen is not None:
        answer = {"source": "stored", "diagnosis": bounded_report(chosen), "error": None}
    else:
        answer = cache.get(trial.path, key, lambda: compute(trial.path, trial.name))
    workers = [r.get("worker") for r in stored]
    return {"run": trial.name, "schema": SCHEMA, "stored_workers": _bounded(workers), **answer}
