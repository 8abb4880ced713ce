"""mltrace.mxnet round trips: a tiny Gluon model trains a few steps with the hook, the trial is
read back with create_trial and compared with the values captured in the process.

MXNet's lifecycle is checked on the way: parameters and gradients of step N are the values after
step N's update (taken at the start of step N+1 or at close), under step N's own mode.
"""

from __future__ import annotations

import json
import logging

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet_models import batch, build_cnn, build_mlp, param_names, train

import mltrace.mxnet as smd
from mltrace.exceptions import MltraceTypeError
from mltrace.reductions import REDUCTION_NAMES, compute
from mltrace.trials import create_trial

SCHEDULE = [("TRAIN", 3), ("EVAL", 2), ("TRAIN", 1)]
CUSTOM = smd.ReductionConfig(
    reductions=["min", "max", "mean", "std", "variance", "sum", "prod", "median", "nan_count",
                "inf_count", "zero_fraction"],
    abs_reductions=["mean", "max"], norms=["l1", "l2"], save_raw_tensor=True)


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("mx_round_trip") / "run")
    net, loss_fn = build_mlp()
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses", "relu_io",
                                         "custom"])
    hook.register_block(net)
    hook.register_block(loss_fn)
    hook.get_collection("relu_io").add_block_tensors(net[0].act, inputs=True, outputs=True)
    custom = hook.get_collection("custom")
    custom.include("^dense1_output_")
    custom.reduction_config = CUSTOM
    expected, global_of = train(net, loss_fn, SCHEDULE, hook.set_mode,
                                io_blocks=[net[0].act, net[1]])
    for values in expected.values():  # dense1's input is not in any saved collection
        values.pop("dense1_input_0")
    hook.close()
    return out_dir, expected, global_of


def test_mxnet_round_trip_names_steps_values(mlp_run):
    out_dir, expected, global_of = mlp_run
    trial = create_trial(out_dir)
    assert trial.steps() == sorted(global_of.values())
    assert trial.steps(mode="TRAIN") == [0, 1, 2, 3] and trial.steps(mode="EVAL") == [0, 1]
    checked = 0
    for (mode, mode_step), values in expected.items():
        assert trial.tensor_names(step=mode_step, mode=mode) == sorted(values), (mode, mode_step)
        for name, want in values.items():
            got = trial.tensor(name).value(mode_step, mode=mode)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert np.array_equal(got, want), (name, mode, mode_step)
            checked += 1
    # 4 params every step, 4 gradients in TRAIN, loss, relu in+out, dense1 output
    assert checked == 4 * 6 + 4 * 4 + 6 + 2 * 6 + 6
    assert trial.tensor_names(collection="relu_io") == [
        "dense0_relu_input_0", "dense0_relu_output_0"]
    assert trial.tensor_names(collection="losses") == ["softmaxcrossentropyloss0_output_0"]


def test_mxnet_last_train_step_keeps_its_mode(mlp_run):
    """TRAIN step 2 ends with set_mode(EVAL): its post-update parameters and gradients are still
    TRAIN step 2's (smdebug evaluated them against the new mode and dropped them)."""
    out_dir, expected, _ = mlp_run
    trial = create_trial(out_dir)
    assert trial.tensor("gradient/dense0_weight").steps(mode="TRAIN") == [0, 1, 2, 3]
    assert not trial.tensor_names(mode="EVAL", regex="^gradient")
    np.testing.assert_array_equal(trial.tensor("dense0_weight").value(2, mode="TRAIN"),
                                  expected[("TRAIN", 2)]["dense0_weight"])
    # EVAL steps do not update: their weights equal the last TRAIN step's.
    np.testing.assert_array_equal(trial.tensor("dense0_weight").value(1, mode="EVAL"),
                                  expected[("TRAIN", 2)]["dense0_weight"])


def test_mxnet_stored_reductions(mlp_run):
    out_dir, expected, _ = mlp_run
    trial = create_trial(out_dir)
    for (mode, mode_step), values in expected.items():
        raw = values["dense1_output_0"]
        stored = trial.tensor("dense1_output_0").reduction_values(mode_step, mode=mode)
        assert set(stored) == set(CUSTOM.items())
        for (red, abs_), value in stored.items():
            np.testing.assert_allclose(value, compute(red, raw, abs_), rtol=1e-5, err_msg=red)
    assert trial.tensor("dense0_weight").reduction_values(0, mode="TRAIN") == {}


