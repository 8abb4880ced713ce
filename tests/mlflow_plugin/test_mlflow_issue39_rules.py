"""A rule run's counts are summary values (one value each, at step 0: a bar per run in MLflow's
chart view, a numeric column in its runs table), not per-step series with one point; and the
experiments mltrace creates are tagged for the machine-learning view. Against a real server."""

from __future__ import annotations

import mlflow
from mlflow import MlflowClient

from mltrace.rules import Rule, invoke_rule
from mltrace.trials import create_trial
from mltrace_mlflow import _tracking, links, rules
from mltrace_mlflow.compare import compare_runs
from tests.support.mlflow_env import train


class _FiresAt(Rule):
    """Fires at the steps given."""

    def __init__(self, base_trial, steps=(3, 7)):
        super().__init__(base_trial)
        self.steps = set(steps)

    def invoke_at_step(self, step: int) -> bool:
        return step in self.steps


def test_rule_run_counts_are_one_value_at_step_0_not_a_series(server, tmp_path):
    hook, _ = train(tmp_path / "trial", steps=10, mlflow={"experiment": "counts"})
    result = invoke_rule(_FiresAt(create_trial(str(tmp_path / "trial"))), end_step=10)
    client = MlflowClient()
    run = client.get_run(result.mlflow_run_id)
    for key, count in (("evaluated_steps", 10), ("fired_steps", 2)):
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in history] == [(0, count)], key
        assert run.data.metrics[key] == count  # the runs table's column: the latest value
    assert rules.SUMMARY_METRICS == ("evaluated_steps", "fired_steps")
    # MLflow 3.17's chart view draws a line for a metric whose latest value (the one at the
    # highest step) has step >= 1, and a bar per run otherwise: the counts are bars, while
    # condition_met, a value per evaluated step, stays a line.
    condition = client.get_metric_history(run.info.run_id, "condition_met")
    assert sorted(m.step for m in condition) == list(range(10))
    found = mlflow.search_runs(experiment_names=["counts"], filter_string="metrics.fired_steps > 1")
    assert list(found["run_id"]) == [run.info.run_id]  # filtered as a number
    assert hook.sinks[0].run_id not in list(found["run_id"])


def test_experiments_mltrace_creates_are_tagged_machine_learning(server, tmp_path, monkeypatch):
    client = MlflowClient()
    hook, _ = train(tmp_path / "by-name", steps=2, mlflow={"experiment": "named-here"})
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "named-by-env")
    train(tmp_path / "by-env", steps=2)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    compare_runs(["named-here"], out_dir=str(tmp_path / "cmp"))  # logs to mltrace-comparisons
    for name in ("named-here", "named-by-env", "mltrace-comparisons"):
        experiment = client.get_experiment_by_name(name)
        assert experiment.tags.get(links.EXPERIMENT_KIND_TAG) == links.MACHINE_LEARNING_KIND, name
    # An experiment someone else made is used as it is (the tag is MLflow's UI's to set there).
    theirs = client.create_experiment("theirs")
    assert _tracking.experiment_id_for(client, "theirs") == theirs
    assert links.EXPERIMENT_KIND_TAG not in client.get_experiment(theirs).tags
