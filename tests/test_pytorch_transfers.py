"""The PyTorch adapter moves a step's reductions to the host in one copy (issue 14): every saved
tensor's reductions are computed on its device when it is saved and copied together when the step
is written, so a step on an accelerator synchronises once for reductions, not once per tensor.
Counted on CPU through the adapter's own transfer function (``TorchAdapter.host_transfers``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

import mltrace.pytorch as smd
from mltrace.reductions import compute
from mltrace.trials import create_trial

STEPS = 4
ITEMS = [("mean", False), ("max", False), ("min", True), ("nan_count", False), ("l2", False)]


def _train(out_dir: Path, save_raw: bool) -> smd.Hook:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.ReLU(), nn.Linear(4, 1))
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients"],
                    reduction_config=smd.ReductionConfig(
                        reductions=["mean", "max", "nan_count"], abs_reductions=["min"],
                        norms=["l2"], save_raw_tensor=save_raw))
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(32, 8)), torch.randn(32, 1)).backward()
        opt.step()  # weights change in place after they were saved: reductions must predate it
    hook.close()
    return hook


def test_each_step_copies_its_reductions_to_the_host_once(tmp_path: Path) -> None:
    hook = _train(tmp_path, save_raw=False)
    trial = create_trial(str(tmp_path))
    saved = [n for n in trial.tensor_names() if not n.startswith("MSELoss")]
    assert len(saved) == 12  # 6 weights and biases, 6 gradients
    assert trial.steps() == list(range(STEPS))
    for name in saved:
        assert trial.tensor(name).reduction_value(STEPS - 1, "l2") is not None
    assert hook.adapter.host_transfers == STEPS  # not 12 per step


def test_reductions_copied_together_equal_those_of_the_saved_values(tmp_path: Path) -> None:
    """Weights are saved before the optimizer updates them in place; their reductions, copied
    at the step's end, are still those of the values saved (numpy's definitions)."""
    hook = _train(tmp_path, save_raw=True)
    assert hook.adapter.host_transfers == STEPS
    trial = create_trial(str(tmp_path))
    for name in trial.tensor_names(collection="weights") + trial.tensor_names(collection="gradients"):
        tensor = trial.tensor(name)
        for step in tensor.steps():
            raw = tensor.value(step)
            for red, abs_ in ITEMS:
                np.testing.assert_allclose(tensor.reduction_value(step, red, abs=abs_),
                                           compute(red, raw, abs_), rtol=1e-5, atol=1e-9,
                                           err_msg=f"{name} {red} abs={abs_} step {step}")
