"""The training run's loss at every step, whatever the save interval (mltrace_mlflow._sink_losses),
against a real MLflow server: the trial keeps its saved steps, MLflow gets every step once."""

from __future__ import annotations

import pytest
import torch
from mlflow import MlflowClient
from torch import nn

import mltrace.pytorch as smd
from mltrace.trials import create_trial

LOSS = "MSELoss_output_0"


def _train(out_dir, mlflow, steps=20, eval_steps=0, interval=5, calls=1):
    """A tiny model saving every ``interval`` steps; returns (run id, losses by mode)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=interval),
                    include_collections=["weights", "losses"], mlflow=mlflow)
    hook.register_module(model)
    loss_fn = nn.MSELoss()
    hook.register_loss(loss_fn)  # after the hook (and its sink) exist, as scripts do
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    losses: dict[str, list[list[float]]] = {"TRAIN": [], "EVAL": []}
    for mode, count in (("TRAIN", steps), ("EVAL", eval_steps)):
        hook.set_mode(smd.modes.TRAIN if mode == "TRAIN" else smd.modes.EVAL)
        for _ in range(count):
            x = torch.randn(16, 4, generator=gen)
            out = model(x)
            step_losses = [loss_fn(out, x.sum(1, keepdim=True) * (k + 1)) for k in range(calls)]
            if mode == "TRAIN":
                opt.zero_grad()
                sum(step_losses).backward()
                opt.step()
            losses[mode].append([loss.item() for loss in step_losses])
    run_id = hook.sinks[0].run_id
    hook.close()
    return run_id, losses


def _history(run_id, key):
    return sorted((m.step, m.value) for m in MlflowClient().get_metric_history(run_id, key))


def test_the_loss_has_a_value_at_every_step_with_save_interval_5(server, tmp_path):
    run_id, losses = _train(tmp_path / "trial", {"experiment": "every-step"}, steps=20,
                            eval_steps=4)
    trial = create_trial(str(tmp_path / "trial"))
    assert trial.tensor(LOSS).steps() == [0, 5, 10, 15, 20]  # the trial: saved steps only

    train = _history(run_id, LOSS)
    assert [step for step, _ in train] == list(range(20))  # each step once, saved ones included
    assert [value for _, value in train] == pytest.approx([v[0] for v in losses["TRAIN"]], rel=1e-6)
    evaluation = _history(run_id, f"eval/{LOSS}")  # EVAL steps follow at global steps 20..23
    assert [step for step, _ in evaluation] == [20, 21, 22, 23]
    assert [value for _, value in evaluation] == pytest.approx([v[0] for v in losses["EVAL"]],
                                                               rel=1e-6)


def test_a_loss_module_called_twice_a_step_logs_both_calls(server, tmp_path):
    run_id, losses = _train(tmp_path / "trial", {"experiment": "every-step"}, steps=7, calls=2)
    for index in (0, 1):
        history = _history(run_id, f"MSELoss_output_{index}")
        assert [step for step, _ in history] == list(range(7))
        assert [value for _, value in history] == pytest.approx(
            [v[index] for v in losses["TRAIN"]], rel=1e-6)


def test_loss_every_step_false_logs_saved_steps_only(server, tmp_path):
    run_id, losses = _train(tmp_path / "trial", {"experiment": "every-step",
                                                 "loss_every_step": False}, steps=20)
    history = _history(run_id, LOSS)
    assert [step for step, _ in history] == [0, 5, 10, 15]
    assert [value for _, value in history] == pytest.approx(
        [losses["TRAIN"][step][0] for step in (0, 5, 10, 15)], rel=1e-6)


class _DeviceLoss:
    """A loss on an accelerator, as the sink sees it: reading it (float) is what would make the
    training thread wait for the device, so it counts reads."""

    is_cpu = False

    def __init__(self, value):
        self.value, self.reads = value, 0

    def numel(self):
        return 1

    def detach(self):
        return self

    def __float__(self):
        self.reads += 1
        return self.value


def test_a_device_loss_is_read_by_the_sink_thread_not_the_training_thread():
    from mltrace_mlflow._sink_losses import _kept, as_float

    loss = _DeviceLoss(0.25)
    kept = _kept(loss)  # the training thread's part: a reference, no read
    assert kept is loss and loss.reads == 0
    assert as_float(kept) == 0.25 and loss.reads == 1  # the background thread's part
    assert _kept(torch.tensor(0.5, requires_grad=True) * 2) == 1.0  # CPU: a float at once
