"""Diagnoses kept in their trial: ``mltrace_diagnosis/<worker>.json``, the JSON of
:meth:`Diagnosis.to_dict` (schema ``mltrace.diagnosis/1``), one per worker, rewritten by each
new diagnosis of it.

A hook writes it after a flight-recorder dump, ``mltrace watch`` when it diagnoses a trial; the
TensorBoard plugin and the MLflow side read it. It is the only file a diagnosis writes into a
trial, so writing it into a trial that is still training touches nothing else.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from mltrace.diagnosis.report import SCHEMA, Diagnosis
from mltrace.format import paths
from mltrace.format.json_safe import json_safe

logger = logging.getLogger("mltrace.diagnosis")


def report_key(worker: str | None) -> str:
    """The key of ``worker``'s diagnosis in its trial (the default worker's when None)."""
    return f"{paths.DIAGNOSIS_DIR}/{paths.check_worker_name(worker or paths.DEFAULT_WORKER_NAME)}.json"


def save_report(storage: Any, report: Diagnosis) -> str:
    """Write ``report`` into the trial of ``storage`` (a mltrace.storage Storage); returns its key."""
    key = report_key(report.worker)
    storage.write(key, json.dumps(json_safe(report.to_dict()), indent=1, allow_nan=False).encode())
    return key


def read_reports(storage: Any) -> list[dict[str, Any]]:
    """The diagnoses stored in a trial, by worker name; a damaged file or one of another schema
    is skipped with a warning naming it."""
    out = []
    for key in sorted(storage.list(paths.DIAGNOSIS_DIR)):
        if not key.endswith(".json"):
            continue
        try:
            report = json.loads(storage.read(key))
            if not isinstance(report, dict) or report.get("schema") != SCHEMA:
                raise ValueError(f"not a {SCHEMA} report")
        except (ValueError, RecursionError) as exc:
            logger.warning("skipping damaged diagnosis %s/%s: %s: %s",
                           getattr(storage, "uri", ""), key, type(exc).__name__, exc)
            continue
        out.append(report)
    return out


__all__ = ["read_reports", "report_key", "save_report"]
