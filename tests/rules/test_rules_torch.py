"""Built-in rules on trials written by the PyTorch hook from a tiny model's training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import mltrace.pytorch as smd
from mltrace.exceptions import TensorUnavailableForStep
from mltrace.rules import invoke_rule
from mltrace.rules.builtin import (
    DeadRelu,
    ExplodingTensor,
    GradientNormVsBaseline,
    NaNInfDetected,
    SimilarAcrossRuns,
    WeightUpdateRatio,
)
from mltrace.trials import create_trial

STEPS = 5


def train(path, *, lr=0.05, seed=0, loss_scale=1.0, relu_bias=None, nan_step=None,
          reduction_config=None):
    """Train Sequential(Linear, ReLU, Linear) for STEPS steps with a hook saving every step."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    if relu_bias is not None:
        with torch.no_grad():
            model[0].bias.fill_(relu_bias)
    hook = smd.Hook(out_dir=str(path), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses", "relu_output"],
                    reduction_config=reduction_config)
    hook.get_collection("relu_output").include("1_output_0")  # the ReLU module's output
    hook.register_module(model)
    loss_fn = nn.MSELoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(1234)
    for step in range(STEPS):
        x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 1, generator=gen)
        if step == nan_step:
            x[0, 0] = float("nan")
        opt.zero_grad()
        (loss_fn(model(x), y) * loss_scale).backward()
        opt.step()
    hook.close()
    return create_trial(str(path))


def fired(rule, **kwargs):
    return invoke_rule(rule, end_step=STEPS, **kwargs).fired_steps


def test_nan_detection_from_count_reductions_without_raw_tensors(tmp_path):
    counts = smd.ReductionConfig(reductions=["nan_count", "inf_count"])  # no raw tensors
    trial = train(tmp_path / "run", nan_step=2, reduction_config=counts)
    with pytest.raises(TensorUnavailableForStep):
        trial.tensor("gradient/Sequential_0.weight").value(2)
    rule = NaNInfDetected(trial, collection_names="gradients")
    assert fired(rule) == [2, 3, 4]  # the NaN step poisons the weights for good
    assert rule.first_nonfinite_step["gradient/Sequential_0.weight"] == 2
    again = create_trial(str(tmp_path / "run"))
    assert fired(ExplodingTensor(again, collection_names="gradients")) == [2, 3, 4]
    clean = train(tmp_path / "clean", reduction_config=counts)
    assert fired(NaNInfDetected(clean), raise_eval_cond=True) == []
    assert fired(ExplodingTensor(clean), raise_eval_cond=True) == []


def test_weight_update_ratio_of_a_frozen_model(tmp_path):
    trial = train(tmp_path / "frozen", lr=0.0)
    rule = WeightUpdateRatio(trial)
    assert fired(rule) == [1, 2, 3, 4]  # step 0 has no previous weights
    assert "small_threshold" in rule.last_message
    assert fired(WeightUpdateRatio(train(tmp_path / "sgd")), raise_eval_cond=True) == []


def test_dead_relu_of_a_badly_initialized_layer(tmp_path):
    rule = DeadRelu(train(tmp_path / "dead", relu_bias=-100.0))
    assert fired(rule) == [0, 1, 2, 3, 4]
    assert rule.last_message.startswith("1_output_0: 100% of 8 units are dead")
    assert fired(DeadRelu(train(tmp_path / "alive")), raise_eval_cond=True) == []


def test_comparing_runs(tmp_path):
    baseline = train(tmp_path / "baseline")
    again = train(tmp_path / "again")
    scaled = train(tmp_path / "scaled", loss_scale=100.0)
    reseeded = train(tmp_path / "reseeded", seed=1)
    assert fired(SimilarAcrossRuns(again, baseline), raise_eval_cond=True) == []
    assert fired(GradientNormVsBaseline(again, baseline), raise_eval_cond=True) == []
    assert fired(SimilarAcrossRuns(reseeded, baseline))[0] == 0
    result = invoke_rule(GradientNormVsBaseline(scaled, baseline), end_step=STEPS)
    assert result.first_step == 0 and "is 100x the baseline's" in result.message
    norms = [np.linalg.norm(t.value(0)) for t in (scaled.tensor("gradient/Sequential_2.bias"),
                                                  baseline.tensor("gradient/Sequential_2.bias"))]
    assert norms[0] == pytest.approx(100 * norms[1], rel=1e-4)
