"""The run-context provider: MLflow runs started while a hook is open record mltrace's version and
the trial location; it is registered through the mlflow.run_context_provider entry point."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import mlflow
from mlflow.tracking.context.registry import _run_context_provider_registry, resolve_tags

import mltrace
import mltrace.pytorch as smd
from mltrace_mlflow import _keys
from mltrace_mlflow.context import MltraceRunContextProvider


def test_entry_points_are_registered():
    providers = {ep.name: ep.value for ep in entry_points(group="mlflow.run_context_provider")}
    assert providers["mltrace"] == "mltrace_mlflow.context:MltraceRunContextProvider"
    listeners = {ep.name: ep.value for ep in entry_points(group="mltrace.rule_listeners")}
    assert listeners["mlflow"] == "mltrace_mlflow.rules:create_listener"
    assert any(isinstance(p, MltraceRunContextProvider) for p in _run_context_provider_registry)


def test_runs_started_while_a_hook_is_open_are_tagged(tracking, tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "trial"))  # not logging to MLflow itself
    with mlflow.start_run() as run:
        pass
    tags = mlflow.get_run(run.info.run_id).data.tags
    assert tags[_keys.TAG_VERSION] == mltrace.__version__
    assert tags[_keys.TAG_TRIAL] == str(tmp_path / "trial")
    hook.close()
    with mlflow.start_run() as after:
        pass
    assert _keys.TAG_TRIAL not in mlflow.get_run(after.info.run_id).data.tags


def test_trial_from_environment(tracking, monkeypatch):
    monkeypatch.setenv("MLTRACE_TRIAL", "s3://bucket/run1")
    assert resolve_tags()[_keys.TAG_TRIAL] == "s3://bucket/run1"


def test_core_and_plugin_imports_stay_light():
    code = ("import sys, mltrace, mltrace_mlflow, mltrace_mlflow.plots, mltrace_mlflow.summary\n"
            "heavy = [m for m in ('mlflow', 'matplotlib', 'torch') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
