"""Trials for the TensorBoard tests: one written by the real PyTorch hook (with its TensorBoard
export, a rule result and an MLflow run file), one with two workers, and a plain TensorBoard run.
"""

from __future__ import annotations

import json
import os

import numpy as np
from torch import nn

import mltrace.pytorch as smd
from mltrace.format import paths
from mltrace.rules.results import ISSUES_FOUND, NO_ISSUES_FOUND, RuleResult
from mltrace.storage import open_storage
from tests.rule_trials import red, write_trial
from tests.torch_training import make_model, train

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


__all__ = ["make_torch_trial", "make_worker_trial", "make_plain_tensorboard_run", "LOSS", "WEIGHT", "GRAD",
           "MLFLOW_URL"]
