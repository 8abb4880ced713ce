"""``mlflow={"system_metrics": True}``: MLflow's own system metrics (psutil sampling CPU, memory,
disk, network) land in the hook's run, from the hook option and from smdebug's JSON config, with
MLflow's sampling interval (MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL), never twice when MLflow's
own switch already samples the run, and a bad value fails at construction."""

from __future__ import annotations

import json
import time

import mlflow
import pytest
from mlflow import MlflowClient

import mltrace.pytorch as smd
from mltrace.exceptions import MltraceValueError
from tests.support.mlflow_env import train

CPU = "system/cpu_utilization_percentage"
MEMORY = "system/system_memory_usage_megabytes"


def _train_for(seconds: float, out_dir, **hook_kwargs):
    """Train (a few steps, then idle in the loop) for about ``seconds``; returns the hook."""
    hook, _ = train(out_dir, steps=3, close=False, **hook_kwargs)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    hook.close()
    return hook


def _system_steps(client, run_id, key):
    return [m.step for m in client.get_metric_history(run_id, key)]


def test_system_metrics_in_the_run_the_hook_starts(tracking, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.1")
    hook = _train_for(1.0, tmp_path / "run", mlflow={"system_metrics": True})
    client = MlflowClient(tracking)
    run = client.get_run(hook.sinks[0].run_id)
    assert run.info.status == "FINISHED"
    for key in (CPU, MEMORY):
        steps = _system_steps(client, run.info.run_id, key)
        assert len(steps) >= 3 and steps == list(range(len(steps))), (key, steps)
    assert 0.0 <= run.data.metrics[CPU] <= 100.0 * 64
    assert run.data.metrics[MEMORY] > 0
    # sampling stopped with the hook: no point is added after close
    count = len(client.get_metric_history(run.info.run_id, CPU))
    time.sleep(0.4)
    assert len(client.get_metric_history(run.info.run_id, CPU)) == count


def test_a_run_shorter_than_one_sampling_interval_still_gets_a_sample(tracking, tmp_path,
                                                                      monkeypatch):
    """MLflow logs a sample once an interval has passed; a run that ends sooner gets one sample
    at its end (what a short fine-tuning job or a test would otherwise lose)."""
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "30")
    hook = _train_for(0.2, tmp_path / "run", mlflow={"system_metrics": True})
    client = MlflowClient(tracking)
    run_id = hook.sinks[0].run_id
    for key in (CPU, MEMORY):
        assert _system_steps(client, run_id, key) == [0], key


def test_no_system_metrics_unless_asked(tracking, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.1")
    hook = _train_for(0.5, tmp_path / "run", mlflow=True)
    run = MlflowClient(tracking).get_run(hook.sinks[0].run_id)
    assert not [k for k in run.data.metrics if k.startswith("system/")]


def test_json_config_turns_system_metrics_on(tracking, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.1")
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"LocalPath": str(tmp_path / "run"), "HookParameters": {
        "save_interval": "1", "mlflow": json.dumps({"system_metrics": "true"})}}))
    hook = smd.Hook.create_from_json_file(str(config))
    run_id = hook.sinks[0].run_id
    time.sleep(0.6)
    hook.close()
    assert _system_steps(MlflowClient(tracking), run_id, CPU)


def test_bad_system_metrics_value_is_refused(tracking, tmp_path):
    with pytest.raises(MltraceValueError, match="system_metrics='sometimes' must be true or false"):
        smd.Hook(out_dir=str(tmp_path / "run"), mlflow={"system_metrics": "sometimes"})


def test_an_active_run_mlflow_already_samples_is_not_sampled_twice(tracking, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.1")
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")  # MLflow's own switch
    with mlflow.start_run() as run:
        hook = _train_for(0.8, tmp_path / "run", mlflow={"system_metrics": True})
        assert hook.sinks[0].run_id == run.info.run_id
    steps = _system_steps(MlflowClient(tracking), run.info.run_id, CPU)
    assert steps and len(steps) == len(set(steps)), steps  # one sampler: one point per step
