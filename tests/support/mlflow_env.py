"""MLflow test helpers: a SQLite tracking store under tmp_path for each test, and a small
training loop whose hook logs to MLflow.

The fixtures ``mlflow_template_db`` and ``tracking`` (tests/conftest.py) are built on these.
Migrating a fresh MLflow database takes seconds, so one migrated template per session is copied
into each test's tmp_path (its default experiment re-pointed at the test's folder). The test runs
with its cwd in tmp_path and MLFLOW_TRACKING_URI set, so nothing lands in the repository.
Sinks default to logging from their thread (MLTRACE_MLFLOW_PROCESS=0) unless a test asks for
the helper process.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import mltrace.pytorch as smd


def use_tracking_uri(uri: str, monkeypatch: Any, cwd: Any) -> None:
    """Point MLflow (and mltrace's sinks, logging from their thread) at ``uri`` for one test,
    with no experiment or run inherited from the environment; cwd = ``cwd``."""
    for var in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLTRACE_MLFLOW_PARENT_RUN_ID", "MLTRACE_TRIAL",
                "MLFLOW_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # loopback only: no usage reports
    # Sinks log from their thread here (a helper process costs seconds of MLflow import per hook);
    # tests that are about the helper process ask for it with logging_process=True.
    monkeypatch.setenv("MLTRACE_MLFLOW_PROCESS", "0")
    monkeypatch.chdir(cwd)


def end_active_runs() -> None:
    """End the runs a test left active, and forget its experiment."""
    import mlflow
    import mlflow.tracking.fluent as fluent

    while mlflow.active_run() is not None:
        mlflow.end_run()
    fluent._active_experiment_id = None


def train(out_dir: str, steps: int = 5, mlflow: Any = True, lr: float = 0.05, eval_steps: int = 0,
          collections=("weights", "gradients", "losses"), scalar: str | None = "accuracy",
          close: bool = True, seed: int = 0, **hook_kwargs: Any):
    """Train a tiny MLP ``steps`` steps (then ``eval_steps`` in EVAL mode) with a hook saving
    every step; ``scalar`` is saved with save_scalar each step. Returns (hook, losses by mode)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=list(collections), mlflow=mlflow, **hook_kwargs)
    hook.register_module(model)
    loss_fn = nn.MSELoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    losses: dict[str, list[float]] = {"TRAIN": [], "EVAL": []}
    hook.set_mode(smd.modes.TRAIN)
    for i in range(steps):
        x = torch.randn(16, 4, generator=gen)
        y = x.sum(1, keepdim=True)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses["TRAIN"].append(loss.item())
        if scalar:
            hook.save_scalar(scalar, i / 10, sm_metric=True)
    if eval_steps:
        hook.set_mode(smd.modes.EVAL)
        with torch.no_grad():
            for _ in range(eval_steps):
                x = torch.randn(16, 4, generator=gen)
                losses["EVAL"].append(float(loss_fn(model(x), x.sum(1, keepdim=True))))
    if close:
        hook.close()
    return hook, losses