def test_mxnet_parameters_are_post_update(tmp_path):
    net, loss_fn = build_mlp()
    initial = net[0].weight.data().asnumpy()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=2),
                    include_collections=["weights", "gradients"])
    hook.register_block(net)
    hook.register_block(loss_fn)
    expected, _ = train(net, loss_fn, [("TRAIN", 5)])
    hook.close()  # step 4's parameters are written here
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 2, 4]
    assert not np.array_equal(trial.tensor("dense0_weight").value(0), initial)
    for step in (0, 2, 4):
        for name in ("dense0_weight", "gradient/dense1_weight"):
            np.testing.assert_array_equal(trial.tensor(name).value(step),
                                          expected[("TRAIN", step)][name])
    # The loss is always saved (default collection), here at the due steps.
    assert trial.tensor_names(collection="losses") == ["softmaxcrossentropyloss0_output_0"]
    assert trial.tensor_names(regex="bias") == ["gradient/dense0_bias", "gradient/dense1_bias"]


def test_mxnet_default_hook_saves_losses_only_and_hooks_root_only(tmp_path):
    net, loss_fn = build_cnn()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    hook.register_block(net)
    hook.register_block(loss_fn)
    expected, _ = train(net, loss_fn, [("TRAIN", 2)])
    hook.close()
    # As smdebug: no child block needs a hook when only parameter collections and losses are saved.
    assert len(net._forward_hooks) == 1 and not net[0]._forward_hooks
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names() == ["softmaxcrossentropyloss0_output_0"]
    np.testing.assert_array_equal(trial.tensor("softmaxcrossentropyloss0_output_0").value(1),
                                  expected[("TRAIN", 1)]["softmaxcrossentropyloss0_output_0"])


def test_mxnet_hybridized_model(tmp_path, caplog):
    """Hybridized: MXNet calls no hook of the children, only the model's own; steps, parameters,
    gradients, the loss and the model's own I/O are still saved, with a warning about the rest."""
    net, loss_fn = build_cnn()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    save_all=True)
    hook.register_block(net)
    hook.register_block(loss_fn)
    with pytest.warns(UserWarning, match="being hybridized while still having") as warned:
        net.hybridize()
    # Only about the model's own hooks (which MXNet does call): children get theirs at step 0.
    assert len(warned) == 1 and "HybridSequential" in str(warned[0].message)
    with caplog.at_level(logging.WARNING, logger="mltrace.mxnet"):
        expected, _ = train(net, loss_fn, [("TRAIN", 3)], io_blocks=[net])
    hook.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("hybridized blocks hybridsequential0:" in m for m in messages) == 1
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2]
    names = trial.tensor_names()
    assert not [n for n in names if n.startswith(("conv", "pool", "flatten", "dense0_"))
                and ("_input_" in n or "_output_" in n)]
    for step in range(3):
        want = expected[("TRAIN", step)]
        assert set(want) <= set(names)
        for name, value in want.items():
            np.testing.assert_array_equal(trial.tensor(name).value(step), value, err_msg=name)


def test_mxnet_cnn_block_names_as_smdebug(tmp_path):
    net, loss_fn = build_cnn()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    save_all=True)
    hook.register_block(net)
    hook.register_block(loss_fn)
    train(net, loss_fn, [("TRAIN", 2)])
    hook.close()
    names = set(create_trial(str(tmp_path / "run")).tensor_names())
    for block in ("conv0", "conv0_relu", "pool0", "conv1", "conv1_relu", "flatten0", "dense0",
                  "hybridsequential0"):
        assert {f"{block}_input_0", f"{block}_output_0"} <= names, block
    assert {"softmaxcrossentropyloss0_input_0", "softmaxcrossentropyloss0_input_1",
            "softmaxcrossentropyloss0_output_0"} <= names
    assert {f"gradient/{p}" for p in param_names(net)} | set(param_names(net)) <= names


class Twice(gluon.Block):
    """Calls one Dense block twice in a forward pass."""

    def __init__(self) -> None:
        super().__init__()
        with self.name_scope():
            self.dense = gluon.nn.Dense(5, in_units=5)

    def forward(self, x):
        return self.dense(self.dense(x))


