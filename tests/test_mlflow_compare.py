"""Compare training runs across experiments: table, PNG, rule findings, logged as artifacts."""

from __future__ import annotations

import csv

import pytest
from mlflow import MlflowClient
from PIL import Image

from mlflow_plugin.compare import compare_runs
from mltrace import cli
from mltrace.exceptions import MltraceValueError
from mltrace.rules import invoke_rule
from mltrace.rules.builtin.vanishing_gradient import VanishingGradient
from mltrace.trials import create_trial
from tests.mlflow_env import mlflow_template_db, tracking, train  # noqa: F401

LOSS = "MSELoss_output_0"


@pytest.fixture
def two_experiments(tracking, tmp_path):
    """baseline: lr 0.05 (a rule fired); sweep: lr 0.01 and lr 0.2; plus a run without a trial."""
    runs = {}
    for exp, lr in (("baseline", 0.05), ("sweep", 0.01), ("sweep", 0.2)):
        hook, _ = train(tmp_path / f"{exp}-{lr}", steps=6, mlflow={"experiment": exp, "run_name": f"lr={lr}",
                                                                   "tags": {"lr": str(lr)}})
        runs[lr] = hook.sinks[0].run_id
    invoke_rule(VanishingGradient(create_trial(str(tmp_path / "baseline-0.05")), threshold=1.0), end_step=6)
    MlflowClient().create_run(MlflowClient().get_experiment_by_name("sweep").experiment_id)  # not mltrace's
    return runs


def test_compare_across_experiments(two_experiments, tmp_path):
    result = compare_runs(["baseline", "sweep"], tensors=[LOSS, "Sequential_0.weight"], stats=["mean", "l2"],
                          out_dir=str(tmp_path / "out"))
    assert [r["run_id"] for r in result.rows] == [two_experiments[lr] for lr in (0.05, 0.01, 0.2)]  # no rule runs
    assert [r["run"] for r in result.rows] == ["baseline/lr=0.05", "sweep/lr=0.01", "sweep/lr=0.2"]
    first = result.rows[0]
    trial = create_trial(str(tmp_path / "baseline-0.05"))
    assert first[f"{LOSS} mean (last)"] == pytest.approx(float(trial.tensor(LOSS).value(5)))
    assert first["Sequential_0.weight l2 (last)"] == pytest.approx(
        float(trial.tensor("Sequential_0.weight").reduction_value(5, "l2")), rel=1e-6)
    assert first["rules"] == "VanishingGradient: IssuesFound @0" and result.rows[1]["rules"] is None
    assert set(result.series) == {f"{LOSS} · mean", f"{LOSS} · l2", "Sequential_0.weight · mean",
                                  "Sequential_0.weight · l2"}
    steps, values = result.series[f"{LOSS} · mean"]["sweep/lr=0.2"]
    assert steps == list(range(6)) and len(values) == 6

    with Image.open(result.plot_path) as image:
        assert image.format == "PNG"
    with open(result.table_path) as f:
        assert [row["run"] for row in csv.DictReader(f)] == ["baseline/lr=0.05", "sweep/lr=0.01", "sweep/lr=0.2"]
    assert "baseline/lr=0.05" in result.to_text() and len(result.to_dataframe()) == 3

    client = MlflowClient()
    logged = client.get_run(result.mlflow_run_id)
    assert client.get_experiment(logged.info.experiment_id).name == "mltrace-comparisons"
    assert logged.data.tags["mltrace.run_type"] == "comparison"
    assert {a.path for a in client.list_artifacts(result.mlflow_run_id, "comparison")} == {
        "comparison/comparison.csv", "comparison/comparison.json", "comparison/comparison.png"}


def test_compare_with_a_filter_string(two_experiments, tmp_path):
    result = compare_runs(filter_string="tags.lr = '0.2'", out_dir=str(tmp_path / "out"), log_to_mlflow=False)
    assert [r["run_id"] for r in result.rows] == [two_experiments[0.2]]
    assert f"{LOSS} mean (last)" in result.rows[0]  # default tensors: the losses collection
    assert result.mlflow_run_id is None


def test_mltrace_compare_command(two_experiments, tmp_path, capsys):
    code = cli.main(["compare", "baseline", "sweep", "--stat", "abs_max", "--out", str(tmp_path / "cli"), "--no-log"])
    out = capsys.readouterr().out
    assert code == 0
    assert "sweep/lr=0.01" in out and f"{LOSS} abs_max (last)" in out and "VanishingGradient: IssuesFound" in out
    assert (tmp_path / "cli" / "comparison.png").exists()
    assert cli.main(["compare", "no-such-experiment", "--no-log"]) == 2
    assert "no MLflow experiment named 'no-such-experiment'" in capsys.readouterr().err
    with pytest.raises(MltraceValueError, match="no mltrace training run"):
        compare_runs(["Default"], log_to_mlflow=False)
