"""examples/tensorflow/keras_fit.py with its mltrace lines removed: plain Keras 3.

Run it under ``mltrace run`` with keras_fit.json (the original's hook in smdebug's configuration
format): fit, evaluate and predict get the hook as a callback, as the original passes it::

    mltrace run --config examples/zero_change/keras_fit.json examples/zero_change/keras_fit.py

tests/launch/test_launch_examples.py checks that it leaves the trial the original leaves.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Keras fit/evaluate/predict, no mltrace lines")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)

    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x_train = rng.random((640, 28, 28), dtype=np.float32)
    y_train = rng.integers(0, 10, 640)
    x_test, y_test = x_train[:128], y_train[:128]

    model = tf.keras.models.Sequential(
        [
            tf.keras.layers.Input((28, 28)),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x_train, y_train, batch_size=32, epochs=args.epochs, validation_split=0.1, verbose=0)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    model.predict(x_test[:32], verbose=0)
    print(f"evaluation: loss {loss:.4f}, accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
    sys.exit(0)
