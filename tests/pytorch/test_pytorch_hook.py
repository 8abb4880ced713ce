"""PyTorch hook: what a user of smdebug's PyTorch hook would try, read back with create_trial."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch
from torch import nn

import mltrace.pytorch as smd
from mltrace.exceptions import (
    InvalidCollectionConfiguration,
    MltraceRuntimeError,
    MltraceValueError,
    TensorUnavailableForStep,
)
from mltrace.reductions import compute
from mltrace.trials import create_trial
from tests.support.torch_training import make_model, train

PARAMS = ["Sequential_0.bias", "Sequential_0.weight", "Sequential_2.bias", "Sequential_2.weight"]
GRADS = [f"gradient/{p}" for p in PARAMS]


def _hook(out_dir, **kwargs):
    kwargs.setdefault("save_config", smd.SaveConfig(save_interval=1))
    kwargs.setdefault("include_collections", ["weights", "biases", "gradients", "losses"])
    return smd.Hook(out_dir=str(out_dir), **kwargs)


def _run(out_dir, steps=4, model=None, **kwargs):
    model = model or make_model()
    hook = _hook(out_dir, **kwargs)
    hook.register_module(model)
    loss_fn = nn.MSELoss()
    hook.register_loss(loss_fn)
    captured = train(model, hook, steps, loss_fn=loss_fn)
    hook.close()
    return captured


def test_round_trip_names_and_values_match_the_process(tmp_path):
    captured = _run(tmp_path / "run")
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names() == sorted(["MSELoss_output_0", *PARAMS, *GRADS])
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.workers() == ["worker_0"]
    for name, by_step in captured.values.items():
        for step, value in by_step.items():
            got = trial.tensor(name).value(step)
            assert got.dtype == value.dtype and np.array_equal(got, value), (name, step)
    assert trial.tensor("MSELoss_output_0").value(0).shape == ()  # 0-d loss, as smdebug


def test_modes_keep_separate_step_counters_and_skip_gradients_outside_train(tmp_path):
    model, loss_fn = make_model(), nn.MSELoss()
    hook = _hook(tmp_path / "run")
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, hook, 3, mode=smd.modes.TRAIN, loss_fn=loss_fn)
    train(model, hook, 2, mode=smd.modes.EVAL, loss_fn=loss_fn, start=3)
    train(model, hook, 1, mode=smd.modes.TRAIN, loss_fn=loss_fn, start=5)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2, 3, 4, 5]
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2, 3]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 1]
    assert trial.mode(3) == smd.modes.EVAL and trial.mode_step(3) == 0
    assert trial.global_step(smd.modes.TRAIN, 3) == 5
    grad = trial.tensor(GRADS[0])
    assert grad.steps(mode=smd.modes.EVAL) == []
    assert grad.steps(mode=smd.modes.TRAIN) == [0, 1, 2, 3]
    loss = trial.tensor("MSELoss_output_0")
    assert sorted(loss.values(mode=smd.modes.EVAL)) == [0, 1]


def test_default_hook_saves_losses_only_every_500_steps(tmp_path):
    model, loss_fn = make_model(), nn.MSELoss()
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, hook, 3, loss_fn=loss_fn)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names() == ["MSELoss_output_0"]
    assert trial.steps() == [0]


def test_tornasole_hook_saves_weights_biases_gradients_by_default(tmp_path):
    model = make_model()
    hook = smd.TornasoleHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_steps=[1, 2]))
    hook.register_hook(model)
    train(model, hook, 4)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert set(PARAMS + GRADS) <= set(trial.tensor_names())
    assert trial.steps() == [0, 1, 2]  # save_steps is a union with the default interval (0, 500, ...)


def test_collection_configs_override_the_hooks(tmp_path):
    model = make_model()
    hook = _hook(tmp_path / "run", save_config=smd.SaveConfig(save_interval=2))
    hook.get_collection("gradients").save_config = smd.SaveConfig(save_steps=[3])
    # seed 004: switch a default-saved collection off through its mutable save config
    hook.get_collection("losses").save_config.end_step = 0
    hook.register_module(model)
    loss_fn = nn.MSELoss()
    hook.register_loss(loss_fn)
    train(model, hook, 5, loss_fn=loss_fn)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert "MSELoss_output_0" not in trial.tensor_names()
    assert trial.tensor(PARAMS[1]).steps() == [0, 2, 4]
    assert trial.tensor(GRADS[1]).steps() == [0, 3]  # save_steps is a union with interval 500
    assert hook.save_config.get_save_config(smd.modes.TRAIN).end_step is None


def test_include_regex_and_save_all(tmp_path):
    model = make_model()
    hook = _hook(tmp_path / "a", include_collections=[], include_regex=["Sequential_2"])
    hook.register_module(model)
    train(model, hook, 2)
    hook.close()
    assert create_trial(str(tmp_path / "a")).tensor_names() == ["Sequential_2.bias", "Sequential_2.weight",
                                                                  "gradient/Sequential_2.bias",
                                                                  "gradient/Sequential_2.weight"]
    model = make_model()
    hook = _hook(tmp_path / "b", save_all=True)
    hook.register_module(model)
    train(model, hook, 2)
    hook.close()
    names = create_trial(str(tmp_path / "b")).tensor_names()
    for expected in ["0_input_0", "0_output_0", "1_output_0", "2_output_0", "Sequential_input_0",
                     "Sequential_output_0", *PARAMS, *GRADS]:
        assert expected in names


def test_module_tensors_collection_made_before_the_hook(tmp_path):
    # Seed 000 calls get_collection(...).add_module_tensors(...) before creating the hook.
    model = make_model()
    smd.get_collection("l_mod").add_module_tensors(model[1], inputs=True, outputs=True)
    hook = smd.TornasoleHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                             include_collections=["weights", "l_mod"])
    hook.register_hook(model)
    captured_out = []
    model[1].register_forward_hook(lambda m, i, o: captured_out.append(o.detach().clone().numpy()))
    train(model, hook, 2)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert "1_input_0" in trial.tensor_names(collection="l_mod")
    assert np.array_equal(trial.tensor("1_output_0").value(1), captured_out[1])
    assert trial.collection("l_mod").include_regex == ["^1_input_", "^1_output_"]


def test_save_scalar_save_tensor_and_record_tensor_value(tmp_path):
    model = make_model()
    hook = _hook(tmp_path / "run")
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        out = model(torch.ones(2, 4))
        loss = torch.nn.functional.mse_loss(out, torch.zeros(2, 1))
        hook.record_tensor_value("my_loss", loss)
        hook.save_scalar("lr", 0.1 * (step + 1))
        hook.save_tensor("custom/act", np.full((2, 2), step, dtype=np.int16), "mine")
        opt.zero_grad()
        loss.backward()
        opt.step()
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert "my_loss_output_0" in trial.tensor_names(collection="losses")
    assert trial.tensor("scalar/lr").value(2) == pytest.approx([0.3])
    assert np.array_equal(trial.tensor("custom/act").value(1), np.full((2, 2), 1, dtype=np.int16))
    assert trial.tensor_names(collection="mine") == ["custom/act"]


def test_reductions_follow_numpy_definitions_and_raw_tensor_can_be_left_out(tmp_path):
    reds = ["min", "max", "mean", "std", "variance", "sum", "prod", "median", "nan_count",
            "inf_count", "zero_fraction"]
    config = smd.ReductionConfig(reductions=reds, abs_reductions=["mean", "max"], norms=["l1", "l2"],
                                 abs_norms=["l2"], save_raw_tensor=False)
    model = make_model()
    hook = _hook(tmp_path / "run", include_collections=["gradients"], reduction_config=config)
    hook.register_module(model)
    captured = train(model, hook, 2)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    tensor = trial.tensor(GRADS[1])
    raw = captured.values[GRADS[1]][1]
    for name in reds + ["l1", "l2"]:
        expected = compute(name, raw)
        assert tensor.reduction_value(1, name) == pytest.approx(float(expected), rel=1e-5, abs=1e-7), name
    assert tensor.reduction_value(1, "mean", abs=True) == pytest.approx(np.abs(raw).mean(), rel=1e-5)
    assert tensor.reduction_value(1, "l2_norm", abs=True) == pytest.approx(np.linalg.norm(raw.ravel()), rel=1e-5)
    with pytest.raises(TensorUnavailableForStep) as info:
        tensor.value(1)
    assert info.value.has_reductions


def test_reduction_value_is_computed_from_raw_when_not_stored(tmp_path):
    captured = _run(tmp_path / "run", steps=2)
    tensor = create_trial(str(tmp_path / "run")).tensor(PARAMS[1])
    raw = captured.values[PARAMS[1]][1]
    assert tensor.reduction_value(1, "l2") == pytest.approx(np.sqrt((raw.astype(np.float64) ** 2).sum()))
    assert tensor.reduction_value(1, "std") == pytest.approx(raw.astype(np.float64).std())


def test_save_shape_serves_shape_from_the_index(tmp_path):
    config = smd.ReductionConfig(reductions=["mean"], save_shape=True)
    _run(tmp_path / "run", steps=1, include_collections=["weights"], reduction_config=config)
    tensor = create_trial(str(tmp_path / "run")).tensor(PARAMS[1])
    assert tensor.shape(0) == (8, 4)
    with pytest.raises(TensorUnavailableForStep):
        tensor.value(0)


def test_when_nan_saves_the_steps_where_a_watched_tensor_is_nan(tmp_path):
    model, loss_fn = make_model(), nn.MSELoss()
    hook = _hook(tmp_path / "run", save_config=smd.SaveConfig(save_interval=100, when_nan=["MSELoss_output_0"]))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        x = torch.ones(4, 4)
        if step == 3:
            x[0, 0] = float("nan")
        opt.zero_grad()
        loss = loss_fn(model(x), torch.zeros(4, 1))
        loss.backward()
        if step != 3:  # keep the weights finite, so that only step 3 holds NaN
            opt.step()
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 3]
    assert np.isnan(trial.tensor("MSELoss_output_0").value(3))
    assert trial.tensor(PARAMS[1]).steps() == [0, 3]


def test_bfloat16_and_frozen_parameters(tmp_path):
    model = make_model()
    model[0].weight.requires_grad_(False)
    hook = _hook(tmp_path / "run")
    hook.register_module(model)
    train(model, hook, 2)
    hook.save_tensor("bf", torch.tensor([1.5, -2.25], dtype=torch.bfloat16), "mine")
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert "gradient/Sequential_0.weight" not in trial.tensor_names()
    value = trial.tensor("bf").value(1)
    assert value.dtype.name == "bfloat16" and value.astype(np.float32).tolist() == [1.5, -2.25]


def test_dry_run_writes_nothing(tmp_path):
    _run(tmp_path / "run", dry_run=True)
    assert not (tmp_path / "run").exists()


def test_invalid_configuration_is_rejected_clearly(tmp_path):
    with pytest.raises(MltraceValueError, match="no storage backend"):
        smd.Hook(out_dir=str(tmp_path / "x"), tensorboard_dir="nosuchscheme://bucket/tb")
    with pytest.raises(MltraceValueError, match="include_workers"):
        smd.Hook(out_dir=str(tmp_path / "x"), include_workers="some")
    with pytest.raises(MltraceValueError, match="save_interval"):
        smd.SaveConfig(save_interval=0)
    _run(tmp_path / "done", steps=1)
    with pytest.raises(MltraceRuntimeError, match="finished run"):
        smd.Hook(out_dir=str(tmp_path / "done"))
    hook = _hook(tmp_path / "y", include_collections=["empty"])
    hook.get_collection("empty")
    model = make_model()
    hook.register_module(model)
    with pytest.raises(InvalidCollectionConfiguration, match="empty"):
        model(torch.ones(1, 4))


def test_internal_failure_disables_the_hook_and_training_goes_on(tmp_path, caplog, monkeypatch):
    model = make_model()
    hook = _hook(tmp_path / "run")
    hook.register_module(model)
    train(model, hook, 2)

    def broken(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(hook.writer, "add_tensor", broken)
    with caplog.at_level(logging.ERROR, logger="mltrace"):
        train(model, hook, 3, start=2)  # must not raise
    assert sum("stops saving" in r.message for r in caplog.records) == 1
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1]  # what was written before stays readable

    strict = _hook(tmp_path / "strict", strict=True)
    model = make_model()
    strict.register_module(model)
    train(model, strict, 1)
    monkeypatch.setattr(strict.writer, "add_tensor", broken)
    with pytest.raises(OSError, match="disk on fire"):
        train(model, strict, 1, start=1)


def test_create_from_json_file_in_smdebugs_format(tmp_path, monkeypatch):
    config = {
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "2", "reductions": "mean,abs_max", "save_raw_tensor": "true"},
        "CollectionConfigurations": [
            {"CollectionName": "weights"},
            {"CollectionName": "gradients", "CollectionParameters": {"train.save_interval": "3"}},
        ],
    }
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("MLTRACE_CONFIG_FILE_PATH", str(path))
    hook = smd.Hook.create_from_json_file()
    model = make_model()
    hook.register_module(model)
    captured = train(model, hook, 4, mode=smd.modes.TRAIN)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor(PARAMS[1]).steps() == [0, 2]
    assert trial.tensor(GRADS[1]).steps() == [0, 3]
    assert trial.tensor(PARAMS[1]).reduction_value(2, "max", abs=True) == pytest.approx(
        np.abs(captured.values[PARAMS[1]][2]).max())
    bad = dict(config, HookParameters={"strict": "true", "save_intervall": "2"})
    path.write_text(json.dumps(bad))
    with pytest.raises(MltraceValueError, match="save_intervall"):
        smd.Hook.create_from_json_file(str(path))


def test_hook_closes_itself_at_interpreter_exit(tmp_path):
    import subprocess
    import sys

    script = (
        "import torch, mltrace.pytorch as smd\n"
        f"hook = smd.Hook(out_dir={str(tmp_path / 'run')!r}, save_config=smd.SaveConfig(save_interval=1),"
        " include_collections=['weights'])\n"
        "m = torch.nn.Linear(2, 1); hook.register_module(m)\n"
        "for _ in range(3): m(torch.ones(1, 2))\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    trial = create_trial(str(tmp_path / "run"))
    assert trial.loaded_all_steps and trial.steps() == [0, 1, 2]


class _Six(nn.Module):
    """Six outputs, and six inputs: ``(x, x+1, ..., x+5)``."""

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(x * (i + 1) for i, x in enumerate(xs))


class _SixNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.six = _Six()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return sum(self.six(*(h + i for i in range(6))))


@pytest.mark.parametrize("side", ["output", "input"])
def test_a_fifth_or_later_module_tensor_is_saved_when_only_it_is_wanted(tmp_path, side):
    """A collection that wants only the sixth output (or input) of a module gets it: the
    callbacks are chosen by the indices the module produces, not the first four alone."""
    model = _SixNet()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["sixth"])
    hook.get_collection("sixth").include(f"^six_{side}_5$")
    hook.register_module(model)
    expected = []
    model.six.register_forward_hook(
        lambda m, i, o: expected.append((i if side == "input" else o)[5].detach().clone().numpy()))
    for _ in range(3):
        model(torch.randn(2, 3)).sum().backward()
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names() == [f"six_{side}_5"]
    assert trial.steps() == [0, 1, 2]
    for step in (0, 1, 2):
        np.testing.assert_array_equal(trial.tensor(f"six_{side}_5").value(step), expected[step])
