"""What a hook's flight recorder dump leaves on its MLflow training run: tags, so that the runs
table shows which tensor went non-finite first and ``mlflow.search_runs`` finds such runs
(``filter_string="tags.`mltrace.first_nonfinite.tensor` != ''"``)::

    mltrace.first_nonfinite.tensor        the first tensor that held a NaN or an infinity
    mltrace.first_nonfinite.step          its global step
    mltrace.flight_recorder.dumps         how many dumps the worker made so far
    mltrace.flight_recorder.last_trigger  nonfinite | loss_spike | rule | exception | manual
    mltrace.flight_recorder.last_reason   the last dump's reason (a rule's message, a note)

Also the summary's part (``summary_entry``): the first non-finite tensor and each dump.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from mltrace.format.flight_record import Dump, FlightRecord, earliest_first_nonfinite

from . import _keys

logger = logging.getLogger(__name__)


def dump_tags(record: FlightRecord, dump: Dump) -> dict[str, str]:
    """The training run's tags after ``dump`` (the newest of ``record``)."""
    tags = {
        _keys.TAG_FLIGHT_RECORDER_DUMPS: str(len(record.dumps)),
        _keys.TAG_FLIGHT_RECORDER_LAST_TRIGGER: dump.trigger,
        _keys.TAG_FLIGHT_RECORDER_LAST_REASON: _keys.tag_value(dump.reason),
    }
    first = record.first_nonfinite or dump.first_nonfinite
    if first is not None:
        tags[_keys.TAG_FIRST_NONFINITE_TENSOR] = _keys.tag_value(first.tensor)
        tags[_keys.TAG_FIRST_NONFINITE_STEP] = str(first.step)
    return tags


def summary_entry(trial: Any) -> dict[str, Any]:
    """The flight recorder's part of a trial summary: ``first_nonfinite`` (a dict, or None) and
    ``dumps`` (each worker's, oldest first, with its worker); empty lists when the trial has
    none, and the summary never fails for want of them."""
    try:
        records = trial.flight_records()
        first = earliest_first_nonfinite(records)
    except Exception as exc:
        logger.debug("no flight recorder records in the summary: %s", exc)
        return {"first_nonfinite": None, "dumps": []}
    dumps = [{"worker": r.worker, **asdict(d)} for r in records for d in r.dumps]
    for d in dumps:
        d.pop("first_nonfinite", None)
    dumps.sort(key=lambda d: (d["step"], d["worker"]))
    return {"first_nonfinite": asdict(first) if first is not None else None, "dumps": dumps}
