"""mltrace's reader reads what real smdebug 1.0.34's PyTorch hook writes (docs/format.md).

One run of ``smdebug.pytorch.Hook`` (TRAIN, EVAL, PREDICT, then TRAIN again; a hook-wide
ReductionConfig with every reduction and norm; module inputs/outputs through
``get_collection(...).add_module_tensors``; ``include_regex``; a reductions-only collection; a
shape-only collection; ``save_scalar``; ``save_tensor`` of several dtypes) is read by smdebug's own
``create_trial`` and by mltrace's in the same process. Names, steps, values, shapes and stored
reductions must agree, except where docs/format.md lists a bug of smdebug's reader; there
mltrace must be right, and the test says which bug it is.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import smdebug.pytorch as smd
import torch
from smdebug.core.modes import ModeKeys as SmdModeKeys
from smdebug.core.reductions import get_numpy_reduction
from smdebug.exceptions import ShapeUnavailableForStep as SmdShapeUnavailableForStep
from smdebug.exceptions import TensorUnavailableForStep as SmdTensorUnavailableForStep
from smdebug.trials import create_trial as smd_create_trial

from mltrace.exceptions import ShapeUnavailableForStep, TensorUnavailableForStep
from mltrace.trials import create_trial as ml_create_trial

SCHEDULE = [("TRAIN", 3), ("EVAL", 2), ("PREDICT", 1), ("TRAIN", 1)]
MODES = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")
HOOK_REDUCTIONS = dict(
    reductions=["min", "max", "mean", "std", "variance", "sum", "prod"],
    abs_reductions=["max", "mean"], norms=["l1", "l2"], abs_norms=["l2"], save_raw_tensor=True,
)
HOOK_REDUCTION_KEYS = {(r, False) for r in HOOK_REDUCTIONS["reductions"] + ["l1", "l2"]} | {
    ("max", True), ("mean", True), ("l2", True)}
# Written through save_tensor: what smdebug's reader gets right, and what it does not.
DTYPE_TENSORS = {
    "dtype_float16": np.array([[0.5, -1.25], [3.0, 100.0]], dtype=np.float16),
    "dtype_float64": np.array([1e-300, -2.5, np.pi]),
    "dtype_int32": np.array([-(2**31), 0, 2**31 - 1], dtype=np.int32),
    "dtype_int64": np.array([[-(2**62)], [2**62]], dtype=np.int64),
    "dtype_uint8": np.array([0, 7, 255], dtype=np.uint8),
    "dtype_bool": np.array([True, False, True]),
    "dtype_int8": np.array([-128, -1, 0, 127], dtype=np.int8),  # smdebug's reader: uint8
    "dtype_int16": np.array([-300, 300], dtype=np.int16),  # smdebug's reader: KeyError
}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 6)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Write a run with real smdebug; return (out_dir, {(mode, mode step): global step})."""
    out_dir = tmp_path_factory.mktemp("smdebug_written") / "run"
    torch.manual_seed(1)
    model = Net()
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = smd.Hook(
        out_dir=str(out_dir),
        save_config=smd.SaveConfig(save_interval=1),
        reduction_config=smd.ReductionConfig(**HOOK_REDUCTIONS),
        include_collections=["weights", "biases", "gradients", "losses", "relu_io", "fc1_stats",
                             "shapes", "dtypes"],
        include_regex=["^fc2_output_"],
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    relu_io = hook.get_collection("relu_io")
    relu_io.add_module_tensors(model.relu, inputs=True, outputs=True)
    relu_io.reduction_config = smd.ReductionConfig(save_raw_tensor=True)  # raw only
    fc1_stats = hook.get_collection("fc1_stats")  # reductions only, no raw tensor
    fc1_stats.add_module_tensors(model.fc1, outputs=True)
    fc1_stats.reduction_config = smd.ReductionConfig(
        reductions=["min", "max"], abs_reductions=["sum"], norms=["l1"], save_raw_tensor=False)
    shapes = hook.get_collection("shapes")  # shapes only: index shape_payload, no record
    shapes.include("^Net_output_")
    shapes.reduction_config = smd.ReductionConfig(save_shape=True)
    hook.get_collection("dtypes").include("^dtype_")

    global_of: dict[tuple[str, int], int] = {}
    mode_steps: dict[str, int] = defaultdict(int)
    step = 0
    for mode, n in SCHEDULE:
        hook.set_mode(getattr(smd.modes, mode))
        for _ in range(n):
            global_of[(mode, mode_steps[mode])] = step
            if mode == "TRAIN":
                # written by the hook at the step's first forward hook
                for name, value in DTYPE_TENSORS.items():
                    hook.save_tensor(name, value, "dtypes")
            x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
            if mode == "TRAIN":
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                hook.save_scalar("lr", 0.1 / (1 + step))
            else:
                with torch.no_grad():
                    loss_fn(model(x), y)
            mode_steps[mode] += 1
            step += 1
    hook.close()
    return out_dir, global_of


@pytest.fixture(scope="module")
def trials(run):
    out_dir = run[0]
    return smd_create_trial(str(out_dir)), ml_create_trial(str(out_dir))


def _assert_same(actual, want, what: str) -> None:
    assert isinstance(actual, np.ndarray) and isinstance(want, np.ndarray), what
    assert actual.dtype == want.dtype and actual.shape == want.shape, (
        what, actual.dtype, want.dtype, actual.shape, want.shape)
    assert np.array_equal(actual, want), what


def test_run_exercises_what_it_should(run, trials):
    st, _ = trials
    names = st.tensor_names()
    assert {"fc1_output_0", "relu_input_0", "relu_output_0", "fc2_output_0", "Net_output_0",
            "CrossEntropyLoss_output_0", "scalar/lr", "gradient/Net_fc1.weight"} <= set(names)
    assert set(DTYPE_TENSORS) <= set(names)


def test_tensor_names(run, trials):
    st, mt = trials
    assert mt.tensor_names() == st.tensor_names()
    for (mode, mode_step) in run[1]:
        assert mt.tensor_names(step=mode_step, mode=mode) == st.tensor_names(
            step=mode_step, mode=SmdModeKeys[mode]), (mode, mode_step)
    for coll in ("weights", "gradients", "relu_io", "fc1_stats", "dtypes", "losses", "default"):
        assert mt.tensor_names(collection=coll) == st.tensor_names(collection=coll), coll
    assert mt.tensor_names(regex="^gradient/") == st.tensor_names(regex="^gradient/")


def test_steps_modes_and_workers(run, trials):
    _, global_of = run
    st, mt = trials
    for mode in MODES:
        want = sorted(global_of.values()) if mode == "GLOBAL" else sorted(
            ms for (m, ms) in global_of if m == mode)
        assert mt.steps(mode=mode) == st.steps(mode=SmdModeKeys[mode]) == want, mode
    assert sorted(m.name for m in mt.modes()) == sorted(m.name for m in st.modes())
    for (mode, mode_step), g in global_of.items():
        ml_mode, ml_ms = mt.mode_modestep(g)
        smd_mode, smd_ms = st.mode_modestep(g)
        assert (ml_mode.name, ml_ms) == (smd_mode.name, smd_ms) == (mode, mode_step)
        assert mt.global_step(mode, mode_step) == st.global_step(SmdModeKeys[mode], mode_step) == g
    assert mt.workers() == st.workers() == ["worker_0"]
    assert mt.num_workers == st.num_workers == 1


def test_collections(trials):
    st, mt = trials
    smd_colls, ml_colls = st.collections(), mt.collections()
    assert set(ml_colls) == set(smd_colls)
    for name, smd_coll in smd_colls.items():
        assert ml_colls[name].to_json_dict() == smd_coll.to_json_dict(), name
    red = ml_colls["weights"].reduction_config
    assert set(red.items()) == HOOK_REDUCTION_KEYS and red.save_raw_tensor
    assert ml_colls["shapes"].reduction_config.save_shape


def _each_saved(run, trials):
    """Yield (name, mode, mode step) for every tensor and step smdebug's reader reports."""
    st, _ = trials
    for name in st.tensor_names():
        for mode in ("TRAIN", "EVAL", "PREDICT"):
            for mode_step in st.tensor(name).steps(mode=SmdModeKeys[mode]):
                yield name, mode, mode_step


def test_tensor_steps_per_mode(trials):
    st, mt = trials
    for name in st.tensor_names():
        for mode in MODES:
            assert mt.tensor(name).steps(mode=mode) == st.tensor(name).steps(
                mode=SmdModeKeys[mode]), (name, mode)


def test_values_and_shapes(run, trials):
    st, mt = trials
    checked = unavailable = 0
    for name, mode, mode_step in _each_saved(run, trials):
        smd_tensor, ml_tensor = st.tensor(name), mt.tensor(name)
        what = f"{name} {mode} {mode_step}"
        if name in ("dtype_int8", "dtype_int16"):
            continue  # test_dtypes_smdebug_reads_wrong
        try:
            smd_shape = smd_tensor.shape(mode_step, mode=SmdModeKeys[mode])
        except SmdShapeUnavailableForStep:  # reductions only: neither value nor shape saved
            with pytest.raises(ShapeUnavailableForStep):
                ml_tensor.shape(mode_step, mode=mode)
        else:
            assert ml_tensor.shape(mode_step, mode=mode) == smd_shape, what
        try:
            smd_value = smd_tensor.value(mode_step, mode=SmdModeKeys[mode])
        except SmdTensorUnavailableForStep:
            # Reductions-only and shape-only tensors have no value, for either reader.
            with pytest.raises(TensorUnavailableForStep):
                ml_tensor.value(mode_step, mode=mode)
            unavailable += 1
            continue
        _assert_same(ml_tensor.value(mode_step, mode=mode), smd_value, what)
        g = mt.global_step(mode, mode_step)
        _assert_same(ml_tensor.value(g), smd_value, what + " by global step")
        if name in DTYPE_TENSORS:
            _assert_same(ml_tensor.value(mode_step, mode=mode), DTYPE_TENSORS[name], what)
        checked += 1
    assert checked >= 100 and unavailable > 0
    # smdebug stores 0-d torch losses with shape [], Python-float scalars with shape [1].
    assert mt.tensor("CrossEntropyLoss_output_0").value(0, mode="TRAIN").shape == ()
    assert mt.tensor("scalar/lr").value(0, mode="TRAIN").shape == (1,)
    assert mt.tensor("Net_output_0").shape(0, mode="EVAL") == (5, 3)  # from shape_payload


def test_dtypes_smdebug_reads_wrong(run, trials):
    """docs/format.md, "What smdebug's reader gets wrong": it decodes DT_INT8 as uint8 and has no
    mapping for DT_INT16 (KeyError). mltrace returns what was written."""
    st, mt = trials
    for mode_step in mt.tensor("dtype_int8").steps(mode="TRAIN"):
        _assert_same(mt.tensor("dtype_int8").value(mode_step, mode="TRAIN"),
                     DTYPE_TENSORS["dtype_int8"], "mltrace int8")
        _assert_same(mt.tensor("dtype_int16").value(mode_step, mode="TRAIN"),
                     DTYPE_TENSORS["dtype_int16"], "mltrace int16")
        wrong = st.tensor("dtype_int8").value(mode_step, mode=SmdModeKeys.TRAIN)
        _assert_same(wrong, DTYPE_TENSORS["dtype_int8"].view(np.uint8), "smdebug's int8 bug")
        with pytest.raises(KeyError):
            st.tensor("dtype_int16").value(mode_step, mode=SmdModeKeys.TRAIN)
        assert mt.tensor("dtype_int8").shape(mode_step, mode="TRAIN") == (4,)


def test_stored_reductions(run, trials):
    st, mt = trials
    checked = 0
    for name, mode, mode_step in _each_saved(run, trials):
        smd_reds = st.tensor(name).reduction_values(mode_step, mode=SmdModeKeys[mode])
        ml_reds = mt.tensor(name).reduction_values(mode_step, mode=mode)
        assert set(ml_reds) == set(smd_reds), (name, mode, mode_step)
        for key, smd_value in smd_reds.items():
            what = f"{name} {key} {mode} {mode_step}"
            _assert_same(ml_reds[key], smd_value, what)
            red, abs_ = key
            _assert_same(mt.tensor(name).reduction_value(mode_step, red, mode=mode, abs=abs_),
                         smd_value, what)
            checked += 1
    assert checked > 300
    # Which tensors got which reductions (smdebug's rules, read back by mltrace).
    assert set(mt.tensor("Net_fc1.weight").reduction_values(0, mode="TRAIN")) == HOOK_REDUCTION_KEYS
    assert set(mt.tensor("fc1_output_0").reduction_values(0, mode="EVAL")) == {
        ("min", False), ("max", False), ("sum", True), ("l1", False)}
    assert mt.tensor("relu_output_0").reduction_values(0, mode="TRAIN") == {}
    # losses never get reductions (smdebug's SCALAR_COLLECTIONS)
    assert mt.tensor("CrossEntropyLoss_output_0").reduction_values(0, mode="TRAIN") == {}


def test_stored_reductions_are_smdebug_pytorch_semantics(trials):
    """smdebug's PyTorch hook computes std/variance unbiased (torch's default, N-1): stored values
    are read back as stored, they are not recomputed (docs/format.md)."""
    _, mt = trials
    t = mt.tensor("Net_fc1.weight")
    raw = t.value(0, mode="TRAIN").astype(np.float64)
    np.testing.assert_allclose(t.reduction_value(0, "std", mode="TRAIN"), raw.std(ddof=1),
                               rtol=1e-5)
    np.testing.assert_allclose(t.reduction_value(0, "variance", mode="TRAIN"), raw.var(ddof=1),
                               rtol=1e-5)
    np.testing.assert_allclose(t.reduction_value(0, "l2", mode="TRAIN"),
                               np.sqrt((raw**2).sum()), rtol=1e-5)


def test_computed_reductions(trials):
    """Reductions not stored are computed from the raw tensor by both readers.

    For float tensors they agree for min/max/mean/std/variance/sum/prod, and for norms of 1-d
    tensors. For 2-d tensors smdebug's reader uses np.linalg.norm's *matrix* norms (max column
    sum for l1, spectral norm for l2; a bug, see docs/format.md): mltrace gives the flat norms
    that every stored norm means. Integer tensors: mltrace reduces them in float64
    (docs/format.md, "Reductions"), smdebug in the integer dtype, where abs(INT32_MIN) wraps
    around to INT32_MIN; mltrace equals smdebug's formula applied to the float64 values.
    """
    st, mt = trials
    smdebug_wrong = set()
    for name in ("relu_input_0", "relu_output_0", "dtype_float16", "dtype_float64",
                 "dtype_int32", "dtype_int64", "dtype_uint8", "dtype_bool"):
        for mode_step in st.tensor(name).steps(mode=SmdModeKeys.TRAIN):
            smd_t, ml_t = st.tensor(name), mt.tensor(name)
            raw = ml_t.value(mode_step, mode="TRAIN")
            integer = raw.dtype.kind in "biu"
            for red in ("min", "max", "mean", "std", "variance", "sum", "prod"):
                for abs_ in (False, True):
                    if integer:
                        smd_value = get_numpy_reduction(red, raw.astype(np.float64), abs_)
                    else:
                        smd_value = smd_t.reduction_value(
                            mode_step, red, mode=SmdModeKeys.TRAIN, abs=abs_)
                    ml_value = ml_t.reduction_value(mode_step, red, mode="TRAIN", abs=abs_)
                    rtol = 1e-3 if raw.dtype == np.float16 else 1e-6
                    np.testing.assert_allclose(ml_value, smd_value, rtol=rtol,
                                               err_msg=f"{name} {red} {abs_}")
            if name == "dtype_int32":  # smdebug's integer abs wraps around; mltrace's does not
                wrapped = smd_t.reduction_value(mode_step, "min", mode=SmdModeKeys.TRAIN, abs=True)
                assert wrapped == -(2**31)
                assert ml_t.reduction_value(mode_step, "min", mode="TRAIN", abs=True) == 0.0
            if raw.dtype.kind == "b":
                continue  # np.linalg.norm rejects bool arrays
            flat = np.abs(raw.astype(np.float64).reshape(-1))
            for norm, want in (("l1", flat.sum()), ("l2", np.sqrt((flat**2).sum()))):
                ml_value = ml_t.reduction_value(mode_step, norm, mode="TRAIN")
                np.testing.assert_allclose(ml_value, want, rtol=rtol, err_msg=f"{name} {norm}")
                if raw.ndim > 1 and raw.dtype == np.float16 and norm == "l2":
                    with pytest.raises(TypeError):  # smdebug: np.linalg's SVD rejects float16
                        smd_t.reduction_value(mode_step, norm, mode=SmdModeKeys.TRAIN)
                    continue
                smd_value = smd_t.reduction_value(mode_step, norm, mode=SmdModeKeys.TRAIN)
                if raw.ndim == 1:
                    np.testing.assert_allclose(ml_value, smd_value, rtol=rtol)
                else:  # smdebug's matrix-norm bug
                    matrix = np.linalg.norm(raw, ord=int(norm[1]))
                    np.testing.assert_allclose(smd_value, matrix, rtol=1e-6)
                    if not np.isclose(smd_value, want, rtol=1e-3):
                        smdebug_wrong.add((name, norm))
    # The matrix norms of a real activation differ from its flat norms.
    assert {("relu_input_0", "l1"), ("relu_input_0", "l2")} <= smdebug_wrong
