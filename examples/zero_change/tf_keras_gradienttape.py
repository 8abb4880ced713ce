"""examples/tensorflow/tf_keras_gradienttape.py with its mltrace lines removed: a plain
GradientTape training loop.

Run it under ``mltrace run`` with tf_keras_gradienttape.json (the original's hook in smdebug's
configuration format). Each ``tf.GradientTape`` the loop creates outside Keras's own
fit/evaluate/predict is wrapped as ``hook.wrap_tape`` wraps it (entering it begins a TRAIN step;
``tape.gradient`` saves the gradients, the weights they are taken of and the loss), and each Keras
optimizer as ``hook.wrap_optimizer`` wraps it::

    mltrace run --config examples/zero_change/tf_keras_gradienttape.json \\
        examples/zero_change/tf_keras_gradienttape.py

The original's ``hook.record_tensor_value("accuracy", ...)`` saves a value only the script
computes: no hook can find it, so this trial has everything the original's has but ``accuracy``.
tests/launch/test_launch_examples.py checks exactly that.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A GradientTape loop, no mltrace lines")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--tf-function", action="store_true")
    args = parser.parse_args(argv)

    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.random((320, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, 320)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)

    model = tf.keras.models.Sequential(
        [
            tf.keras.layers.Input((28, 28)),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    cce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = tf.keras.optimizers.Adam(0.001)
    train_acc_metric = tf.keras.metrics.SparseCategoricalAccuracy()

    def train_step(data, labels):
        with tf.GradientTape(persistent=True) as tape:
            logits = model(data, training=True)  # (32,10)
            loss_value = cce(labels, logits)
        grads = tape.gradient(loss_value, model.variables)
        opt.apply_gradients(zip(grads, model.variables))
        return logits

    if args.tf_function:
        train_step = tf.function(train_step)
    for _ in range(args.epochs):
        for data, labels in dataset:
            logits = train_step(data, labels)
            train_acc_metric(labels, logits)
    print(f"training accuracy: {float(train_acc_metric.result()):.3f}")


if __name__ == "__main__":
    main()
    sys.exit(0)
