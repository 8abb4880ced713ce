"""Run by tests/tensorflow/test_tensorflow_mirrored.py in a fresh process (TensorFlow's logical devices can
only be set before it starts): Keras fit under MirroredStrategy on two logical CPUs with a
KerasHook, then prints, as JSON, what the test compares the trial with."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

LR = 0.1


def _model() -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((4,)),
            tf.keras.layers.Dense(3, activation="relu", name="d1"),
            tf.keras.layers.Dense(2, name="d2"),
        ],
        name="net",
    )
    model.compile(optimizer=tf.keras.optimizers.SGD(LR), loss="mse")
    return model


def main(out_dir: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import mltrace.tensorflow as smd

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = _model()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((24, 4)).astype("float32")
    y = rng.standard_normal((24, 2)).astype("float32")
    hook = smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "losses", "layers"],
    )
    weights, local_grads = [], []

    class Weights(tf.keras.callbacks.Callback):
        """The d1 kernel before each step and after the last, and each replica's local d1 kernel
        gradient at the step's weights (Keras scales a replica's mean loss by 1/replicas)."""

        def on_train_batch_begin(self, batch, logs=None):
            kernel = self.model.get_layer("d1").kernel
            weights.append(kernel.numpy().tolist())
            halves = []
            for half in (slice(batch * 8, batch * 8 + 4), slice(batch * 8 + 4, batch * 8 + 8)):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(self.model(x[half]) - y[half])) / 2
                halves.append(tape.gradient(loss, kernel).numpy().tolist())
            local_grads.append(halves)

        def on_train_end(self, logs=None):
            weights.append(self.model.get_layer("d1").kernel.numpy().tolist())

    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                        callbacks=[hook, Weights()])
    hook.close()
    json.dump({"replicas": strategy.num_replicas_in_sync, "x": x.tolist(), "y": y.tolist(),
               "d1_kernel": weights, "local_grads": local_grads, "loss": history.history["loss"]},
              sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
