"""The flight recorder on TensorFlow 2.21 / Keras 3 (mltrace.capture.flight_recorder through
KerasHook's and SessionHook's own callbacks, no tf.debugging): a NaN made in the middle of a model
at a seeded batch of a run saving every 500 steps leaves the steps around it in the trial at full
resolution and names the poisoned layer's output first; gradient tapes, manual dumps through the
front, an exception escaping fit, a budget too small for the model's weights, a tf.compat.v1
session, MirroredStrategy, the JSON config's FlightRecorder key, and a saved step inside a dump's
window keeping what it saved."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import mltrace.tensorflow as smd
import mltrace.xgboost as smd_xgb
from mltrace.exceptions import MltraceValueError
from mltrace.format.flight_record import read_records
from mltrace.storage import open_storage
from mltrace.trials import create_trial
from tests.support.flight_records import FIVE_REDUCTIONS

N, K = 5, 3
LAYERS = ["d1/inputs", "d1/outputs", "poison/inputs", "poison/outputs", "d2/inputs", "d2/outputs",
          "d3/inputs", "d3/outputs"]
GRADS = [f"gradients/net/{layer}/{p}Grad" for layer in ("d1", "d2", "d3") for p in ("kernel", "bias")]


class Poison(tf.keras.layers.Layer):
    """Multiplies its input by NaN while ``flag`` is set (a callback sets it at one batch)."""

    def __init__(self, flag: tf.Variable, **kwargs) -> None:
        super().__init__(**kwargs)
        self.flag = flag

    def call(self, x):
        return x * tf.where(self.flag > 0, float("nan"), 1.0)


class PoisonAt(tf.keras.callbacks.Callback):
    """Sets the flag for batch ``at`` only, and keeps each batch's logged loss."""

    def __init__(self, flag: tf.Variable, at: int | None) -> None:
        super().__init__()
        self.flag, self.at, self.losses = flag, at, []

    def on_train_batch_begin(self, batch, logs=None):
        self.flag.assign(1.0 if batch == self.at else 0.0)

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def _fit(out_dir: str, batches: int, poison_at: int | None, config=None, extra=lambda hook: [],
         run_eagerly: bool = False):
    tf.keras.utils.set_random_seed(0)
    flag = tf.Variable(0.0, trainable=False)
    model = tf.keras.Sequential([
        tf.keras.layers.Input((4,)),
        tf.keras.layers.Dense(8, activation="tanh", name="d1"),
        Poison(flag, name="poison"),
        tf.keras.layers.Dense(8, activation="tanh", name="d2"),
        tf.keras.layers.Dense(1, name="d3"),
    ], name="net")
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse", run_eagerly=run_eagerly)
    config = config or smd.FlightRecorderConfig(steps=N, after_steps=K,
                                                collections=["layers", "gradients", "losses"],
                                                reductions=list(FIVE_REDUCTIONS))
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=500),
                         flight_recorder=config)
    x = np.random.default_rng(0).standard_normal((batches * 4, 4)).astype("float32")
    poison = PoisonAt(flag, poison_at)
    model.fit(x, x.sum(1, keepdims=True), batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[poison, hook, *extra(hook)])
    hook.close()
    return hook, poison


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_a_nan_in_the_middle_of_a_keras_model_dumps_the_steps_around_it(tmp_path, run_eagerly):
    poison = random.Random(15).randrange(N + 2, 20)
    out = str(tmp_path / "run")
    _, logged = _fit(out, poison + K + 4, poison, run_eagerly=run_eagerly)
    trial = create_trial(out)
    window = list(range(poison - N, poison + K + 1))
    assert trial.steps() == [0] + window  # save_interval=500 alone keeps step 0 only
    for step in window:  # full resolution: every recorded tensor, every step
        for name in LAYERS + GRADS:
            for red in FIVE_REDUCTIONS:
                assert np.size(trial.tensor(name).reduction_value(step, red)) == 1
        assert trial.tensor("loss").value(step).item() == pytest.approx(logged.losses[step], rel=1e-6,
                                                                          nan_ok=True)
    before, at = poison - 1, poison
    assert all(np.isfinite(trial.tensor(n).reduction_value(before, "max")) for n in LAYERS + GRADS)
    assert np.isfinite(trial.tensor("poison/inputs").reduction_value(at, "max"))
    assert np.isnan(trial.tensor("poison/outputs").reduction_value(at, "max"))
    # the recorder keeps reductions only: no raw values of layers outside saved steps
    assert trial.tensor("d1/outputs").reduction_value(before, "mean") is not None
    (record,) = read_records(open_storage(out))
    (dump,) = record.dumps
    assert (dump.trigger, dump.step, dump.mode, dump.steps_before, dump.steps_after) == (
        "nonfinite", poison, "TRAIN", window[:N], window[N + 1:])
    first = trial.first_nonfinite()
    assert first is not None and first == record.first_nonfinite == dump.first_nonfinite
    assert (first.tensor, first.step, first.mode, first.mode_step, first.worker, first.phase) == (
        "poison/outputs", poison, "TRAIN", poison, "worker_0", "forward")
    assert first.position == 3  # after d1's inputs and outputs and poison's inputs, in call order
    assert first.nonfinite_tensors[:2] == ["poison/outputs", "d2/inputs"]
    assert "gradients/net/d1/kernelGrad" in first.nonfinite_tensors


