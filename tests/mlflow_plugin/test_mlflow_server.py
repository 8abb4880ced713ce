"""Against a real ``mlflow server`` on 127.0.0.1 whose artifacts are proxied to a real S3 server
(SeaweedFS): the hook's run, its artifacts in the bucket, a rule's child run, a comparison."""

from __future__ import annotations

import mlflow
import pytest
from mlflow import MlflowClient

from mltrace.rules import invoke_rule
from mltrace.rules.builtin.vanishing_gradient import VanishingGradient
from mltrace.trials import create_trial
from mltrace_mlflow import _tracking
from mltrace_mlflow.compare import compare_runs
from tests.support.mlflow_env import train

LOSS = "MSELoss_output_0"


def _bucket_keys(server, prefix):
    listing = server.s3.client().list_objects_v2(Bucket=server.bucket, Prefix=prefix)
    return {obj["Key"][len(prefix):] for obj in listing.get("Contents", [])}


def test_hook_rule_and_compare_through_the_server(server, tmp_path):
    hook, losses = train(tmp_path / "trial", steps=5, mlflow={"experiment": "on-server"})
    run_id = hook.sinks[0].run_id
    client = MlflowClient()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    history = sorted(client.get_metric_history(run_id, LOSS), key=lambda m: m.step)
    assert [m.step for m in history] == list(range(5))
    assert [m.value for m in history] == pytest.approx(losses["TRAIN"], rel=1e-6)
    assert "mltrace.include_collections" in run.data.params
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")

    # Artifacts went through the server into the S3 bucket.
    stored = _bucket_keys(server, f"{run.info.experiment_id}/{run_id}/artifacts/")
    assert {"mltrace/summary.html", "mltrace/summary.json", "mltrace/collections/worker_0_collections.json"} <= stored
    assert "Sequential_0.weight" in mlflow.artifacts.load_text(f"runs:/{run_id}/mltrace/summary.html")

    # The run file names the server; a rule run is the training run's child there.
    trial = create_trial(str(tmp_path / "trial"))
    assert _tracking.read_run_file(trial.storage).tracking_uri == server.uri
    result = invoke_rule(VanishingGradient(trial, threshold=1.0), end_step=5)
    child = client.get_run(result.mlflow_run_id)
    assert child.data.tags["mlflow.parentRunId"] == run_id
    assert client.get_run(run_id).data.tags["mltrace.rule.VanishingGradient.status"] == "IssuesFound"
    found = mlflow.search_runs(experiment_names=["on-server"],
                               filter_string="tags.`mltrace.rule.VanishingGradient.status` = 'IssuesFound'")
    assert list(found["run_id"]) == [run_id]

    # A comparison, logged to the server (artifacts in S3 too).
    comparison = compare_runs(["on-server"], tensors=[LOSS], out_dir=str(tmp_path / "cmp"))
    assert [r["run_id"] for r in comparison.rows] == [run_id]
    logged = client.get_run(comparison.mlflow_run_id)
    assert "comparison/comparison.png" in _bucket_keys(
        server, f"{logged.info.experiment_id}/{comparison.mlflow_run_id}/artifacts/")


def test_trial_on_s3_logged_to_the_server(server, tmp_path, monkeypatch):
    """The trial itself on S3 (and its TensorBoard export): run file, artifacts and summary are
    read through mltrace's S3 storage."""
    bucket = "trials"
    server.s3.client().create_bucket(Bucket=bucket)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.s3.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    uri = f"s3://{bucket}/jobs/run1"
    hook, _ = train(uri, steps=3, export_tensorboard=True, mlflow={"experiment": "s3-trials"})
    run_id = hook.sinks[0].run_id
    client = MlflowClient()
    run = client.get_run(run_id)
    assert run.data.tags["mltrace.trial"] == uri
    stored = _bucket_keys(server, f"{run.info.experiment_id}/{run_id}/artifacts/")
    assert "mltrace/collections/worker_0_collections.json" in stored and "mltrace/summary.json" in stored
    assert any(key.startswith("mltrace/tensorboard/") for key in stored)
    summary = mlflow.artifacts.load_dict(f"runs:/{run_id}/mltrace/summary.json")
    assert summary["trial"] == uri and summary["modes"]["TRAIN"]["steps"] == 3
    result = invoke_rule(VanishingGradient(create_trial(uri), threshold=1.0), end_step=3)
    assert client.get_run(result.mlflow_run_id).data.tags["mlflow.parentRunId"] == run_id
