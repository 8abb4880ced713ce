"""Hook -> MLflow: metrics with steps, params, tags, artifacts, run reuse, options, autologging."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.utils.validation import _validate_metric_name, _validate_param_name, _validate_tag_name

import mltrace
import mltrace.pytorch as smd
from mltrace.exceptions import MltraceValueError
from mltrace.format import paths
from mltrace.trials import create_trial
from mltrace_mlflow import _keys, _tracking
from tests.support.mlflow_env import train

LOSS = "MSELoss_output_0"


def _history(client, run_id, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def _artifacts(client, run_id, path=None):
    out = []
    for info in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, info.path) if info.is_dir else [info.path]
    return out


def test_hook_logs_scalars_params_tags_and_artifacts(tracking, tmp_path):
    hook, losses = train(tmp_path / "trial", steps=6, eval_steps=2, export_tensorboard=True,
                         mlflow={"experiment": "sink", "logging_process": True})
    run_id = hook.sinks[0].run_id
    client = MlflowClient()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "sink"
    assert run.info.artifact_uri.startswith(str(tmp_path / "mlruns" / "sink"))  # beside mlflow.db

    # Losses (the losses collection) and save_scalar values at their global step (the TensorBoard
    # tab's and the rules' step), each mode's own step beside it as <mode>/mode_step.
    trial = create_trial(str(tmp_path / "trial"))
    logged = _history(client, run_id, LOSS)
    assert [s for s, _ in logged] == list(range(6))
    np.testing.assert_allclose([v for _, v in logged], losses["TRAIN"], rtol=1e-6)
    for step, value in logged:
        assert value == pytest.approx(float(trial.tensor(LOSS).value(step, mode=smd.modes.TRAIN)), rel=1e-6)
    assert [s for s, _ in _history(client, run_id, f"eval/{LOSS}")] == [6, 7]  # after 6 TRAIN steps
    assert _history(client, run_id, "eval/mode_step") == [(6, 0.0), (7, 1.0)]
    assert _history(client, run_id, "train/mode_step") == [(s, float(s)) for s in range(6)]
    assert trial.mode_modestep(6) == (smd.modes.EVAL, 0)  # the same pairing the trial records
    np.testing.assert_allclose([v for _, v in _history(client, run_id, f"eval/{LOSS}")], losses["EVAL"], rtol=1e-6)
    assert _history(client, run_id, "accuracy") == [(i, pytest.approx(i / 10)) for i in range(6)]

    # The hook's configuration as params, the trial as tags.
    params = run.data.params
    assert json.loads(params["mltrace.include_collections"]) == ["weights", "gradients", "losses"]
    assert json.loads(params["mltrace.save_config"])["save_interval"] == 1
    assert "mltrace.collection.gradients" in params
    tags = run.data.tags
    assert tags[_keys.TAG_TRIAL] == str(tmp_path / "trial")
    assert tags[_keys.TAG_FRAMEWORK] == "pytorch"
    assert tags[_keys.TAG_VERSION] == mltrace.__version__
    assert tags[_keys.TAG_RUN_TYPE] == "training"

    # Collections file, TensorBoard export and the summary as artifacts.
    files = _artifacts(client, run_id)
    assert "mltrace/collections/worker_0_collections.json" in files
    exported = sorted(str(p.relative_to(tmp_path / "trial")) for p in (tmp_path / "trial" / "tensorboard").rglob("*")
                      if p.is_file())
    assert exported and {f"mltrace/{p}" for p in exported} <= set(files)
    assert {"mltrace/summary.html", "mltrace/summary.json"} <= set(files)
    local = client.download_artifacts(run_id, "mltrace", str(tmp_path / "dl"))
    with open(f"{local}/collections/worker_0_collections.json") as f:
        assert json.load(f) == json.loads((tmp_path / "trial" / paths.collections_file_key("worker_0")).read_text())
    html = open(f"{local}/summary.html").read()
    assert "gradient/Sequential_0.weight" in html and "<svg" in html and "<script" not in html
    summary = json.load(open(f"{local}/summary.json"))
    weight = next(t for t in summary["tensors"] if t["name"] == "Sequential_0.weight")
    assert weight["steps"] == 8 and weight["collections"] == ["weights"] and weight["shape"] == [8, 4]
    assert weight["stats"]["mean"][0] == pytest.approx(float(trial.tensor("Sequential_0.weight").value(0).mean()))

    # The run file rules use to find their parent.
    run_file = _tracking.read_run_file(trial.storage)
    assert (run_file.run_id, run_file.experiment_id, run_file.tracking_uri) == (
        run_id, run.info.experiment_id, tracking)


def test_reuses_the_active_run_and_leaves_it_open(tracking, tmp_path):
    with mlflow.start_run() as active:
        hook, _ = train(tmp_path / "trial", steps=3)
        assert hook.sinks[0].run_id == active.info.run_id
        assert mlflow.active_run().info.run_id == active.info.run_id  # not ended by the hook
        mlflow.log_metric("user_metric", 1.0)
    client = MlflowClient()
    runs = client.search_runs([active.info.experiment_id])
    assert [r.info.run_id for r in runs] == [active.info.run_id]
    assert {"user_metric", LOSS, "accuracy"} <= set(runs[0].data.metrics)
    assert runs[0].data.tags[_keys.TAG_TRIAL] == str(tmp_path / "trial")


def test_starts_a_run_made_active_until_close(tracking, tmp_path):
    hook, _ = train(tmp_path / "trial", steps=2, close=False,
                    mlflow={"experiment": "new", "run_name": "first", "tags": {"team": "vision"}})
    run_id = hook.sinks[0].run_id
    assert mlflow.active_run().info.run_id == run_id  # the user's mlflow.log_* calls land in it
    hook.close()
    assert mlflow.active_run() is None
    run = MlflowClient().get_run(run_id)
    assert (run.info.run_name, run.info.status, run.data.tags["team"]) == ("first", "FINISHED", "vision")


def test_nested_and_run_id_options(tracking, tmp_path):
    client = MlflowClient()
    with mlflow.start_run() as parent:
        hook, _ = train(tmp_path / "nested", steps=2, mlflow={"nested": True})
        child = client.get_run(hook.sinks[0].run_id)
        assert child.data.tags[_keys.PARENT_RUN_TAG] == parent.info.run_id
        assert child.info.status == "FINISHED" and mlflow.active_run().info.run_id == parent.info.run_id
    existing = client.create_run("0")
    hook, _ = train(tmp_path / "explicit", steps=2, mlflow={"run_id": existing.info.run_id})
    run = client.get_run(existing.info.run_id)
    assert run.info.status == "RUNNING"  # not ours to end
    assert [s for s, _ in _history(client, existing.info.run_id, LOSS)] == [0, 1]


def test_json_config_mlflow_key(tracking, tmp_path, monkeypatch):
    def hook_from(value):
        config = tmp_path / "hook.json"
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        config.write_text(json.dumps({"LocalPath": str(out), "HookParameters": {"save_interval": "1", "mlflow": value}}))
        return smd.Hook.create_from_json_file(str(config))

    assert hook_from("false").sinks == []
    hook = hook_from("true")
    assert len(hook.sinks) == 1
    hook.close()
    hook = hook_from('{"experiment": "from-json", "run_name": "j"}')
    run = MlflowClient().get_run(hook.sinks[0].run_id)
    hook.close()
    assert run.info.run_name == "j"
    hook = hook_from({"experiment": "from-json"})
    hook.close()
    with pytest.raises(MltraceValueError, match="mlflow"):
        hook_from("maybe")
    with pytest.raises(MltraceValueError, match="experimnt"):
        smd.Hook(out_dir=str(tmp_path / "bad"), mlflow={"experimnt": "typo"})


def test_metric_names_and_values_respect_mlflow_limits(tracking, tmp_path):
    odd = ["val acc:top-1 (%)", "a//b", "./x", "x/", "..", "gradient/layer[0].weight", "é" * 300, "/lead"]
    for name in odd:
        key = _keys.clean_key(name)
        _validate_metric_name(key)
        _validate_param_name(key)
        _validate_tag_name(key)
        assert len(key) <= 250
    assert len(_keys.tag_value("m" * 9000)) == 8000 and len(_keys.param_value("p" * 7000)) == 6000

    hook = smd.Hook(out_dir=str(tmp_path / "trial"), mlflow=True)
    for step in range(3):
        hook.begin_step()  # no model: advance steps by hand
        hook.save_scalar("val acc:top-1 (%)", step)
        hook.save_scalar("weird//name/", step)
    run_id = hook.sinks[0].run_id
    hook.close()
    metrics = MlflowClient().get_run(run_id).data.metrics
    assert set(metrics) == {"val acc:top-1 ___", "weird/name"}


def _spy_log_batch(monkeypatch, sink):
    calls = []
    original = sink.client.log_batch

    def spy(run_id, metrics=(), params=(), tags=(), synchronous=None):
        calls.append((threading.current_thread().name, len(metrics)))
        return original(run_id, metrics=metrics, params=params, tags=tags, synchronous=synchronous)

    monkeypatch.setattr(sink.client, "log_batch", spy)
    return calls


def test_metrics_are_logged_by_a_helper_process(tracking, tmp_path, monkeypatch):
    hook = smd.Hook(out_dir=str(tmp_path / "trial"), mlflow={"flush_interval": 0.2, "logging_process": True})
    sink = hook.sinks[0]
    calls = _spy_log_batch(monkeypatch, sink)
    helper = sink._transport.proc
    for step in range(300):
        hook.begin_step()
        hook.save_scalar("acc", step / 300)
        if step == 150:
            time.sleep(0.5)  # let some batches go to the helper
    hook.close()
    assert helper.returncode == 0  # ended at close, after logging everything
    assert not [c for c in calls if c[1]]  # no metric was logged from this process
    history = MlflowClient().get_metric_history(sink.run_id, "acc")
    assert sorted(m.step for m in history) == list(range(300))


def test_a_dead_helper_process_falls_back_to_a_thread(tracking, tmp_path, monkeypatch, caplog):
    hook = smd.Hook(out_dir=str(tmp_path / "trial"), mlflow={"flush_interval": 0.1, "logging_process": True})
    sink = hook.sinks[0]
    sink._transport.wait_ready()
    os.kill(sink._transport.pid, signal.SIGKILL)  # the helper this sink started
    sink._transport.proc.wait()
    with caplog.at_level(logging.WARNING, logger="mltrace_mlflow"):
        for step in range(50):
            hook.begin_step()
            hook.save_scalar("acc", step / 50)
        hook.close()
    assert any("helper process" in r.getMessage() for r in caplog.records)
    assert sorted(m.step for m in MlflowClient().get_metric_history(sink.run_id, "acc")) == list(range(50))


def test_thread_logging_is_batched_off_the_training_thread(tracking, tmp_path, monkeypatch):
    hook = smd.Hook(out_dir=str(tmp_path / "trial"), mlflow={"flush_interval": 60, "logging_process": False})
    sink = hook.sinks[0]
    calls = _spy_log_batch(monkeypatch, sink)
    for step in range(2500):
        hook.begin_step()
        hook.save_scalar("lr", 0.1)
        hook.save_scalar("acc", step / 2500)
    hook.close()
    metric_calls = [(t, n) for t, n in calls if n]
    assert {t for t, _ in metric_calls} == {"mltrace-mlflow"}
    assert sum(n for _, n in metric_calls) == 5000
    assert max(n for _, n in metric_calls) <= 1000 and len(metric_calls) <= 12
    history = MlflowClient().get_metric_history(sink.run_id, "acc")
    assert len(history) == 2500 and sorted(m.step for m in history) == list(range(2500))


def test_mlflow_failures_never_stop_training(tracking, tmp_path, monkeypatch, caplog):
    hook = smd.Hook(out_dir=str(tmp_path / "trial"), save_config=smd.SaveConfig(save_interval=1),
                    mlflow={"flush_interval": 0.05, "logging_process": False})
    sink = hook.sinks[0]

    def broken(*args, **kwargs):
        raise ConnectionError("tracking server gone")

    monkeypatch.setattr(sink.client, "log_batch", broken)
    with caplog.at_level(logging.ERROR, logger="mltrace_mlflow"):
        for step in range(20):
            hook.begin_step()
            hook.save_scalar("loss", 1.0 / (step + 1))
        hook.close()
    assert sum("tracking server gone" in r.getMessage() for r in caplog.records) == 1
    assert create_trial(str(tmp_path / "trial")).tensor("scalar/loss").steps()  # the trial is intact


def test_hook_closed_without_steps_ends_its_run(tracking, tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "trial"), mlflow=True)
    run_id = hook.sinks[0].run_id
    hook.close()
    assert MlflowClient().get_run(run_id).info.status == "FINISHED"
    assert mlflow.active_run() is None


def test_autologging_metrics_are_not_logged_twice(tracking, tmp_path):
    """mlflow.xgboost.autolog logs ``train-rmse`` per round into the active run, and so would
    mltrace's XGBoost hook (its metrics collection): the name is logged once, by autologging;
    what only mltrace sees is still logged."""
    import mlflow.xgboost
    import xgboost as xgb

    import mltrace.xgboost as smd_xgb

    mlflow.xgboost.autolog(log_models=False, log_datasets=False, log_input_examples=False,
                           log_model_signatures=False)
    try:
        hook = smd_xgb.Hook(out_dir=str(tmp_path / "trial"), include_collections=["metrics"],
                            save_config=smd_xgb.SaveConfig(save_interval=1), mlflow=True)
        run_id = hook.sinks[0].run_id  # the hook's run is active: autologging logs into it
        rng = np.random.default_rng(0)
        x = rng.random((64, 3))
        data = xgb.DMatrix(x, label=x.sum(1))
        xgb.train({"objective": "reg:squarederror"}, data, num_boost_round=6, evals=[(data, "train")],
                  callbacks=[hook])
        hook.save_scalar("only_mltrace", 1.0)
        hook.close()
    finally:
        mlflow.xgboost.autolog(disable=True)
    client = MlflowClient()
    assert sorted(m.step for m in client.get_metric_history(run_id, "train-rmse")) == list(range(6))
    assert len(client.get_metric_history(run_id, "only_mltrace")) == 1
    trial = create_trial(str(tmp_path / "trial"))
    assert trial.tensor("train-rmse").steps() == list(range(6))  # the trial has it all the same


def test_default_store_is_sqlite_never_the_file_store(tmp_path, monkeypatch):
    import mlflow.tracking._tracking_service.utils as tracking_utils

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlruns" / "0").mkdir(parents=True)  # an old file store here: MLflow would pick it
    (tmp_path / "mlruns" / "0" / "meta.yaml").write_text("name: Default\n")
    assert _tracking.resolve_tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert _tracking.resolve_tracking_uri("sqlite:///rel.db") == f"sqlite:///{tmp_path / 'rel.db'}"
    with pytest.raises(MltraceValueError, match="file store"):
        _tracking.resolve_tracking_uri(str(tmp_path / "mlruns"))
    with pytest.raises(MltraceValueError, match="file store"):
        _tracking.resolve_tracking_uri("file:///tmp/mlruns")


def test_a_hook_never_closed_is_closed_at_exit(tracking, tmp_path):
    """A script that forgets hook.close(): the interpreter's exit closes the hook, which waits
    for its helper process, logs the artifacts and ends the run."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from tests.support.mlflow_env import train\n"
        "hook, _ = train(sys.argv[1], steps=4, close=False, mlflow={'logging_process': True})\n"
        "print(hook.sinks[0].run_id)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "trial"), root], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, MLTRACE_LOG_LEVEL="error"))
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split()[-1]
    client = MlflowClient()
    assert client.get_run(run_id).info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run_id, LOSS)) == list(range(4))
    assert "mltrace/summary.html" in _artifacts(client, run_id)
    assert (tmp_path / "trial" / "training_job_end.ts").exists()


def test_unreachable_tracking_server_never_stops_training(tracking, tmp_path, monkeypatch, caplog):
    from mltrace_mlflow.sink import NullSink

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    with caplog.at_level(logging.ERROR, logger="mltrace_mlflow"):
        hook, _ = train(tmp_path / "trial", steps=2, mlflow={"tracking_uri": dead})
    assert isinstance(hook.sinks[0], NullSink)
    assert any("MLflow logging is off" in r.getMessage() for r in caplog.records)
    assert create_trial(str(tmp_path / "trial")).steps() == [0, 1]
    with pytest.raises(Exception):
        train(tmp_path / "strict", steps=1, mlflow={"tracking_uri": dead}, strict=True)
