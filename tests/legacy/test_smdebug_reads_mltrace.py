"""Real smdebug 1.0.34's reader reads what mltrace's PyTorch hook writes (docs/format.md).

One small run (TRAIN, EVAL, then TRAIN again) is written by ``mltrace.pytorch.Hook`` while the
test captures every value it expects on disk. smdebug's ``create_trial`` must then see the same
tensor names, steps per mode, values, collections, workers and stored reductions as both the
captured values and mltrace's own reader, and must not trip over mltrace's additions: the
``crc32c`` field of index entries and the ``mltrace_reductions`` key of a collection entry
(with reductions smdebug does not know, e.g. ``nan_count``, whose tensors it still reads).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from smdebug.core.modes import ModeKeys as SmdModeKeys
from smdebug.trials import create_trial as smd_create_trial

import mltrace.pytorch as mlsmd
from mltrace.trials import create_trial as ml_create_trial

# (mode, number of steps) in the order they run: mode steps continue when a mode comes back.
SCHEDULE = [("TRAIN", 3), ("EVAL", 2), ("TRAIN", 1)]
CUSTOM_REDUCTIONS = {
    ("min", False), ("max", False), ("mean", False), ("l2", False), ("mean", True),
    ("nan_count", False), ("zero_fraction", False),
}
MODES = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 6)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().clone().cpu().numpy()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Train with mltrace's hook; return (out_dir, expected values, expected steps)."""
    out_dir = tmp_path_factory.mktemp("mltrace_written") / "run"
    torch.manual_seed(0)
    model = Net()
    loss_fn = torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    hook = mlsmd.Hook(
        out_dir=str(out_dir),
        save_config=mlsmd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses", "relu_io", "custom"],
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.get_collection("relu_io").add_module_tensors(model.relu, inputs=True, outputs=True)
    custom = hook.get_collection("custom")
    custom.include("^fc1_output_")
    custom.reduction_config = mlsmd.ReductionConfig(
        reductions=["min", "max", "mean", "nan_count", "zero_fraction"], abs_reductions=["mean"],
        norms=["l2"], save_raw_tensor=True,
    )

    # What each (mode, mode step) must hold, captured beside the hook.
    expected: dict[tuple[str, int], dict[str, np.ndarray]] = defaultdict(dict)
    current: dict[str, object] = {}

    def capture(name: str, value: np.ndarray) -> None:
        expected[(current["mode"], current["mode_step"])][name] = value

    def on_fc1(module, inputs, output) -> None:
        capture("fc1_output_0", _np(output))

    def on_relu(module, inputs, output) -> None:
        capture("relu_input_0", _np(inputs[0]))
        capture("relu_output_0", _np(output))

    model.fc1.register_forward_hook(on_fc1)
    model.relu.register_forward_hook(on_relu)

    mode_steps: dict[str, int] = defaultdict(int)
    global_of: dict[tuple[str, int], int] = {}
    step = 0
    for mode, n in SCHEDULE:
        hook.set_mode(getattr(mlsmd.modes, mode))
        for _ in range(n):
            current.update(mode=mode, mode_step=mode_steps[mode])
            global_of[(mode, mode_steps[mode])] = step
            for pname, param in model.named_parameters():  # saved before the step's update
                capture(f"Net_{pname}", _np(param))
            x, y = torch.randn(5, 4), torch.randn(5, 2)
            if mode == "TRAIN":
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                for pname, param in model.named_parameters():
                    capture(f"gradient/Net_{pname}", _np(param.grad))
                opt.step()
                lr = 0.1 / (1 + step)
                hook.save_scalar("lr", lr)
                capture("scalar/lr", np.array([lr]))
            else:
                with torch.no_grad():
                    loss = loss_fn(model(x), y)
                hook.save_scalar("eval_metric", float(step) + 0.5)
                capture("scalar/eval_metric", np.array([float(step) + 0.5]))
            capture("MSELoss_output_0", _np(loss))
            mode_steps[mode] += 1
            step += 1
    hook.close()
    return out_dir, dict(expected), global_of


@pytest.fixture(scope="module")
def trials(run):
    out_dir = run[0]
    return smd_create_trial(str(out_dir)), ml_create_trial(str(out_dir))


def _names_by_mode(expected) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for (mode, _), values in expected.items():
        out[mode] |= set(values)
        out["GLOBAL"] |= set(values)
    return out


def test_files_carry_mltrace_extras(run):
    """The extras smdebug must tolerate are really there (else the test proves nothing)."""
    out_dir = Path(run[0])
    index_files = sorted(out_dir.glob("index/*/*.json"))
    assert len(index_files) == sum(n for _, n in SCHEDULE)
    for f in index_files:
        entries = json.loads(f.read_text())["tensor_payload"]
        assert entries and all(isinstance(e["crc32c"], int) for e in entries)
    colls = json.loads((out_dir / "collections/000000000/worker_0_collections.json").read_text())
    assert set(colls) == {"collections", "_meta"}
    assert "nan_count" in colls["collections"]["custom"]["mltrace_reductions"]
    assert "nan_count" not in colls["collections"]["custom"]["reduction_config"]["reductions"]


def test_tensor_names(run, trials):
    expected = run[1]
    st, mt = trials
    by_mode = _names_by_mode(expected)
    assert st.tensor_names() == mt.tensor_names() == sorted(by_mode["GLOBAL"])
    for mode in ("TRAIN", "EVAL"):
        assert st.tensor_names(mode=SmdModeKeys[mode]) == sorted(by_mode[mode])
    for (mode, mode_step), values in expected.items():
        names = sorted(values)
        assert st.tensor_names(step=mode_step, mode=SmdModeKeys[mode]) == names
        assert mt.tensor_names(step=mode_step, mode=mode) == names
    # Gradients exist in TRAIN only; EVAL saves no gradients (smdebug's rule, kept by mltrace).
    assert not [n for n in by_mode["EVAL"] if n.startswith("gradient/")]


def test_tensor_names_of_a_mode(run, trials):
    by_mode = _names_by_mode(run[1])
    st, mt = trials
    for mode in ("TRAIN", "EVAL"):
        want = sorted(by_mode[mode])
        assert mt.tensor_names(mode=mode) == st.tensor_names(mode=SmdModeKeys[mode]) == want


def test_steps_modes_and_workers(run, trials):
    _, expected, global_of = run
    st, mt = trials
    for mode in MODES:
        if mode == "GLOBAL":
            want = sorted(global_of.values())
        else:
            want = sorted(ms for (m, ms) in global_of if m == mode)
        assert st.steps(mode=SmdModeKeys[mode]) == want, mode
        assert mt.steps(mode=mode) == want, mode
    smd_modes, ml_modes = sorted(m.name for m in st.modes()), sorted(m.name for m in mt.modes())
    assert smd_modes == ml_modes == ["EVAL", "TRAIN"]
    for (mode, mode_step), g in global_of.items():
        smd_mode, smd_ms = st.mode_modestep(g)
        ml_mode, ml_ms = mt.mode_modestep(g)
        assert (smd_mode.name, smd_ms) == (ml_mode.name, ml_ms) == (mode, mode_step)
        assert st.global_step(SmdModeKeys[mode], mode_step) == mt.global_step(mode, mode_step) == g
    assert st.workers() == mt.workers() == ["worker_0"]
    assert st.num_workers == mt.num_workers == 1
    assert st.loaded_all_steps and mt.loaded_all_steps


def test_tensor_steps_per_mode(run, trials):
    expected = run[1]
    st, mt = trials
    for name in st.tensor_names():
        for mode in MODES:
            smd_steps = st.tensor(name).steps(mode=SmdModeKeys[mode])
            assert smd_steps == mt.tensor(name).steps(mode=mode), (name, mode)
        want = sorted(ms for (m, ms), vals in expected.items() if m == "TRAIN" and name in vals)
        assert st.tensor(name).steps(mode=SmdModeKeys.TRAIN) == want, name


def _assert_same(actual: np.ndarray, want: np.ndarray, what: str) -> None:
    assert isinstance(actual, np.ndarray), what
    assert actual.dtype == want.dtype and actual.shape == want.shape, (
        what, actual.dtype, actual.shape)
    assert np.array_equal(actual, want), what


def test_values_equal_captured_and_mltrace(run, trials):
    _, expected, global_of = run
    st, mt = trials
    checked = 0
    for (mode, mode_step), values in expected.items():
        g = global_of[(mode, mode_step)]
        for name, want in values.items():
            smd_value = st.tensor(name).value(mode_step, mode=SmdModeKeys[mode])
            _assert_same(smd_value, want, f"smdebug {name} {mode} {mode_step}")
            _assert_same(mt.tensor(name).value(mode_step, mode=mode), want, f"mltrace {name}")
            # The same step by its global number.
            _assert_same(st.tensor(name).value(g), want, f"smdebug {name} global {g}")
            assert st.tensor(name).shape(mode_step, mode=SmdModeKeys[mode]) == want.shape
            assert mt.tensor(name).shape(mode_step, mode=mode) == want.shape
            checked += 1
    # weights+biases (4), gradients (4 in TRAIN), loss, 3 module tensors, one scalar per step
    assert checked == 4 * 6 + 4 * 4 + 6 + 3 * 6 + 6
    # Shapes as smdebug writes them: 0-d loss tensor, shape [1] for Python-float scalars.
    assert expected[("TRAIN", 0)]["MSELoss_output_0"].shape == ()
    assert st.tensor("scalar/lr").value(0, mode=SmdModeKeys.TRAIN).shape == (1,)


def test_stored_reductions(run, trials):
    """mltrace's stored reductions, including ones smdebug has no name for, read by smdebug."""
    expected = run[1]
    st, mt = trials
    for (mode, mode_step), values in expected.items():
        raw = values["fc1_output_0"]
        smd = st.tensor("fc1_output_0").reduction_values(mode_step, mode=SmdModeKeys[mode])
        ml = mt.tensor("fc1_output_0").reduction_values(mode_step, mode=mode)
        assert set(smd) == set(ml) == CUSTOM_REDUCTIONS
        for key in CUSTOM_REDUCTIONS:
            _assert_same(smd[key], ml[key], f"{key} at {mode} {mode_step}")
            red, abs_ = key
            single = st.tensor("fc1_output_0").reduction_value(
                mode_step, red, mode=SmdModeKeys[mode], abs=abs_)
            _assert_same(single, ml[key], f"smdebug reduction_value {key}")
        ref = raw.astype(np.float64)
        np.testing.assert_allclose(
            [smd[("min", False)], smd[("max", False)], smd[("mean", False)],
             smd[("l2", False)], smd[("mean", True)], smd[("zero_fraction", False)]],
            [ref.min(), ref.max(), ref.mean(), np.sqrt((ref**2).sum()), np.abs(ref).mean(),
             np.count_nonzero(ref == 0) / ref.size],
            rtol=1e-6,
        )
        assert int(smd[("nan_count", False)]) == 0
        # Tensors of collections without reductions have none stored.
        assert st.tensor("relu_output_0").reduction_values(mode_step, mode=SmdModeKeys[mode]) == {}
        assert mt.tensor("relu_output_0").reduction_values(mode_step, mode=mode) == {}


def test_collections(trials):
    st, mt = trials
    smd_colls, ml_colls = st.collections(), mt.collections()
    assert set(smd_colls) == set(ml_colls) == {
        "all", "default", "weights", "biases", "gradients", "losses", "relu_io", "custom"}
    for name, smd_coll in smd_colls.items():
        ml_dict = ml_colls[name].to_json_dict()
        ml_dict.pop("mltrace_reductions", None)
        assert smd_coll.to_json_dict() == ml_dict, name
    assert sorted(smd_colls["relu_io"].tensor_names) == ["relu_input_0", "relu_output_0"]
    assert st.tensor_names(collection="relu_io") == mt.tensor_names(collection="relu_io") == [
        "relu_input_0", "relu_output_0"]
    assert st.tensor_names(collection="gradients") == mt.tensor_names(collection="gradients")
    assert st.tensor_names(collection="losses") == ["MSELoss_output_0"]
    smd_red = smd_colls["custom"].reduction_config
    assert (smd_red.reductions, smd_red.abs_reductions, smd_red.norms) == (
        ["min", "max", "mean"], ["mean"], ["l2"])
    ml_red = ml_colls["custom"].reduction_config
    assert set(ml_red.items()) == CUSTOM_REDUCTIONS
    assert not smd_colls["losses"].save_histogram and smd_colls["weights"].save_histogram
