"""Rule executions as MLflow runs: child of the training run (from the trial's run file or a CLI
flag), tags on the training run that search_runs finds, top-level runs, nothing without tracking."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlflow
import pytest
from mlflow import MlflowClient

from mltrace.format import paths
from mltrace.rules import Rule, invoke_rule
from mltrace.rules.builtin.vanishing_gradient import VanishingGradient
from mltrace.rules.results import read_results
from mltrace.trials import create_trial
from mltrace_mlflow import _keys
from tests.support.mlflow_env import train

STATUS_TAG = "mltrace.rule.VanishingGradient.status"


def _history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_rule_run_is_a_child_and_tags_the_training_run(tracking, tmp_path):
    hook, _ = train(tmp_path / "trial", steps=5, mlflow={"experiment": "train"})
    parent_id = hook.sinks[0].run_id
    trial = create_trial(str(tmp_path / "trial"))
    result = invoke_rule(VanishingGradient(trial, threshold=1.0), end_step=5)  # |grad| < 1: fires

    client = MlflowClient()
    child = client.get_run(result.mlflow_run_id)
    parent = client.get_run(parent_id)
    assert child.data.tags[_keys.PARENT_RUN_TAG] == parent_id
    assert child.info.experiment_id == parent.info.experiment_id == result.mlflow_experiment_id
    assert child.info.status == "FINISHED" and child.info.run_name == "✖ VanishingGradient: IssuesFound @0"
    assert child.data.params == {"rule": "VanishingGradient", "threshold": "1.0"}
    assert _history(client, child.info.run_id, "condition_met") == [(s, 1.0) for s in range(5)]
    assert child.data.tags[_keys.TAG_RULE_STATUS] == "IssuesFound"
    assert child.data.tags[_keys.TAG_FIRST_STEP] == "0"
    assert child.data.tags[_keys.TAG_MESSAGE] == result.message
    assert "mltrace/rule_result.json" in [a.path for a in client.list_artifacts(child.info.run_id, "mltrace")]

    tags = parent.data.tags
    assert tags[STATUS_TAG] == "IssuesFound"
    assert tags["mltrace.rule.VanishingGradient.first_step"] == "0"
    assert tags["mltrace.rule.VanishingGradient.message"] == result.message
    assert tags["mltrace.rule.VanishingGradient.run_id"] == child.info.run_id
    assert tags[_keys.TAG_ISSUES_FOUND] == "true"

    # Filter strings find the training run (and the rule run) across experiments.
    found = mlflow.search_runs(search_all_experiments=True, filter_string=f"tags.`{STATUS_TAG}` = 'IssuesFound'")
    assert list(found["run_id"]) == [parent_id]
    found = mlflow.search_runs(search_all_experiments=True, output_format="list",
                               filter_string=f"tags.mlflow.parentRunId = '{parent_id}' AND tags.mltrace.rule_status = 'IssuesFound'")
    assert [r.info.run_id for r in found] == [child.info.run_id]

    # The JSON in the trial links the MLflow run (the TensorBoard plugin reads it without MLflow).
    [saved] = read_results(trial.storage)
    assert (saved.mlflow_run_id, saved.status, saved.first_step) == (child.info.run_id, "IssuesFound", 0)


def test_rule_that_finds_nothing(tracking, tmp_path):
    hook, _ = train(tmp_path / "trial", steps=3)
    result = invoke_rule(VanishingGradient(create_trial(str(tmp_path / "trial")), threshold=0.0), end_step=3)
    client = MlflowClient()
    parent = client.get_run(hook.sinks[0].run_id).data.tags
    assert parent[STATUS_TAG] == "NoIssuesFound"
    assert "mltrace.rule.VanishingGradient.first_step" not in parent and _keys.TAG_ISSUES_FOUND not in parent
    child = client.get_run(result.mlflow_run_id)
    assert child.data.tags[_keys.TAG_RULE_STATUS] == "NoIssuesFound"
    assert _history(client, result.mlflow_run_id, "condition_met") == [(0, 0.0), (1, 0.0), (2, 0.0)]


class _Broken(Rule):
    def invoke_at_step(self, step):
        if step == 1:
            raise RuntimeError("bug in my rule")
        return False


def test_rule_that_errors_fails_its_run(tracking, tmp_path):
    hook, _ = train(tmp_path / "trial", steps=3)
    trial = create_trial(str(tmp_path / "trial"))
    with pytest.raises(RuntimeError):
        invoke_rule(_Broken(trial), end_step=3)
    [result] = read_results(trial.storage)
    client = MlflowClient()
    run = client.get_run(result.mlflow_run_id)
    assert run.info.status == "FAILED" and "bug in my rule" in run.data.tags["mltrace.error"]
    assert client.get_run(hook.sinks[0].run_id).data.tags["mltrace.rule._Broken.status"] == "Error"


def test_top_level_rule_run_when_no_parent_is_known(tracking, tmp_path):
    train(tmp_path / "trial", steps=3, mlflow=None)  # no MLflow during training: no run file
    trial = create_trial(str(tmp_path / "trial"))
    assert not trial.storage.exists(paths.MLFLOW_RUN_FILE)
    result = invoke_rule(VanishingGradient(trial, threshold=1.0), end_step=3)
    run = MlflowClient().get_run(result.mlflow_run_id)
    assert _keys.PARENT_RUN_TAG not in run.data.tags
    assert run.data.tags[_keys.TAG_TRIAL] == str(tmp_path / "trial")
    assert run.data.tags[_keys.TAG_RUN_TYPE] == "rule"
    found = mlflow.search_runs(search_all_experiments=True,
                               filter_string=f"tags.`mltrace.trial` = '{tmp_path / 'trial'}'")
    assert list(found["run_id"]) == [result.mlflow_run_id]


def test_no_tracking_configured_no_run(tmp_path, monkeypatch):
    import mlflow.tracking._tracking_service.utils as tracking_utils

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)
    monkeypatch.chdir(tmp_path)
    train(tmp_path / "trial", steps=2, mlflow=None)
    result = invoke_rule(VanishingGradient(create_trial(str(tmp_path / "trial")), threshold=1.0), end_step=2)
    assert result.mlflow_run_id is None
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "mltrace.rules.rule_invoker", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_rule_runs_find_their_parent_from_the_trial_or_a_flag(tracking, tmp_path):
    env = dict(os.environ, MLTRACE_LOG_LEVEL="error")
    hook, _ = train(tmp_path / "logged", steps=3)
    parent_from_file = hook.sinks[0].run_id
    train(tmp_path / "plain", steps=3, mlflow=None)
    with mlflow.start_run() as other:
        pass
    done = _cli("--trial-dir", str(tmp_path / "logged"), "--rule-name", "VanishingGradient", "--threshold", "1",
                "--end-step", "3", env=env)
    assert done.returncode == 1, done.stderr  # condition met
    done = _cli("--trial-dir", str(tmp_path / "plain"), "--rule-name", "VanishingGradient", "--threshold", "1",
                "--end-step", "3", "--mlflow-parent-run-id", other.info.run_id, env=env)
    assert done.returncode == 1, done.stderr
    client = MlflowClient()
    for trial_dir, parent_id in (("logged", parent_from_file), ("plain", other.info.run_id)):
        [result] = read_results(create_trial(str(tmp_path / trial_dir)).storage)
        child = client.get_run(result.mlflow_run_id)
        assert child.data.tags[_keys.PARENT_RUN_TAG] == parent_id
        assert client.get_run(parent_id).data.tags[STATUS_TAG] == "IssuesFound"
    assert json.loads((tmp_path / "logged" / paths.MLFLOW_RUN_FILE).read_text())["run_id"] == parent_from_file