class DumpAt(tf.keras.callbacks.Callback):
    """Asks ``hook`` for a dump, with ``reason``, at the end of TRAIN batch ``batch``."""

    def __init__(self, hook, batch: int, reason: str):
        super().__init__()
        self.hook, self.batch, self.reason = hook, batch, reason

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            self.hook.dump_flight_recorder(self.reason)


def test_dump_flight_recorder_through_the_keras_front(tmp_path):
    out = str(tmp_path / "run")
    config = smd.FlightRecorderConfig(steps=4, after_steps=2, collections=["losses"])
    _fit(out, 16, None, config=config, extra=lambda hook: [DumpAt(hook, 9, "validation looks odd")])
    (dump,) = read_records(open_storage(out))[0].dumps
    assert (dump.trigger, dump.step, dump.reason) == ("manual", 9, "validation looks odd")
    assert dump.steps_before == [5, 6, 7, 8] and dump.steps_after == [10, 11]
    trial = create_trial(out)
    assert trial.steps() == [0, 5, 6, 7, 8, 9, 10, 11]  # asked for within step 9: written with it
    assert trial.tensor_names(collection="losses") == ["loss"]  # only what it records
    assert trial.first_nonfinite() is None


def test_a_hook_without_recorder_says_how_to_get_one(tmp_path):
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"))
    assert hook.recorder is None
    with pytest.raises(MltraceValueError, match="flight_recorder=FlightRecorderConfig"):
        hook.dump_flight_recorder("why")
    hook.close()


def test_a_budget_too_small_for_the_models_weights_fails_fit_at_once(tmp_path):
    config = smd.FlightRecorderConfig(steps=5, collections=["weights", "gradients"], raw=True,
                                      memory_budget=1000)
    with pytest.raises(MltraceValueError, match=r"memory_budget=1000\) cannot hold one step"):
        _fit(str(tmp_path / "run"), 4, None, config=config)
    # reductions only: the same budget holds a step of the weights' and gradients' reductions
    small = smd.FlightRecorderConfig(steps=5, collections=["weights"], memory_budget=1000)
    hook, _ = _fit(str(tmp_path / "run2"), 4, None, config=small)
    assert hook.recorder is not None and hook.recorder.enabled


def test_a_gradient_tape_loop_in_a_tf_function_records_every_step(tmp_path):
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.layers.Input((3,)), tf.keras.layers.Dense(2, name="d")],
                                name="tape")
    opt = tf.keras.optimizers.SGD(0.1)
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=500),
                         flight_recorder=smd.FlightRecorderConfig(
                             steps=3, after_steps=2, collections=["gradients", "losses"]))
    scale = tf.Variable(1.0)

    @tf.function
    def step(x):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            loss = tf.reduce_mean(tf.square(model(x))) * scale
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    x = tf.constant(np.random.default_rng(1).standard_normal((4, 3)).astype("float32"))
    for i in range(12):
        scale.assign(float("inf") if i == 7 else 1.0)
        step(x)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 4, 5, 6, 7, 8, 9]
    first = trial.first_nonfinite()
    assert first is not None and first.step == 7
    # the tape hands gradients before the loss: the first non-finite is a gradient
    assert first.tensor.startswith("gradients/tape/d/") and "loss" in first.nonfinite_tensors
    assert first.phase == "backward"
    assert np.isinf(trial.tensor("loss").value(7)).all()
    assert np.isfinite(trial.tensor("gradients/tape/d/kernelGrad").reduction_value(6, "max"))


