"""Trials for the TensorBoard tests: one written by the real PyTorch hook (with its TensorBoard
export, a rule result and an MLflow run file), one with two workers, and a plain TensorBoard run.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from torch import nn

import mltrace.pytorch as smd
from mltrace.format import paths
from mltrace.rules.results import ISSUES_FOUND, NO_ISSUES_FOUND, RuleResult
from mltrace.storage import open_storage
from tests.support.rule_trials import red, write_trial
from tests.support.torch_training import make_model, train

LOSS = "MSELoss_output_0"
WEIGHT = "Sequential_0.weight"
GRAD = "gradient/Sequential_0.weight"
MLFLOW_URL = "http://127.0.0.1:5999"


def make_torch_trial(path, train_steps: int = 6, eval_steps: int = 2) -> str:
    """A trial of a tiny PyTorch model: TRAIN then EVAL, weights + losses raw, gradients as
    reductions only, a save_scalar, and its TensorBoard export; plus two rule results."""
    out = str(path)
    hook = smd.Hook(out_dir=out, export_tensorboard=True, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"])
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(
        reductions=["min", "max", "mean", "std"], norms=["l2"], abs_reductions=["max"])
    model, loss_fn = make_model(), nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    train(model, hook, train_steps, loss_fn=loss_fn)
    hook.save_scalar("lr", 0.05)
    train(model, hook, eval_steps, mode=smd.modes.EVAL, loss_fn=loss_fn, start=train_steps)
    hook.close()
    storage = open_storage(out)
    fired = RuleResult(rule="LossNotDecreasing", trial=out, parameters={"num_steps": 3, "mode": "TRAIN"},
                       status=ISSUES_FOUND, evaluated_steps=train_steps, fired_steps=[3, 4], first_step=3,
                       message="loss <b>did not</b> decrease", mlflow_run_id="abc123", mlflow_experiment_id="7",
                       mlflow_url=f"{MLFLOW_URL}/#/experiments/7/runs/abc123?workflowType=machine_learning",
                       started=1_700_000_000.0, ended=1_700_000_010.0)
    quiet = RuleResult(rule="VanishingGradient", trial=out, parameters={"threshold": 1e-7}, status=NO_ISSUES_FOUND,
                       evaluated_steps=train_steps, started=1_700_000_100.0, ended=1_700_000_110.0)
    for result in (fired, quiet):
        storage.write(result.key, result.to_json().encode())
    storage.write(paths.MLFLOW_RUN_FILE, json.dumps({"run_id": "train1", "experiment_id": "7",
                                                     "tracking_uri": MLFLOW_URL}).encode())
    return out


def make_worker_trial(path, steps: int = 4) -> str:
    """Two workers' files in one trial: ``w`` (a 3-vector) differs per worker, plus its reductions."""
    out = str(path)
    for k, worker in enumerate(("worker_0", "worker_1")):
        data = {}
        for s in range(steps):
            value = np.array([1.0, 2.0, 3.0]) * (s + 1) + 10 * k
            data[s] = {"w": value, red("w", "mean"): value.mean(), red("w", "l2"): np.linalg.norm(value)}
        write_trial(out, data, collections={"weights": ["^w$"]}, worker=worker)
    return out


def make_plain_tensorboard_run(folder) -> str:
    """An ordinary TensorBoard run (torch's SummaryWriter) that the logdir also holds."""
    from torch.utils.tensorboard import SummaryWriter

    os.makedirs(str(folder), exist_ok=True)
    writer = SummaryWriter(str(folder))
    for step in range(3):
        writer.add_scalar("plain/loss", 1.0 / (step + 1), step)
    writer.close()
    return str(folder)


_LIVE: dict[str, tuple[Any, str]] = {}


def start_live(key, path) -> str:
    """A trial still being written (no end marker): its collections now, steps with
    write_live_steps, the end with end_live; ``key`` names it between the calls."""
    from mltrace.collections import Collection, CollectionManager
    from mltrace.writer import TrialWriter

    writer = TrialWriter(open_storage(str(path)), "worker_0")
    manager = CollectionManager()
    manager.add(Collection("gradients", include_regex=["^gradient/"]))
    writer.write_collections(manager.to_json())
    writer.flush()
    _LIVE[str(key)] = (writer, str(path))
    return str(path)


def write_live_steps(key, steps, names: list[str]) -> None:
    """TRAIN steps of the live trial ``key``: the l2 of each tensor of ``names`` (step + 1)."""
    from mltrace.modes import ModeKeys

    writer, _ = _LIVE[str(key)]
    for s in steps:
        writer.open_step(s, ModeKeys.TRAIN, s)
        for n in names:
            writer.add_tensor(red(n, "l2"), np.float64(s + 1), ModeKeys.TRAIN, s, wall_time=1.0)
        writer.close_step()
    writer.flush()  # files are written by the writer's thread: on disk now, as a hook's flush


def end_live(key) -> None:
    """Training of the live trial ``key`` ends (its end marker)."""
    writer, _ = _LIVE.pop(str(key))
    writer.write_end_marker()
    writer.close()


__all__ = ["make_torch_trial", "make_worker_trial", "make_plain_tensorboard_run", "LOSS", "WEIGHT", "GRAD",
           "MLFLOW_URL", "start_live", "write_live_steps", "end_live"]
