"""A trial's diagnosis on its MLflow training run (entry point group
``mltrace.diagnosis_listeners``): when a diagnosis is made by itself (a hook's after a
flight-recorder dump, ``mltrace watch``'s), mltrace.diagnosis.publish calls
:func:`tag_training_run`, which tags the run the trial's hook logs to, so that the runs table
and ``mlflow.search_runs`` show why a run broke
(``filter_string="tags.`mltrace.diagnosis.cause` = 'numerics'"``)::

    mltrace.diagnosis.onset     the global step where the trouble began
    mltrace.diagnosis.origin    the tensor that left its window first, with its layer if it has
                                one: ``activations/h.2.mlp.c_fc/abs_max (layer h.2)``
    mltrace.diagnosis.cause     numerics | optimizer | data | corruption | unexplained
    mltrace.diagnosis.message   the report's one line

A field the report lacks (no anomaly: no onset, origin or cause) is ``none``, so the tags of an
earlier diagnosis of the run never outlive it. The run's description (description.py) gets a
"Diagnosis" section from these tags, within mltrace's part of it: what the user wrote stays.

The run is the one in the trial's run file (``mltrace_mlflow_run.json``, which the hook's MLflow
sink writes), in the tracking store recorded there, as rule runs find it (rules.py). A trial
without a run file was not logged to MLflow: nothing is done and MLflow is not imported.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from . import _keys, _tracking

logger = logging.getLogger(__name__)

TAG_ONSET = "mltrace.diagnosis.onset"
TAG_ORIGIN = "mltrace.diagnosis.origin"
TAG_CAUSE = "mltrace.diagnosis.cause"
TAG_MESSAGE = "mltrace.diagnosis.message"
#: What a tag says of a field the report does not have.
NONE = "none"


def diagnosis_tags(report: Mapping[str, Any]) -> dict[str, str]:
    """The training run's tags for ``report`` (the JSON of ``Diagnosis.to_dict()``, schema
    ``mltrace.diagnosis/1``)."""
    origin = report.get("origin") or []
    first = origin[0] if origin and isinstance(origin[0], Mapping) else None
    tensor = first.get("tensor") if first is not None else None
    layer = first.get("layer") if first is not None else None
    cause = report.get("cause")
    onset = report.get("onset")
    return {
        TAG_ONSET: NONE if onset is None else str(onset),
        TAG_ORIGIN: _keys.tag_value(
            NONE if not tensor else f"{tensor} (layer {layer})" if layer else str(tensor)),
        TAG_CAUSE: str(cause.get("class") or NONE) if isinstance(cause, Mapping) else NONE,
        TAG_MESSAGE: _keys.tag_value(report.get("message") or NONE),
    }


def tag_training_run(location: str, report: Mapping[str, Any]) -> None:
    """The listener: tag the MLflow training run of the trial at ``location`` with ``report``
    and rewrite mltrace's part of its description (see the module docstring); nothing when the
    trial has no run file.

    Raises:
        Exception: whatever MLflow raises (publish logs it as a warning).
    """
    from mltrace.storage import open_storage

    run_file = _tracking.read_run_file(open_storage(location))
    if run_file is None:
        return
    from mlflow import MlflowClient
    from mlflow.entities import RunTag

    from .description import update_training_description

    client = MlflowClient(tracking_uri=run_file.tracking_uri)
    client.log_batch(run_file.run_id,
                     tags=[RunTag(k, v) for k, v in diagnosis_tags(report).items()])
    update_training_description(client, run_file.run_id)
    logger.debug("diagnosis of %s tagged on MLflow run %s", location, run_file.run_id)


__all__ = ["TAG_CAUSE", "TAG_MESSAGE", "TAG_ONSET", "TAG_ORIGIN", "diagnosis_tags",
           "tag_training_run"]