def test_mxnet_block_called_twice_gets_increasing_indices(tmp_path):
    """As smdebug: a block called twice in a step saves <name>_output_0, then _output_1."""
    with mx.name.NameManager():
        model = Twice()
    model.initialize()
    assert model.dense.name == "twice0_dense0"
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["twice"])
    hook.get_collection("twice").add_block_tensors(model.dense, inputs=True, outputs=True)
    hook.register_block(model)
    x = mx.nd.array(np.arange(10, dtype=np.float32).reshape(2, 5))
    first = model.dense(x).asnumpy()  # outside any step: the hook saves nothing for it
    for _ in range(2):
        out = model(x).asnumpy()
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names() == ["twice0_dense0_input_0", "twice0_dense0_input_1",
                                    "twice0_dense0_output_0", "twice0_dense0_output_1"]
    for step in (0, 1):
        np.testing.assert_array_equal(trial.tensor("twice0_dense0_input_0").value(step),
                                      x.asnumpy())
        np.testing.assert_array_equal(trial.tensor("twice0_dense0_output_0").value(step), first)
        np.testing.assert_array_equal(trial.tensor("twice0_dense0_input_1").value(step), first)
        np.testing.assert_array_equal(trial.tensor("twice0_dense0_output_1").value(step), out)


def test_mxnet_json_config_pending_collection_and_tornasole(tmp_path, monkeypatch):
    net, loss_fn = build_mlp()
    smd.get_collection("relu_out").add_block_tensors(net[0].act)  # before the hook exists
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "2"},
        "CollectionConfigurations": [
            {"CollectionName": "weights"},
            {"CollectionName": "relu_out", "CollectionParameters": {"save_interval": "1"}},
        ],
    }))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(config))
    hook = smd.Hook.create_from_json_file()
    hook.register_hook(net)  # Tornasole's / zero-code-change name
    hook.register_block(loss_fn)
    train(net, loss_fn, [("TRAIN", 3)])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("dense0_relu_output_0").steps() == [0, 1, 2]
    assert trial.tensor("dense0_weight").steps() == [0, 2]
    assert "dense0_relu_input_0" not in trial.tensor_names()

    net2, loss2 = build_mlp()
    tornasole = smd.TornasoleHook(out_dir=str(tmp_path / "tornasole"),
                                  save_config=smd.SaveConfig(save_interval=1))
    tornasole.register_block(net2)
    tornasole.register_block(loss2)
    train(net2, loss2, [("TRAIN", 1)])
    tornasole.close()
    names = create_trial(str(tmp_path / "tornasole")).tensor_names()
    assert names == sorted(param_names(net2) + [f"gradient/{p}" for p in param_names(net2)]
                           + ["softmaxcrossentropyloss0_output_0"])


def test_mxnet_bad_arguments_raise(tmp_path, caplog):
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    with pytest.raises(MltraceTypeError, match="gluon.Block"):
        hook.register_block(object())
    with pytest.raises(MltraceTypeError, match="gluon.Block"):
        hook.get_collection("x").add_block_tensors("dense0")
    net, _ = build_mlp()
    hook.register_block(net)
    with caplog.at_level(logging.WARNING, logger="mltrace.mxnet"):
        hook.register_block(net)
    assert "already registered" in caplog.text
    assert len(net._forward_pre_hooks) == 1
    hook.close()


def test_mxnet_internal_error_disables_hook_training_goes_on(tmp_path, monkeypatch, caplog):
    net, loss_fn = build_mlp()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights"])
    hook.register_block(net)
    hook.register_block(loss_fn)
    train(net, loss_fn, [("TRAIN", 2)])

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(hook.adapter, "to_numpy", broken)
    with caplog.at_level(logging.ERROR):
        train(net, loss_fn, [("TRAIN", 2)])  # must not raise
    assert "disk on fire" in caplog.text and hook.disabled
    hook.close()
    assert create_trial(str(tmp_path / "run")).steps() == [0, 1]


def test_mxnet_dry_run_writes_nothing(tmp_path):
    net, loss_fn = build_mlp()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), dry_run=True, save_all=True)
    hook.register_block(net)
    hook.register_block(loss_fn)
    train(net, loss_fn, [("TRAIN", 2)])
    hook.close()
    assert not (tmp_path / "run").exists()


