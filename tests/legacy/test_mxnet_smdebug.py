"""MXNet cross-checks against real smdebug 1.0.34 (docs/format.md; both directions).

1. smdebug's ``create_trial`` reads what ``mltrace.mxnet.Hook`` writes: names, steps per mode,
   values (equal to those captured in the process), collections, stored reductions.
2. One training run with smdebug's ``smdebug.mxnet.Hook`` and mltrace's hook attached side by
   side: both write the same tensor names, steps and values, and mltrace's reader reads
   smdebug's trial exactly as smdebug's reader does. The one difference is smdebug's bug at a
   mode switch: it evaluates the ending TRAIN step's parameters against the new mode and drops
   them; mltrace saves them under their own step. (smdebug's MXNet hook also raises on the
   std and variance reductions, whose numpy fallback rejects NDArrays: the side-by-side run
   asks only for the reductions it can compute.)
"""

from __future__ import annotations

import numpy as np
import pytest
import smdebug.mxnet as smdebug_mx
from mxnet_models import build_cnn, build_mlp, param_names, train
from smdebug.core.modes import ModeKeys as SmdModeKeys
from smdebug.trials import create_trial as smd_create_trial

import mltrace.mxnet as smd
from mltrace.trials import create_trial as ml_create_trial

REDUCTIONS = dict(reductions=["min", "max", "mean", "std", "variance", "sum"], norms=["l1", "l2"],
                  abs_reductions=["mean"], save_raw_tensor=True)
SMDEBUG_MX_REDUCTIONS = REDUCTIONS | {"reductions": ["min", "max", "mean", "sum", "prod"]}


def _same(actual: np.ndarray, want: np.ndarray, what: str) -> None:
    assert isinstance(actual, np.ndarray), what
    assert actual.dtype == want.dtype, (what, actual.dtype)
    assert actual.shape == want.shape, (what, actual.shape)
    assert np.array_equal(actual, want), what


# -- 1. smdebug reads mltrace ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def mltrace_run(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("mx_mltrace_for_smdebug") / "run")
    net, loss_fn = build_mlp()
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses", "relu_io",
                                         "custom"])
    hook.register_block(net)
    hook.register_block(loss_fn)
    hook.get_collection("relu_io").add_block_tensors(net[0].act, inputs=True, outputs=True)
    hook.get_collection("custom").include("^dense1_output_")
    hook.get_collection("custom").reduction_config = smd.ReductionConfig(
        **REDUCTIONS | {"reductions": REDUCTIONS["reductions"] + ["nan_count"]})
    schedule = [("TRAIN", 3), ("EVAL", 2), ("TRAIN", 1)]
    expected, global_of = train(net, loss_fn, schedule, hook.set_mode,
                                io_blocks=[net[0].act, net[1]])
    for values in expected.values():
        values.pop("dense1_input_0")
    hook.close()
    return out_dir, expected, global_of


def test_mxnet_smdebug_reads_mltrace_names_steps_values(mltrace_run):
    out_dir, expected, global_of = mltrace_run
    st, mt = smd_create_trial(out_dir), ml_create_trial(out_dir)
    every = sorted({n for values in expected.values() for n in values})
    assert st.tensor_names() == mt.tensor_names() == every
    for mode in ("TRAIN", "EVAL"):
        want = sorted(ms for (m, ms) in global_of if m == mode)
        assert st.steps(mode=SmdModeKeys[mode]) == mt.steps(mode=mode) == want
    assert st.steps() == sorted(global_of.values())
    checked = 0
    for (mode, mode_step), values in expected.items():
        assert st.tensor_names(step=mode_step, mode=SmdModeKeys[mode]) == sorted(values)
        for name, want in values.items():
            _same(st.tensor(name).value(mode_step, mode=SmdModeKeys[mode]), want,
                  f"{name} {mode} {mode_step}")
            _same(st.tensor(name).value(global_of[(mode, mode_step)]), want, f"{name} global")
            checked += 1
    assert checked == 4 * 6 + 4 * 4 + 6 + 3 * 6
    assert st.workers() == ["worker_0"] and st.loaded_all_steps


def test_mxnet_smdebug_reads_mltrace_collections_and_reductions(mltrace_run):
    out_dir, expected, _ = mltrace_run
    st = smd_create_trial(out_dir)
    assert set(st.collections()) == {"all", "default", "weights", "biases", "gradients", "losses",
                                     "relu_io", "custom"}
    assert st.tensor_names(collection="relu_io") == ["dense0_relu_input_0", "dense0_relu_output_0"]
    assert st.tensor_names(collection="losses") == ["softmaxcrossentropyloss0_output_0"]
    assert st.collection("losses").include_regex == [".*loss._(?!input).*output"]
    for (mode, mode_step), values in expected.items():
        stored = st.tensor("dense1_output_0").reduction_values(mode_step, mode=SmdModeKeys[mode])
        raw = values["dense1_output_0"].astype(np.float64)
        assert set(stored) >= {("min", False), ("l2", False), ("mean", True), ("nan_count", False)}
        np.testing.assert_allclose(
            [stored[("min", False)], stored[("max", False)], stored[("mean", False)],
             stored[("std", False)], stored[("variance", False)], stored[("l1", False)],
             stored[("l2", False)], stored[("mean", True)], stored[("nan_count", False)]],
            [raw.min(), raw.max(), raw.mean(), raw.std(), raw.var(), np.abs(raw).sum(),
             np.sqrt((raw**2).sum()), np.abs(raw).mean(), 0], rtol=1e-5)


