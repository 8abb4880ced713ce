"""A diagnosis on the MLflow training run (mltrace_mlflow.diagnosis, entry point
``mltrace.diagnosis_listeners``): a real PyTorch run logging to a real ``mlflow server`` turns NaN,
its hook's flight recorder dumps and diagnoses the trial, and the run gets the diagnosis tags and
a "Diagnosis" section in its description, below what the user wrote there; a trial that logs to
no MLflow run is left alone."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from mltrace import plugins
from mltrace_mlflow.description import NOTE_TAG
from mltrace_mlflow.diagnosis import (
    TAG_CAUSE,
    TAG_MESSAGE,
    TAG_ONSET,
    TAG_ORIGIN,
    diagnosis_tags,
    tag_training_run,
)
from tests.support.flight_training import POISONED as FC2
from tests.support.flight_training import train as train_nan

USER_NOTE = "Learning-rate sweep, lr=0.01: my own notes"


def test_a_dump_leaves_the_diagnosis_on_the_training_run(server, tmp_path):
    client = MlflowClient(server.uri)

    def on_step(hook, step):
        if step == 5:  # the user describes the run while it trains
            client.set_tag(hook.sinks[0].run_id, NOTE_TAG, USER_NOTE)

    out = str(tmp_path / "nan")
    train_nan(out, steps=40, poison_step=25, on_step=on_step,
              mlflow={"experiment": "diagnosed", "flush_interval": 0.2})
    (run,) = mlflow.search_runs(experiment_names=["diagnosed"], output_format="list")
    tags = run.data.tags
    report = json.loads((Path(out) / "mltrace_diagnosis" / "worker_0.json").read_text())
    assert report["found"] and report["message"].startswith("step 25: numerics")
    assert (tags[TAG_ONSET], tags[TAG_CAUSE], tags[TAG_ORIGIN]) == ("25", "numerics", FC2)
    assert tags[TAG_MESSAGE] == report["message"]
    found = mlflow.search_runs(experiment_names=["diagnosed"], output_format="list",
                               filter_string=f"tags.`{TAG_CAUSE}` = 'numerics'")
    assert [r.info.run_id for r in found] == [run.info.run_id]
    note = tags[NOTE_TAG]
    assert note.startswith(USER_NOTE + "\n\n")  # the user's text, kept, mltrace's part below
    assert "#### Diagnosis: numerics\n\n" + report["message"] in note
    assert f"Onset: global step 25; origin: `{FC2}`" in note
    assert f"The full report: `mltrace diagnose {out}`" in note
    # the other parts of mltrace's description are still there
    assert f"**First non-finite tensor: `{FC2}` at global step 25** (flight recorder)" in note
    assert "#### mltrace: no rule has run on this trial yet" in note


def test_the_listener_is_registered_and_a_trial_without_a_run_leaves_it_quiet(tmp_path, caplog):
    assert plugins.diagnosis_listeners.get("mlflow") is tag_training_run
    out = str(tmp_path / "nan")
    with caplog.at_level(logging.INFO, logger="mltrace"):
        train_nan(out, steps=30, poison_step=20)  # no mlflow=: the trial has no run file
    assert [r.name for r in caplog.records if "diagnosis of" in r.getMessage()] == ["mltrace.diagnosis"]
    assert "diagnosis listener" not in caplog.text  # the hook's diagnosis called it: nothing to say
    report = json.loads((Path(out) / "mltrace_diagnosis" / "worker_0.json").read_text())
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        tag_training_run(out, report)
    assert caplog.records == []


def test_the_tags_name_the_origins_layer_and_say_none_for_what_a_report_lacks():
    tags = diagnosis_tags({"onset": 412, "message": "step 414: corruption — began at step 412 in h.2",
                           "origin": [{"tensor": "activations/h.2.mlp.c_fc/abs_max", "layer": "h.2"}],
                           "cause": {"class": "corruption"}})
    assert tags == {TAG_ONSET: "412", TAG_ORIGIN: "activations/h.2.mlp.c_fc/abs_max (layer h.2)",
                    TAG_CAUSE: "corruption", TAG_MESSAGE: "step 414: corruption — began at step 412 in h.2"}
    none = diagnosis_tags({"found": False, "onset": None, "origin": [], "cause": None,
                           "message": "no anomaly in 30 steps"})
    assert none == {TAG_ONSET: "none", TAG_ORIGIN: "none", TAG_CAUSE: "none",
                    TAG_MESSAGE: "no anomaly in 30 steps"}