_ALL_ITEMS = [(n, a) for n in REDUCTION_NAMES for a in (False, True)]
_RNG = np.random.default_rng(0)
_ARRAYS = {
    "float32": _RNG.standard_normal((7, 9)).astype(np.float32),
    "float32_large": _RNG.standard_normal(100_001).astype(np.float32) + 3,
    "float64": _RNG.standard_normal(33),
    "float16": (_RNG.standard_normal(50) * 100).astype(np.float16),
    "int32": _RNG.integers(-50, 50, 40).astype(np.int32),
    "int8": _RNG.integers(-120, 120, 40).astype(np.int8),
    "uint8": _RNG.integers(0, 255, 41).astype(np.uint8),
    "int64": _RNG.integers(-2**40, 2**40, 10),
    "bool": _RNG.integers(0, 2, 17).astype(bool),
    "nan_inside": np.array([1, np.nan, -3, 0], np.float32),
    "nan_first": np.array([np.nan, 1, 2], np.float32),
    "infs": np.array([1, np.inf, -np.inf, 0], np.float32),
    "one_inf": np.array([1, np.inf, 2, 0], np.float32),
    "single": np.array([2.5], np.float32),
}


@pytest.mark.parametrize("kind", sorted(_ARRAYS))
def test_mxnet_device_reductions_match_numpy(tmp_path, kind):
    """MXNet-op reductions (one host copy per tensor) equal numpy's definitions, NaN included."""
    array = _ARRAYS[kind]
    hook = smd.Hook(out_dir=str(tmp_path / "unused"), dry_run=True)
    got = hook.adapter.reduce(mx.nd.array(array, dtype=array.dtype), _ALL_ITEMS)
    for (name, abs_), value in zip(_ALL_ITEMS, got):
        want = compute(name, array, abs_)
        assert value.dtype == want.dtype and value.shape == want.shape == (), (name, abs_)
        np.testing.assert_allclose(value, want, rtol=1e-5, equal_nan=True, err_msg=f"{name} {abs_}")


def test_mxnet_autograd_loss_outside_record_is_saved(tmp_path):
    """A loss computed under autograd.record() and one computed outside (EVAL): both saved."""
    net, loss_fn = build_mlp()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    hook.register_block(net)
    hook.register_block(loss_fn)
    x, y = batch(net, 0)
    hook.set_mode(smd.modes.TRAIN)
    with autograd.record():
        train_loss = loss_fn(net(x), y)
    hook.set_mode(smd.modes.EVAL)
    eval_loss = loss_fn(net(x), y)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    loss = trial.tensor("softmaxcrossentropyloss0_output_0")
    np.testing.assert_array_equal(loss.value(0, mode="TRAIN"), train_loss.asnumpy())
    np.testing.assert_array_equal(loss.value(0, mode="EVAL"), eval_loss.asnumpy())


class Partly(gluon.Block):
    """A plain Block holding a hybridized feature extractor and a plain head."""

    def __init__(self) -> None:
        super().__init__()
        with self.name_scope():
            self.features = gluon.nn.HybridSequential()
            with self.features.name_scope():
                self.features.add(gluon.nn.Dense(6, activation="relu", in_units=5))
            self.head = gluon.nn.Dense(3, in_units=6)

    def forward(self, x):
        return self.head(self.features(x))


def test_mxnet_partly_hybridized_model(tmp_path, caplog):
    with mx.name.NameManager():
        model = Partly()
    model.initialize()
    model.features.hybridize()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    save_all=True)
    hook.register_block(model)
    x = mx.nd.array(np.ones((2, 5), dtype=np.float32))
    with caplog.at_level(logging.WARNING, logger="mltrace.mxnet"):
        for _ in range(2):
            out = model(x)
    hook.close()
    assert "hybridized blocks partly0_hybridsequential0:" in caplog.text
    names = create_trial(str(tmp_path / "run")).tensor_names()
    # The hybridized block's own I/O and the plain head's are saved; the insides are not.
    assert {"partly0_hybridsequential0_output_0", "partly0_dense0_input_0",
            "partly0_dense0_output_0", "partly0_output_0"} <= set(names)
    inside = "partly0_hybridsequential0_dense0_"
    assert not [n for n in names if n.startswith(inside) and ("_input_" in n or "_output_" in n)]
    assert inside + "weight" in names  # parameters are saved either way
    trial = create_trial(str(tmp_path / "run"))
    np.testing.assert_array_equal(trial.tensor("partly0_output_0").value(1), out.asnumpy())