# -- 2. the same run with both hooks ---------------------------------------------------------------
@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
    base = tmp_path_factory.mktemp("mx_side_by_side")
    net, loss_fn = build_cnn()
    hooks = {}
    for lib, module in (("mltrace", smd), ("smdebug", smdebug_mx)):
        hook = module.Hook(out_dir=str(base / lib), save_config=module.SaveConfig(save_interval=1),
                           save_all=True)
        custom = hook.get_collection("custom")
        custom.include("^dense0_output_")
        # smdebug's MXNet hook raises on std and variance (its numpy fallback rejects NDArrays).
        custom.reduction_config = module.ReductionConfig(**SMDEBUG_MX_REDUCTIONS)
        hook.register_block(net)
        hook.register_block(loss_fn)
        hooks[lib] = hook

    def set_mode(mode: str) -> None:
        hooks["mltrace"].set_mode(smd.modes.ModeKeys[mode])
        hooks["smdebug"].set_mode(SmdModeKeys[mode])

    expected, global_of = train(net, loss_fn, [("TRAIN", 3), ("EVAL", 1)], set_mode)
    for hook in hooks.values():
        hook.close()
    return {lib: str(base / lib) for lib in hooks}, expected, global_of, param_names(net)


def _contents(trial, st_modes: bool) -> dict[tuple[str, int, str], np.ndarray]:
    """{(mode, mode step, name): value} of every tensor in a trial, through one reader."""
    out = {}
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        for mode in ("TRAIN", "EVAL"):
            key = SmdModeKeys[mode] if st_modes else mode
            for mode_step in tensor.steps(mode=key):
                out[(mode, mode_step, name)] = tensor.value(mode_step, mode=key)
    return out


def test_mxnet_mltrace_reads_smdebug_hook_output(side_by_side):
    """mltrace's reader sees exactly what smdebug's reader sees in smdebug's MXNet trial."""
    dirs, _, _, _ = side_by_side
    st, mt = smd_create_trial(dirs["smdebug"]), ml_create_trial(dirs["smdebug"])
    assert mt.tensor_names() == st.tensor_names()
    assert mt.steps() == st.steps() == [0, 1, 2, 3]
    for mode in ("TRAIN", "EVAL"):
        assert mt.steps(mode=mode) == st.steps(mode=SmdModeKeys[mode])
    smd_values, ml_values = _contents(st, True), _contents(mt, False)
    assert smd_values.keys() == ml_values.keys() and len(smd_values) > 100
    for key, value in smd_values.items():
        _same(ml_values[key], value, str(key))
    assert sorted(mt.collections()) == sorted(st.collections())
    for name in ("losses", "gradients", "weights", "custom"):
        assert mt.tensor_names(collection=name) == st.tensor_names(collection=name), name
    for step in st.steps(mode=SmdModeKeys.TRAIN):
        smd_red = st.tensor("dense0_output_0").reduction_values(step, mode=SmdModeKeys.TRAIN)
        ml_red = mt.tensor("dense0_output_0").reduction_values(step, mode="TRAIN")
        assert smd_red.keys() == ml_red.keys() and len(smd_red) == 8
        for key, value in smd_red.items():
            np.testing.assert_array_equal(ml_red[key], value, err_msg=str(key))


def test_mxnet_both_hooks_write_the_same_tensors(side_by_side):
    dirs, expected, _, params = side_by_side
    ours = _contents(ml_create_trial(dirs["mltrace"]), False)
    theirs = _contents(smd_create_trial(dirs["smdebug"]), True)
    # smdebug's mode-switch bug: TRAIN step 2 ends with set_mode(EVAL); smdebug checks its
    # parameters against EVAL step -1 and drops them. mltrace keeps them, with the right values.
    dropped = {("TRAIN", 2, n) for n in params} | {("TRAIN", 2, f"gradient/{n}") for n in params}
    assert set(ours) - set(theirs) == dropped
    assert set(theirs) <= set(ours)
    for key in dropped:
        _same(ours[key], expected[("TRAIN", 2)][key[2]], str(key))
    for key, value in theirs.items():
        _same(ours[key], value, str(key))
    names = {n for _, _, n in ours}
    for block in ("conv0", "conv0_relu", "pool0", "conv1", "conv1_relu", "flatten0", "dense0"):
        assert {f"{block}_input_0", f"{block}_output_0"} <= names
    assert {"conv0_relu_input_0", "gradient/conv0_weight",
            "softmaxcrossentropyloss0_output_0"} <= names
    # The reductions smdebug computes with MXNet ops match ours (computed with MXNet ops too).
    st, mt = smd_create_trial(dirs["smdebug"]), ml_create_trial(dirs["mltrace"])
    assert st.steps(mode=SmdModeKeys.TRAIN) == [0, 1, 2]
    for step in (0, 1, 2):
        smd_red = st.tensor("dense0_output_0").reduction_values(step, mode=SmdModeKeys.TRAIN)
        ml_red = mt.tensor("dense0_output_0").reduction_values(step, mode="TRAIN")
        assert smd_red.keys() == ml_red.keys() and len(smd_red) == 8
        for key, value in smd_red.items():
            np.testing.assert_allclose(ml_red[key], value, rtol=1e-5, err_msg=str(key))