def test_a_session_hook_records_the_tensors_it_fetches(tmp_path):
    out = str(tmp_path / "run")
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([2, 1]))
        loss = tf.compat.v1.losses.mean_squared_error(tf.zeros([4, 1]), tf.matmul(x, w))
        hook = smd.SessionHook(out_dir=out, save_config=smd.SaveConfig(save_interval=500),
                               flight_recorder=smd.FlightRecorderConfig(
                                   steps=3, after_steps=1, collections=["losses", "weights",
                                                                        "gradients"]))
        opt = hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.01))
        train = opt.minimize(loss)
        batch = np.ones((4, 2), np.float32)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
            for i in range(10):
                sess.run(train, feed_dict={x: batch * (np.nan if i == 6 else 1.0)})
    hook.close()
    trial = create_trial(out)
    assert trial.steps() == [0, 3, 4, 5, 6, 7]
    first = trial.first_nonfinite()
    assert first is not None and first.step == 6
    loss_name = trial.tensor_names(collection="losses")[0]
    assert np.isnan(trial.tensor(loss_name).value(6)).all()
    assert np.isfinite(trial.tensor("w:0").reduction_value(5, "max"))


def test_the_recorder_skips_what_has_no_reduction():
    adapter = smd.KerasHook._adapter_class()
    assert adapter.recordable(tf.ones([2, 3])) and adapter.recordable(tf.keras.Variable([1.0]))
    assert adapter.recordable(np.float32(1.5)) and adapter.recordable(3)
    assert not adapter.recordable(tf.zeros([0, 3]))  # empty: no min, no max
    assert not adapter.recordable(tf.constant(["a"]))
    assert adapter.shape_and_dtype(tf.keras.Variable(np.ones((2, 2), np.float16))) == (
        (2, 2), np.float16)
    assert adapter.shape_and_dtype(7) == ((1,), np.dtype(np.int64))  # as saved: shape [1]


_RAISING_FIT = """
import sys
import numpy as np
import tensorflow as tf
import mltrace.tensorflow as smd

class Fail(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 12:
            raise RuntimeError("injected failure at batch 12")

tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(3, name="d1"),
                             tf.keras.layers.Dense(1, name="d2")], name="net")
model.compile(optimizer="sgd", loss="mse")
hook = smd.KerasHook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=500),
                     flight_recorder=smd.FlightRecorderConfig(steps=4, after_steps=2,
                                                              collections=["losses", "layers"]))
x = np.random.default_rng(0).standard_normal((80, 4)).astype("float32")
model.fit(x, x[:, :1], batch_size=4, verbose=0, callbacks=[hook, Fail()])
"""


