"""Where a diagnosis goes once made by itself (after a flight-recorder dump, by ``mltrace
watch``): into its trial (mltrace.diagnosis.stored), the log, and every diagnosis listener
(entry-point group ``mltrace.diagnosis_listeners``: the MLflow side tags the training run).

``mltrace diagnose`` only prints: asked for by a person, it changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from mltrace import plugins
from mltrace.diagnosis.report import Diagnosis
from mltrace.diagnosis.stored import save_report

logger = logging.getLogger("mltrace.diagnosis")


def publish(storage: Any, report: Diagnosis) -> None:
    """Keep ``report`` in the trial of ``storage``, log it, and tell the diagnosis listeners.

    Never raises: a trial that cannot be written or a listener that fails is a warning (the
    diagnosis runs beside training, which it must not stop).
    """
    location = getattr(storage, "uri", report.trial)
    try:
        key = save_report(storage, report)
    except Exception as exc:  # noqa: BLE001 - a read-only trial, an S3 outage: the log still has it
        logger.warning("could not write the diagnosis into %s: %s: %s", location, type(exc).__name__, exc)
        key = None
    log = logger.warning if report.found else logger.info
    log("diagnosis of %s: %s%s", location, report.message(), f" (mltrace diagnose {location}; {key})" if key else "")
    data = report.to_dict()
    for name, listener in plugins.diagnosis_listeners.items().items():
        try:
            listener(location, data)
        except Exception as exc:  # noqa: BLE001 - a listener's failure is never the caller's
            logger.warning("diagnosis listener %s failed: %s: %s", name, type(exc).__name__, exc)


__all__ = ["publish"]
