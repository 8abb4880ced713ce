"""The flight recorder on MXNet 1.9.1 Gluon (mltrace.capture.flight_recorder through the hook's
forward hooks and step-boundary parameter reads): a NaN made by a block in the middle of a model
at a seeded step of a run saving every 500 leaves the steps around it in the trial at full
resolution, names that block's output first, and real smdebug 1.0.34 reads the dumped steps; a
budget too small for the model's parameters fails at register_block."""

from __future__ import annotations

import random

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn
from smdebug.trials import create_trial as smd_create_trial

import mltrace.mxnet as smd
from mltrace.exceptions import MltraceValueError
from mltrace.format.flight_record import read_records
from mltrace.storage import open_storage
from mltrace.trials import create_trial
from tests.support.flight_records import FIVE_REDUCTIONS

N, K = 6, 3
ACTS = ["dense0_output_0", "poison0_output_0", "dense1_output_0", "dense2_output_0"]
PARAMS = [f"dense{i}_{p}" for i in range(3) for p in ("weight", "bias")]
GRADS = [f"gradient/{p}" for p in PARAMS]
LOSS = "softmaxcrossentropyloss0_output_0"


class Poison(gluon.Block):
    """Multiplies its input by NaN while ``on`` (the training loop sets it for one step)."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def forward(self, x):
        return x * float("nan") if self.on else x


def _model():
    mx.random.seed(0)
    with mx.name.NameManager():
        poison = Poison()
        net = nn.Sequential()
        net.add(nn.Dense(8, activation="tanh", in_units=5), poison,
                nn.Dense(8, activation="tanh", in_units=8), nn.Dense(3, in_units=8))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    net.initialize(mx.init.Xavier())
    return net, poison, loss_fn


def _train(hook, steps: int, poison_at: int | None) -> None:
    net, poison, loss_fn = _model()
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    rng = np.random.default_rng(0)
    for step in range(steps):
        poison.on = step == poison_at
        x = mx.nd.array(rng.standard_normal((4, 5)))
        y = mx.nd.array(rng.integers(0, 3, 4))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(4)
    hook.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    poison = random.Random(15).randrange(N + 2, 30)
    out = str(tmp_path_factory.mktemp("mxnet_flight") / "run")
    smd.get_collection("acts").include(r"^(dense\d|poison\d)_output_0$")
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=500),
                    flight_recorder=smd.FlightRecorderConfig(
                        steps=N, after_steps=K, collections=["acts", "gradients", "weights",
                                                             "biases", "losses"],
                        reductions=list(FIVE_REDUCTIONS)))
    _train(hook, poison + K + 5, poison)
    return out, poison


def test_the_steps_around_the_nan_are_in_the_trial_at_full_resolution(run):
    out, poison = run
    trial = create_trial(out)
    window = list(range(poison - N, poison + K + 1))
    assert trial.steps() == [0] + window
    for step in window:
        for name in ACTS + PARAMS + GRADS:
            for red in FIVE_REDUCTIONS:
                assert np.size(trial.tensor(name).reduction_value(step, red)) == 1
        # Gluon's losses are per sample: kept as reductions, as any non-scalar tensor
        assert np.size(trial.tensor(LOSS).reduction_value(step, "mean")) == 1
    before = poison - 1
    assert all(np.isfinite(trial.tensor(n).reduction_value(before, "max")) for n in ACTS + GRADS)
    assert np.isfinite(trial.tensor("dense0_output_0").reduction_value(poison, "max"))
    assert np.isnan(trial.tensor("poison0_output_0").reduction_value(poison, "max"))
    # the NaN step's update made the weights NaN: the steps after it stay non-finite
    assert np.isnan(trial.tensor("dense0_weight").reduction_value(poison, "mean"))


def test_the_record_names_the_poisoned_blocks_output_first(run):
    out, poison = run
    (record,) = read_records(open_storage(out))
    (dump,) = record.dumps
    window = list(range(poison - N, poison + K + 1))
    assert (dump.trigger, dump.step, dump.steps_before, dump.steps_after) == (
        "nonfinite", poison, window[:N], window[N + 1:])
    first = create_trial(out).first_nonfinite()
    assert first is not None and first == record.first_nonfinite
    assert (first.tensor, first.step, first.mode, first.worker, first.phase, first.position) == (
        "poison0_output_0", poison, "GLOBAL", "worker_0", "forward", 1)
    assert first.nonfinite_tensors[:3] == ["poison0_output_0", "dense1_output_0", "dense2_output_0"]
    assert "gradient/dense0_weight" in first.nonfinite_tensors


def test_smdebug_reads_the_dumped_steps(run):
    out, poison = run
    theirs, ours = smd_create_trial(out), create_trial(out)
    assert theirs.steps() == ours.steps()
    for name in ("poison0_output_0", "gradient/dense1_weight", "dense2_bias"):
        for step in (poison - 1, poison, poison + 1):
            for red in ("min", "max", "mean", "l2"):
                np.testing.assert_array_equal(theirs.tensor(name).reduction_value(step, red),
                                              ours.tensor(name).reduction_value(step, red))


def test_a_budget_too_small_for_the_parameters_fails_at_register_block(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"),
                    flight_recorder=smd.FlightRecorderConfig(
                        steps=5, collections=["weights", "gradients"], raw=True,
                        memory_budget=500))
    net, _, _ = _model()
    with pytest.raises(MltraceValueError, match=r"memory_budget=500\) cannot hold one step"):
        hook.register_block(net)
    hook.close()


def test_the_recorder_skips_what_has_no_reduction():
    from mltrace.mxnet.adapter import GluonAdapter

    adapter = GluonAdapter()
    assert adapter.recordable(mx.nd.ones((2, 3))) and adapter.recordable(1.5)
    assert not adapter.recordable(mx.nd.array(np.zeros((0,))))  # empty: no min, no max
    assert adapter.shape_and_dtype(mx.nd.ones((2, 3), dtype="float16")) == ((2, 3), np.float16)
    snap = adapter.snapshot(mx.nd.ones((2, 3)))
    assert adapter.nbytes(snap) == 24 and snap.context == mx.cpu()


def test_a_steps_reductions_reach_the_host_flat_as_numpy_defines_them():
    from mltrace.capture.recording_adapter import RecordingAdapter
    from mltrace.mxnet.adapter import GluonAdapter
    from mltrace.reductions import compute

    adapter = GluonAdapter()
    items = [("min", False), ("max", False), ("mean", False), ("std", False), ("l2", False),
             ("max", True), ("nan_count", False), ("zero_fraction", False)]
    rng = np.random.default_rng(3)
    poisoned = rng.standard_normal((5, 4)).astype("float32")
    poisoned[2, 1] = np.nan
    arrays = [rng.standard_normal((3, 4)).astype("float32"), poisoned,
              np.arange(6, dtype=np.int32)]
    started = [adapter.reduce_on_device(mx.nd.array(a, dtype=a.dtype), items) for a in arrays]
    flat = adapter.reductions_to_flat(started)
    assert flat.dtype == np.float64 and flat.shape == (len(arrays) * len(items),)
    np.testing.assert_array_equal(flat, RecordingAdapter.reductions_to_flat(adapter, started))
    expected = [float(compute(n, a, abs_)) for a in arrays for n, abs_ in items]
    np.testing.assert_allclose(flat, expected, rtol=1e-6)  # NaN where numpy has NaN