def test_an_exception_escaping_fit_dumps_before_exit(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(_RAISING_FIT)
    out = str(tmp_path / "run")
    done = subprocess.run([sys.executable, str(script), out], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1 and "injected failure at batch 12" in done.stderr
    (dump,) = read_records(open_storage(out))[0].dumps
    assert dump.trigger == "exception" and "RuntimeError: injected failure" in dump.reason
    assert (dump.step, dump.steps_before) == (12, [8, 9, 10, 11])
    trial = create_trial(out)
    assert trial.steps() == [0, 8, 9, 10, 11, 12]
    assert np.size(trial.tensor("d1/outputs").reduction_value(12, "max")) == 1


def test_the_json_config_gives_tensorflow_and_xgboost_hooks_a_recorder(tmp_path):
    path = tmp_path / "config.json"
    for name, cls in (("keras", smd.KerasHook), ("session", smd.SessionHook),
                      ("xgboost", smd_xgb.Hook)):
        path.write_text(json.dumps({"LocalPath": str(tmp_path / name), "FlightRecorder": {
            "steps": "12", "collections": "losses", "loss_spike": "none"}}))
        hook = cls.create_from_json_file(str(path))
        assert hook.recorder is not None
        config = hook.recorder.config
        assert (config.steps, config.collections, config.loss_spike) == (12, ["losses"], None)
        hook.close()


def test_a_dump_keeps_what_a_saved_step_in_its_window_holds(tmp_path):
    # Step 0 is saved (weights and losses); the recorder keeps losses only. A dump whose window
    # starts at step 0 must not write step 0 again (that would replace its file, and its
    # weights with it).
    out = str(tmp_path / "run")
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(3, name="d1")],
                                name="net")
    model.compile(optimizer="sgd", loss="mse")
    hook = smd.KerasHook(out_dir=out, save_config=smd.SaveConfig(save_interval=500),
                         include_collections=["weights", "losses"],
                         flight_recorder=smd.FlightRecorderConfig(steps=10, after_steps=1,
                                                                  collections=["losses"]))
    x = np.random.default_rng(0).standard_normal((40, 4)).astype("float32")
    model.fit(x, x[:, :3], batch_size=4, verbose=0, callbacks=[hook, DumpAt(hook, 5, "look")])
    hook.close()
    (dump,) = read_records(open_storage(out))[0].dumps
    assert dump.steps_before == [0, 1, 2, 3, 4]
    trial = create_trial(out)
    assert trial.steps() == list(range(7))
    assert trial.tensor("d1/weights/net/d1/kernel:0").steps() == [0]  # saved at 0, still there
    assert trial.tensor("loss").steps() == list(range(7))


_MIRRORED_FIT = """
import sys
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import mltrace.tensorflow as smd

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)),
                                 tf.keras.layers.Dense(3, activation="tanh", name="d1"),
                                 tf.keras.layers.Dense(2, name="d2")], name="net")
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
hook = smd.KerasHook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=500),
                     flight_recorder=smd.FlightRecorderConfig(
                         steps=3, after_steps=1, collections=["layers", "gradients", "losses"]))
x = np.random.default_rng(0).standard_normal((48, 4)).astype("float32")
x[28:30] = np.nan  # batch 7's first half: replica 0's share of it
model.fit(x, x[:, :2], batch_size=4, verbose=0, shuffle=False, callbacks=[hook])
hook.close()
"""


def test_under_mirrored_strategy_replica_0s_values_are_recorded(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(_MIRRORED_FIT)
    out = str(tmp_path / "run")
    done = subprocess.run([sys.executable, str(script), out], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    trial = create_trial(out)
    assert trial.steps() == [0, 4, 5, 6, 7, 8]
    first = trial.first_nonfinite()
    assert first is not None
    assert (first.tensor, first.step, first.phase, first.position) == ("d1/inputs", 7, "forward", 0)
    assert np.isfinite(trial.tensor("d1/inputs").reduction_value(6, "max"))
    assert np.isnan(trial.tensor("d1/inputs").reduction_value(7, "max"))


def test_a_steps_reductions_reach_the_host_flat_as_numpy_defines_them():
    from mltrace.capture.recording_adapter import RecordingAdapter
    from mltrace.reductions import compute

    adapter = smd.KerasHook._adapter_class()
    items = [("min", False), ("max", False), ("mean", False), ("std", False), ("l2", False),
             ("max", True), ("nan_count", False)]
    rng = np.random.default_rng(3)
    poisoned = rng.standard_normal((5, 4)).astype("float32")
    poisoned[2, 1] = np.nan
    values = [tf.constant(rng.standard_normal((3, 4)).astype("float32")), tf.constant(poisoned),
              tf.constant(np.arange(6, dtype=np.int32)), tf.keras.Variable(np.ones(3, np.float16))]
    started = [adapter.reduce_on_device(v, items) for v in values]
    flat = adapter.reductions_to_flat(started)
    assert flat.dtype == np.float64 and flat.shape == (len(values) * len(items),)
    np.testing.assert_array_equal(flat, RecordingAdapter.reductions_to_flat(adapter, started))
    expected = [float(compute(n, np.asarray(v), a)) for v in values for n, a in items]
    np.testing.assert_allclose(flat, expected, rtol=1e-6)  # NaN where numpy has NaN
