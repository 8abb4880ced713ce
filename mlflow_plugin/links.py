"""Links into the MLflow UI that open mltrace's runs in its machine-learning view.

MLflow 3.17's UI has two workflows, "GenAI apps & agents" (traces, evaluations) and "Machine
learning" (runs, metrics, artifacts). Which one an experiment opens in is decided in the browser
(its bundle, ``mlflow/server/js/build``): the ``workflowType`` URL parameter
(``genai`` or ``machine_learning``) when the page address has one, else the last choice stored in
the browser, by default ``genai``. 3.17 no longer reads the experiment tag
``mlflow.experimentKind`` for this (earlier 3.x releases did: its values are
``custom_model_development`` and ``genai_development``). So without the parameter a training
run's experiment opens on an empty "Traces" page and its runs under "Evaluations".

mltrace therefore:
- puts ``?workflowType=machine_learning`` in every link it prints or renders (the UI keeps the
  parameter while one navigates from there); when mltrace ends a run on a tracking server, the
  "View run ... at:" lines MLflow prints then carry it too (:func:`end_run`);
- tags experiments it creates with ``mlflow.experimentKind = custom_model_development`` (what
  the UI's own kind selector writes), which the MLflow releases that read the tag follow.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

#: The experiment tag MLflow's UI writes when one picks an experiment's kind, and its value for
#: machine-learning experiments.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MACHINE_LEARNING_KIND = "custom_model_development"
#: The URL parameter that makes MLflow 3.17's UI open the machine-learning view.
WORKFLOW_PARAMETER = "workflowType=machine_learning"


def experiment_page(experiment_id: str) -> str:
    """The UI's page of an experiment's runs, relative to the UI's address."""
    return f"#/experiments/{quote(str(experiment_id), safe='')}/runs?{WORKFLOW_PARAMETER}"


def run_page(experiment_id: str, run_id: str) -> str:
    """The UI's page of a run, relative to the UI's address."""
    return (f"#/experiments/{quote(str(experiment_id), safe='')}/runs/"
            f"{quote(str(run_id), safe='')}?{WORKFLOW_PARAMETER}")


def ui_base(tracking_uri: str | None) -> str | None:
    """The MLflow UI's address for a tracking URI: an ``http(s)://`` tracking server serves the UI
    itself; other stores (SQLite, PostgreSQL) have none until someone runs ``mlflow ui``."""
    if tracking_uri and tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return None


def ui_url(base: str | None, page: str) -> str | None:
    """``base`` (a UI address, or a tracking URI that is one) joined with ``page``; None when
    there is no UI address."""
    address = ui_base(base)
    return f"{address}/{page}" if address else None


def run_url(base: str | None, experiment_id: str | None, run_id: str | None) -> str | None:
    """The UI address of a run in the machine-learning view (None when something is unknown)."""
    if not experiment_id or not run_id:
        return None
    return ui_url(base, run_page(experiment_id, run_id))


def experiment_url(base: str | None, experiment_id: str | None) -> str | None:
    """The UI address of an experiment's runs in the machine-learning view."""
    return ui_url(base, experiment_page(experiment_id)) if experiment_id else None


#: MLflow's switch for its "View run/experiment at" lines (mlflow.environment_variables).
_SUPPRESS_PRINTING = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
_quiet_lock = threading.Lock()


@contextmanager
def _mlflow_links_quiet() -> Iterator[bool]:
    """MLflow's own link lines off for the ``with`` block; yields whether MLflow would have
    printed them (the user did not switch them off)."""
    with _quiet_lock:
        before = os.environ.get(_SUPPRESS_PRINTING)
        would_print = (before or "").strip().lower() not in ("1", "true")
        os.environ[_SUPPRESS_PRINTING] = "true"
        try:
            yield would_print
        finally:
            if before is None:
                os.environ.pop(_SUPPRESS_PRINTING, None)
            else:
                os.environ[_SUPPRESS_PRINTING] = before


def end_run(client: Any, run_id: str, status: str = "FINISHED",
            end: Callable[[], None] | None = None) -> None:
    """End run ``run_id`` (``client.set_terminated``, or ``end`` such as ``mlflow.end_run``) and,
    where MLflow prints "View run ... at:" and "View experiment at:" (a tracking server, printing
    not switched off), print those lines with links into the machine-learning view instead of
    MLflow's, which open the GenAI view."""
    with _mlflow_links_quiet() as would_print:
        if end is not None:
            end()
        else:
            client.set_terminated(run_id, status)
    base = ui_base(str(getattr(client, "tracking_uri", "") or ""))
    if not (would_print and base):
        return
    try:
        run = client.get_run(run_id)
    except Exception:  # the run is ended; a missing link line is no reason to fail
        return
    experiment_id = run.info.experiment_id
    sys.stdout.write(f"🏃 View run {run.info.run_name} at: "
                     f"{run_url(base, experiment_id, run_id)}\n")
    sys.stdout.write(f"🧪 View experiment at: {experiment_url(base, experiment_id)}\n")
