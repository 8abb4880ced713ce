"""Keras 3 ``model.fit`` / ``evaluate`` / ``predict`` with mltrace's KerasHook (seed 003's "Run
Debugger locally"), then a look at the trial.

A small classifier (28x28 inputs -> Dense 64 relu -> Dense 10) trains on random synthetic data
(offline, CPU). The hook is a Keras callback: it sets the modes itself (TRAIN in fit, EVAL in
evaluate and validation, PREDICT in predict) and, beyond the losses and metrics it always saves,
saves weights, biases and gradients every ``--save-interval`` steps. Gradients come from where
Keras 3 applies them (the optimizer); ``hook.wrap_optimizer`` is optional with fit.

Example (from the repository root):
    python examples/tensorflow/keras_fit.py --out-dir ./demo-output/keras_fit
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import mltrace.tensorflow as smd


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default="./demo-output/keras_fit")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-interval", type=int, default=10)
    args = parser.parse_args(argv)

    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x_train = rng.random((640, 28, 28), dtype=np.float32)
    y_train = rng.integers(0, 10, 640)
    x_test, y_test = x_train[:128], y_train[:128]

    hook = smd.KerasHook(
        out_dir=args.out_dir,
        save_config=smd.SaveConfig(save_interval=args.save_interval),
        include_collections=["weights", "biases", "gradients", "losses", "metrics"],
    )
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
    # Add the hook as a callback (seed 003).
    model.fit(
        x_train,
        y_train,
        batch_size=32,
        epochs=args.epochs,
        validation_split=0.1,
        verbose=0,
        callbacks=[hook],
    )
    model.evaluate(x_test, y_test, verbose=0, callbacks=[hook])
    model.predict(x_test[:32], verbose=0, callbacks=[hook])
    hook.close()

    # Create a trial to inspect the saved tensors.
    trial = smd.create_trial(out_dir=args.out_dir)
    print(f"Saved these tensors: {trial.tensor_names()}")
    print(f"Loss values during evaluation were {trial.tensor('loss').values(mode=smd.modes.EVAL)}")
    for name in trial.tensor_names(collection="gradients"):
        norms = [
            float(np.linalg.norm(trial.tensor(name).value(s))) for s in trial.tensor(name).steps()
        ]
        print(f"{name}: l2 norm over saved steps {np.round(norms, 4).tolist()}")
    return args.out_dir


if __name__ == "__main__":
    main()
    sys.exit(0)
