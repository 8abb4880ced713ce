"""mltrace.tensorflow.KerasHook with Keras 3 fit / evaluate / predict: round trips through
create_trial compared with values captured in the process (compiled and eager), smdebug's names
and collections, XLA, reductions with TF ops, custom collections, failure isolation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import mltrace.tensorflow as smd
from mltrace.exceptions import MltraceTypeError
from mltrace.modes import ModeKeys
from mltrace.reductions import compute
from mltrace.tensorflow._tensors import reduce_on_device
from mltrace.trials import create_trial

LR = 0.1
TRAIN, EVAL, PREDICT = ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT


def _data(n: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 4)).astype("float32"), rng.standard_normal((n, 2)).astype(
        "float32"
    )


def _model(run_eagerly: bool = False, jit_compile: bool | str = "auto") -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((4,)),
            tf.keras.layers.Dense(3, activation="relu", name="d1"),
            tf.keras.layers.Dense(2, name="d2"),
        ],
        name="net",
    )  # variable paths (net/d1/kernel) name the model: fix it
    model.compile(
        optimizer=tf.keras.optimizers.SGD(LR, name="sgd"),
        loss="mse",
        metrics=["mae"],
        run_eagerly=run_eagerly,
        jit_compile=jit_compile,
    )
    return model


class Recorder(tf.keras.callbacks.Callback):
    """Captures, beside the hook, what each step must hold: weights before and after it, logs."""

    def __init__(self) -> None:
        super().__init__()
        self.pre: list[dict[str, np.ndarray]] = []
        self.post: list[dict[str, np.ndarray]] = []
        self.logs: dict[ModeKeys, list[dict[str, float]]] = {TRAIN: [], EVAL: []}
        self.epoch_logs: list[dict[str, float]] = []

    def _weights(self) -> dict[str, np.ndarray]:
        return {v.path: v.numpy().copy() for v in self.model.weights}

    def on_train_batch_begin(self, batch, logs=None):
        self.pre.append(self._weights())

    def on_train_batch_end(self, batch, logs=None):
        self.post.append(self._weights())
        self.logs[TRAIN].append(dict(logs))

    def on_test_batch_end(self, batch, logs=None):
        self.logs[EVAL].append(dict(logs))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


ALL_COLLECTIONS = [
    "weights",
    "biases",
    "gradients",
    "optimizer_variables",
    "layers",
    "inputs",
    "outputs",
]


@pytest.fixture(scope="module", params=[False, True], ids=["compiled", "eager"])
def fit_run(request, tmp_path_factory):
    """Two epochs of 3 steps with validation, then predict; every collection, every step."""
    out_dir = tmp_path_factory.mktemp("keras_fit") / "run"
    x, y = _data()
    model = _model(run_eagerly=request.param)
    hook = smd.KerasHook(
        out_dir=str(out_dir),
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=ALL_COLLECTIONS,
    )
    rec = Recorder()
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        shuffle=False,
        verbose=0,
        validation_data=(x[:4], y[:4]),
        callbacks=[hook, rec],
    )
    predictions = model.predict(x[:4], batch_size=4, verbose=0, callbacks=[hook])
    hook.close()
    return create_trial(str(out_dir)), rec, x, y, predictions


def _value(trial, name, step, mode=TRAIN):
    return trial.tensor(name).value(step, mode=mode)


def test_keras_fit_steps_and_names_follow_smdebug(fit_run):
    trial, *_ = fit_run
    assert trial.steps(mode=TRAIN) == list(range(6))
    assert trial.steps(mode=EVAL) == [0, 1]
    assert trial.steps(mode=PREDICT) == [0]
    names = set(trial.tensor_names())
    assert {
        "loss",
        "mae",
        "batch",
        "val_loss",
        "val_mae",
        "inputs",
        "labels",
        "predictions",
        "d1/inputs",
        "d1/outputs",
        "d2/outputs",
        "d1/weights/net/d1/kernel:0",
        "d2/weights/net/d2/bias:0",
        "gradients/net/d1/kernelGrad",
        "gradients/net/d2/biasGrad",
        "sgd/iteration:0",
    } <= names
    assert trial.tensor_names(collection="weights") == [
        "d1/weights/net/d1/kernel:0",
        "d2/weights/net/d2/kernel:0",
    ]
    assert set(trial.tensor_names(collection="gradients")) == {
        f"gradients/net/{layer}/{kind}Grad" for layer in ("d1", "d2") for kind in ("kernel", "bias")
    }
    assert set(trial.tensor_names(collection="losses")) == {"loss", "val_loss"}
    assert {"mae", "val_mae", "batch"} <= set(trial.tensor_names(collection="metrics"))
    assert set(trial.tensor_names(collection="layers")) == {
        f"{layer}/{kind}" for layer in ("d1", "d2") for kind in ("inputs", "outputs")
    }
    assert set(trial.tensor_names(collection="outputs")) == {"labels", "predictions"}
    # Gradients and optimizer variables exist in TRAIN only.
    assert trial.tensor("gradients/net/d1/kernelGrad").steps(mode=EVAL) == []
    assert trial.tensor("sgd/iteration:0").steps(mode=EVAL) == []


def test_keras_fit_values_match_the_process(fit_run):
    trial, rec, x, y, _ = fit_run
    for step in range(6):
        pre, post = rec.pre[step], rec.post[step]
        batch = slice((step % 3) * 4, (step % 3) * 4 + 4)
        for layer in ("d1", "d2"):
            for kind in ("kernel", "bias"):
                path = f"net/{layer}/{kind}"
                # weights are read after the step (smdebug's Keras hook); SGD: w' = w - lr * g
                np.testing.assert_array_equal(
                    _value(trial, f"{layer}/weights/{path}:0", step), post[path]
                )
                np.testing.assert_allclose(
                    _value(trial, f"gradients/{path}Grad", step),
                    (pre[path] - post[path]) / LR,
                    rtol=1e-4,
                    atol=1e-5,
                )
        np.testing.assert_array_equal(_value(trial, "inputs", step), x[batch])
        np.testing.assert_array_equal(_value(trial, "labels", step), y[batch])
        hidden = np.maximum(x[batch] @ pre["net/d1/kernel"] + pre["net/d1/bias"], 0)
        np.testing.assert_allclose(_value(trial, "d1/outputs", step), hidden, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(
            _value(trial, "d2/inputs", step), _value(trial, "d1/outputs", step)
        )
        np.testing.assert_array_equal(
            _value(trial, "predictions", step), _value(trial, "d2/outputs", step)
        )
        loss = _value(trial, "loss", step)
        assert loss.shape == () and loss.dtype == np.float32
        assert float(loss) == np.float32(rec.logs[TRAIN][step]["loss"])
        assert float(_value(trial, "mae", step)) == np.float32(rec.logs[TRAIN][step]["mae"])
        assert _value(trial, "batch", step).tolist() == [step % 3]
        assert _value(trial, "sgd/iteration:0", step).tolist() == step + 1
    for epoch in range(2):
        assert float(_value(trial, "loss", epoch, EVAL)) == np.float32(
            rec.logs[EVAL][epoch]["loss"]
        )
        # smdebug writes the epoch's logs (val_*) at the step the epoch ends with
        assert float(_value(trial, "val_loss", epoch, EVAL)) == np.float32(
            rec.epoch_logs[epoch]["val_loss"]
        )


def test_keras_predict_mode_saves_the_predictions(fit_run):
    trial, _, x, _, predictions = fit_run
    np.testing.assert_allclose(_value(trial, "predictions", 0, PREDICT), predictions, rtol=1e-6)
    np.testing.assert_array_equal(_value(trial, "inputs", 0, PREDICT), x[:4])
    assert trial.tensor("labels").steps(mode=PREDICT) == []
    assert trial.tensor("loss").steps(mode=PREDICT) == []


def test_keras_default_collections_are_metrics_and_losses(tmp_path):
    x, y = _data()
    model = _model()
    hook = smd.KerasHook(out_dir=str(tmp_path / "a"), save_config=smd.SaveConfig(save_interval=1))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hook])
    hook.close()
    trial = create_trial(str(tmp_path / "a"))
    assert set(trial.tensor_names()) == {"loss", "mae", "batch"}
    assert trial.steps(mode=TRAIN) == [0, 1, 2]
    collections = json.loads(
        (tmp_path / "a/collections/000000000/worker_0_collections.json").read_text()
    )
    assert {
        "metrics",
        "losses",
        "sm_metrics",
        "weights",
        "gradients",
        "layers",
        "optimizer_variables",
    } <= set(collections["collections"])

    # Seed 004: metrics are switched off with end_step = 0.
    model = _model()
    hook = smd.KerasHook(out_dir=str(tmp_path / "b"), save_config=smd.SaveConfig(save_interval=1))
    hook.get_collection("metrics").save_config.end_step = 0
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hook])
    hook.close()
    assert create_trial(str(tmp_path / "b")).tensor_names() == ["loss"]


def test_keras_xla_model_keeps_xla_on_steps_that_capture_nothing(tmp_path, caplog):
    x, y = _data()
    model = _model(jit_compile=True)
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=2),
                         include_collections=["gradients"])
    rec = Recorder()
    with caplog.at_level("INFO", logger="mltrace.tensorflow.keras"):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[hook, rec])
    hook.close()
    assert model.jit_compile is True  # only the capturing version of the step is built without it
    assert "run without XLA" in caplog.text
    trial = create_trial(str(tmp_path / "run"))
    grad = trial.tensor("gradients/net/d1/kernelGrad")
    assert grad.steps(mode=TRAIN) == [0, 2]
    for step in (0, 2):
        pre, post = rec.pre[step]["net/d1/kernel"], rec.post[step]["net/d1/kernel"]
        np.testing.assert_allclose(grad.value(step), (pre - post) / LR, rtol=1e-4, atol=1e-5)
    assert trial.tensor("loss").steps(mode=TRAIN) == [0, 2]


def test_keras_reductions_are_numpys_definitions(tmp_path):
    x, y = _data()
    model = _model()
    hook = smd.KerasHook(
        out_dir=str(tmp_path / "run"),
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients"],
        reduction_config=smd.ReductionConfig(
            reductions=[
                "min",
                "max",
                "mean",
                "std",
                "variance",
                "sum",
                "prod",
                "median",
                "nan_count",
                "zero_fraction",
            ],
            abs_reductions=["max", "mean"],
            norms=["l1", "l2"],
            save_raw_tensor=True,
        ),
    )
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hook])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    checked = 0
    for name in ("d1/weights/net/d1/kernel:0", "gradients/net/d2/kernelGrad"):
        tensor = trial.tensor(name)
        for step in (0, 2):
            raw = tensor.value(step, mode=TRAIN)
            for red, abs_ in [
                (r, False)
                for r in (
                    "min",
                    "max",
                    "mean",
                    "std",
                    "variance",
                    "sum",
                    "prod",
                    "median",
                    "nan_count",
                    "zero_fraction",
                    "l1",
                    "l2",
                )
            ] + [("max", True), ("mean", True)]:
                stored = tensor.reduction_value(step, red, abs=abs_, mode=TRAIN)
                np.testing.assert_allclose(
                    stored,
                    compute(red, raw, abs_),
                    rtol=2e-6,
                    atol=1e-7,
                    err_msg=f"{name} {red} abs={abs_}",
                )
                checked += 1
    assert checked == 56


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "bool", "float64"])
def test_tf_reductions_on_device_match_numpy(dtype):
    values = np.array([[1.5, -2.0, 0.0], [3.25, 0.0, -0.5]])
    tensor = tf.cast(tf.constant(values), dtype)
    items = [
        (r, False)
        for r in (
            "min",
            "max",
            "mean",
            "std",
            "variance",
            "sum",
            "prod",
            "median",
            "l1",
            "l2",
            "nan_count",
            "inf_count",
            "zero_fraction",
        )
    ] + [("min", True)]
    reference = tensor.numpy()
    for (name, abs_), got in zip(items, reduce_on_device(tensor, items)):
        np.testing.assert_allclose(
            got,
            compute(name, reference, abs_),
            rtol=1e-3 if "16" in dtype else 1e-6,
            err_msg=f"{dtype} {name}",
        )
    with_nan = tf.constant([1.0, np.nan, np.inf, 0.0])
    counts = reduce_on_device(with_nan, [("nan_count", False), ("inf_count", False)])
    assert [int(c) for c in counts] == [1, 1] and counts[0].dtype == np.int64


def test_keras_custom_collections_variables_and_layers(tmp_path):
    x, y = _data()
    model = _model()
    d1 = model.get_layer("d1")
    # Seed 000: collections configured before the hook exists are handed to it.
    smd.get_collection("kernels").add(d1.kernel)
    hook = smd.KerasHook(
        out_dir=str(tmp_path / "run"),
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["kernels", "d1_io", "bias2"],
    )
    hook.get_collection("d1_io").add_keras_layer(d1, inputs=True, outputs=True)
    hook.add_to_collection("bias2", model.get_layer("d2").bias)  # seed 004
    with pytest.raises(MltraceTypeError, match="save_tensor"):
        hook.get_collection("bias2").add(tf.constant(1.0))
    rec = Recorder()
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[hook, rec])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(collection="kernels") == ["net/d1/kernel:0"]
    assert trial.tensor_names(collection="d1_io") == ["d1/inputs", "d1/outputs"]
    assert trial.tensor_names(collection="bias2") == ["net/d2/bias:0"]
    assert "d2/outputs" not in trial.tensor_names()  # only the layer asked for is captured
    assert not any("/weights/" in n for n in trial.tensor_names())
    for step in range(3):
        np.testing.assert_array_equal(
            _value(trial, "net/d1/kernel:0", step), rec.post[step]["net/d1/kernel"]
        )
        np.testing.assert_array_equal(
            _value(trial, "net/d2/bias:0", step), rec.post[step]["net/d2/bias"]
        )
        np.testing.assert_array_equal(_value(trial, "d1/inputs", step), x[step * 4 : step * 4 + 4])


def test_keras_layers_collection_filters_by_layer_name_as_smdebug(tmp_path):
    x, y = _data()
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["layers"])
    hook.get_collection("layers").include("^d2$")  # smdebug: a regex over layer names
    _model().fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hook])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names() == ["batch", "d2/inputs", "d2/outputs", "loss", "mae"]
    np.testing.assert_array_equal(trial.tensor("d2/inputs").value(1).shape, (4, 3))


def test_keras_saving_after_fit_goes_to_a_new_step(tmp_path):
    x, y = _data()
    model = _model()
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hook])
    # fit's last step is readable before close (as smdebug flushed after training)
    assert create_trial(str(tmp_path / "run")).steps(mode=TRAIN) == [0, 1, 2]
    hook.save_scalar("final_accuracy", 0.75)
    hook.save_tensor("confusion", np.eye(2), "custom")
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps(mode=TRAIN) == [0, 1, 2, 3]
    assert trial.tensor("loss").steps(mode=TRAIN) == [0, 1, 2]  # step 2's files were not replaced
    assert trial.tensor("scalar/final_accuracy").value(3, mode=TRAIN).tolist() == [0.75]
    np.testing.assert_array_equal(trial.tensor("confusion").value(3, mode=TRAIN), np.eye(2))
    assert trial.tensor_names(collection="custom") == ["confusion"]


def test_keras_hook_error_never_stops_training(tmp_path, monkeypatch, caplog):
    x, y = _data()
    model = _model()
    hook = smd.KerasHook(
        out_dir=str(tmp_path / "run"),
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["gradients"],
    )

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(hook.core.outputs, "write_tensor", broken)
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[hook])
    assert len(history.history["loss"]) == 2
    assert hook.disabled and "disk on fire" in caplog.text
    hook.close()

    strict = smd.KerasHook(
        out_dir=str(tmp_path / "strict"), save_config=smd.SaveConfig(save_interval=1), strict=True
    )
    monkeypatch.setattr(strict.core.outputs, "write_tensor", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        _model().fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[strict])


def test_keras_hook_from_smdebug_json_and_seed_names(tmp_path):
    config = {
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "2", "reductions": "max,l2_norm"},
        "CollectionConfigurations": [{"CollectionName": "gradients"}, {"CollectionName": "losses"}],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    hook = smd.KerasHook.create_from_json_file(str(path))
    assert smd.get_hook() is hook and smd.get_collection("gradients") is hook.get_collection(
        "gradients"
    )
    x, y = _data()
    _model().fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hook])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    grad = trial.tensor("gradients/net/d1/kernelGrad")
    assert grad.steps(mode=TRAIN) == [0, 2]
    assert grad.reduction_value(2, "max", mode=TRAIN) is not None
    # Seed 000's TensorFlow names import.
    from mltrace.tensorflow import (  # noqa: F401
        SaveConfigMode,
        TornasoleHook,
        get_collection,
        modes,
    )

    assert smd.Hook is smd.KerasHook and smd.EstimatorHook is smd.SessionHook


def test_keras_rule_stop_signal_ends_fit_and_close_restores_the_model(tmp_path):
    from mltrace.format import paths

    out = tmp_path / "run"
    out.mkdir()
    x, y = _data()
    model = _model()
    hook = smd.KerasHook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["gradients", "layers"], stop_check_interval=0)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hook])
    assert "apply" in vars(model.optimizer) and "call" in vars(model.get_layer("d1"))
    # A rule's StopTraining action writes this file: the next batch is the last one.
    (out / paths.STOP_SIGNAL_FILE).write_text(json.dumps({"rule": "LossNotDecreasing", "step": 2}))
    history = model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[hook])
    assert len(history.history["loss"]) == 1 and hook.stop_requested["rule"] == "LossNotDecreasing"
    hook.close()
    assert create_trial(str(out)).steps(mode=TRAIN) == [0, 1, 2, 3]
    # close() leaves the model as it found it: no patched methods, functions traced again
    assert "apply" not in vars(model.optimizer) and "call" not in vars(model.get_layer("d1"))
    assert model.train_function is None
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
