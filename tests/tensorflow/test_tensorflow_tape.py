"""KerasHook with GradientTape loops exactly as seed 003 writes them (hook.wrap_tape,
hook.wrap_optimizer, hook.record_tensor_value), eagerly and inside tf.function: the trial holds
what the loop computed."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mltrace.tensorflow as smd
from mltrace.exceptions import MltraceTypeError
from mltrace.modes import ModeKeys
from mltrace.trials import create_trial

TRAIN = ModeKeys.TRAIN


def _setup(
    tmp_path, include=("weights", "biases", "gradients", "losses", "metrics", "optimizer_variables")
):
    tf.keras.utils.set_random_seed(1)
    hook = smd.KerasHook(
        out_dir=str(tmp_path / "run"),
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=list(include),
    )
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((4,)),
            tf.keras.layers.Dense(5, activation="relu", name="h"),
            tf.keras.layers.Dense(3, name="logits"),
        ],
        name="tape_net",
    )
    opt = hook.wrap_optimizer(tf.keras.optimizers.Adam(0.01, name="adam"))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 4)).astype("float32")
    y = rng.integers(0, 3, 8)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    return hook, model, opt, dataset


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_tape_loop_of_seed_003_round_trip(tmp_path, compiled):
    hook, model, opt, dataset = _setup(tmp_path)
    cce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    train_acc_metric = tf.keras.metrics.SparseCategoricalAccuracy()

    def train_step(data, labels):  # seed 003, with its values returned for the comparison
        with hook.wrap_tape(tf.GradientTape(persistent=True)) as tape:
            logits = model(data, training=True)
            loss_value = cce(labels, logits)
        grads = tape.gradient(loss_value, model.variables)
        opt.apply_gradients(zip(grads, model.variables))
        return logits, loss_value, grads

    if compiled:
        train_step = tf.function(train_step)
    expected = []
    for _epoch in range(2):
        for data, labels in dataset:
            before = {v.path: v.numpy().copy() for v in model.variables}
            logits, loss_value, grads = train_step(data, labels)
            acc = train_acc_metric(labels, logits)
            hook.record_tensor_value(tensor_name="accuracy", tensor_value=acc)
            expected.append(
                {
                    "before": before,
                    "loss": loss_value.numpy(),
                    "acc": acc.numpy(),
                    "grads": {v.path: g.numpy() for v, g in zip(model.variables, grads)},
                    "opt": {v.path: v.numpy().copy() for v in opt.variables},
                }
            )
    hook.close()

    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps(mode=TRAIN) == [0, 1, 2, 3]
    paths = [f"tape_net/{layer}/{kind}" for layer in ("h", "logits") for kind in ("kernel", "bias")]
    assert set(trial.tensor_names(collection="gradients")) == {f"gradients/{p}Grad" for p in paths}
    assert trial.tensor_names(collection="weights") == [
        "weights/tape_net/h/kernel:0",
        "weights/tape_net/logits/kernel:0",
    ]
    assert set(trial.tensor_names(collection="biases")) >= {
        "weights/tape_net/h/bias:0",
        "weights/tape_net/logits/bias:0",
    }
    assert trial.tensor_names(collection="losses") == ["loss"]
    assert trial.tensor_names(collection="metrics") == ["accuracy"]
    assert "adam/tape_net_h_kernel_momentum:0" in trial.tensor_names(
        collection="optimizer_variables"
    )
    for step, exp in enumerate(expected):
        for p in paths:
            np.testing.assert_array_equal(
                trial.tensor(f"gradients/{p}Grad").value(step), exp["grads"][p]
            )
            # weights are those the gradient was taken of (before the update)
            np.testing.assert_array_equal(
                trial.tensor(f"weights/{p}:0").value(step), exp["before"][p]
            )
        assert trial.tensor("loss").value(step).item() == exp["loss"].item()
        assert trial.tensor("accuracy").value(step).item() == exp["acc"].item()
        # optimizer variables after the step's update
        momentum = "adam/tape_net_logits_kernel_momentum:0"
        np.testing.assert_array_equal(
            trial.tensor(momentum).value(step), exp["opt"]["adam/tape_net_logits_kernel_momentum"]
        )
        assert trial.tensor("adam/iteration:0").value(step).item() == step + 1
    collections = trial.collections()
    assert "^weights/.*/((?!bias).)*$" in collections["weights"].include_regex
    assert ".*loss.*" in collections["losses"].include_regex


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_tape_loop_saves_layers_of_a_registered_model_every_other_step(tmp_path, compiled):
    hook, model, opt, dataset = _setup(tmp_path, include=["layers", "gradients"])
    hook.get_collection("layers").save_config = smd.SaveConfig(save_interval=2)
    hook.register_model(model)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train_step(data, labels):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            loss = loss_fn(labels, model(data, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    if compiled:
        train_step = tf.function(train_step)
    inputs = []
    for _ in range(2):
        for data, labels in dataset:
            inputs.append(data.numpy())
            train_step(data, labels)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert set(trial.tensor_names(collection="layers")) == {
        "h/inputs",
        "h/outputs",
        "logits/inputs",
        "logits/outputs",
    }
    assert trial.tensor("h/inputs").steps(mode=TRAIN) == [0, 2]
    assert trial.tensor("gradients/tape_net/h/kernelGrad").steps(mode=TRAIN) == [0, 1, 2, 3]
    for step in (0, 2):
        np.testing.assert_array_equal(trial.tensor("h/inputs").value(step), inputs[step])
        np.testing.assert_array_equal(
            trial.tensor("logits/inputs").value(step), trial.tensor("h/outputs").value(step)
        )


def test_tape_save_tensor_inside_tf_function_and_bad_arguments(tmp_path):
    hook, model, opt, dataset = _setup(tmp_path, include=["losses"])

    @tf.function
    def step(data):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            out = model(data)
            loss = tf.reduce_mean(out * out)
        hook.save_tensor("mean_output", tf.reduce_mean(out), "custom")
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(out)

    means = [step(data).numpy() for data, _ in dataset]
    with pytest.raises(MltraceTypeError, match="GradientTape"):
        hook.wrap_tape(object())
    with pytest.raises(MltraceTypeError, match="Keras 3 optimizer"):
        hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(collection="custom") == ["mean_output"]
    assert [trial.tensor("mean_output").value(s).item() for s in (0, 1)] == [
        m.item() for m in means
    ]
    assert trial.tensor("loss").steps(mode=TRAIN) == [0, 1]
