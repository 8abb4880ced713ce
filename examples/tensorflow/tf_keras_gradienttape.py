"""A GradientTape training loop with mltrace's KerasHook, written as seed 003 writes it
(smdebug's ``tf_keras_gradienttape.py``): ``hook.wrap_tape`` begins a TRAIN step each time the tape
is entered and saves the gradients, the weights they are taken of and the loss;
``hook.wrap_optimizer`` adds the optimizer's variables; ``hook.record_tensor_value`` saves a metric
the loop computes itself. ``--tf-function`` runs the step as a ``tf.function``: the hook works
there too (it saves through ``tf.py_function`` on the steps that are due).

Example (from the repository root):
    python examples/tensorflow/tf_keras_gradienttape.py --out-dir ./demo-output/gradienttape
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
    parser.add_argument("--out-dir", default="./demo-output/gradienttape")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-interval", type=int, default=5)
    parser.add_argument("--tf-function", action="store_true")
    args = parser.parse_args(argv)

    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.random((320, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, 320)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)

    hook = smd.KerasHook(
        out_dir=args.out_dir,
        save_config=smd.SaveConfig(save_interval=args.save_interval),
        include_collections=[
            "weights",
            "biases",
            "gradients",
            "losses",
            "metrics",
            "optimizer_variables",
        ],
    )
    model = tf.keras.models.Sequential(
        [
            tf.keras.layers.Input((28, 28)),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    cce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = hook.wrap_optimizer(tf.keras.optimizers.Adam(0.001))
    train_acc_metric = tf.keras.metrics.SparseCategoricalAccuracy()

    def train_step(data, labels):
        # wrap the tape to capture tensors
        with hook.wrap_tape(tf.GradientTape(persistent=True)) as tape:
            logits = model(data, training=True)  # (32,10)
            loss_value = cce(labels, logits)
        grads = tape.gradient(loss_value, model.variables)
        opt.apply_gradients(zip(grads, model.variables))
        return logits

    if args.tf_function:
        train_step = tf.function(train_step)
    for _ in range(args.epochs):
        for data, labels in dataset:
            dataset_labels = labels
            logits = train_step(data, labels)
            acc = train_acc_metric(dataset_labels, logits)
            # manually save metric values
            hook.record_tensor_value(tensor_name="accuracy", tensor_value=acc)
    hook.close()

    trial = smd.create_trial(args.out_dir)
    print(f"TRAIN steps saved: {trial.steps(mode=smd.modes.TRAIN)}")
    print(f"accuracy: {[round(float(v), 3) for v in trial.tensor('accuracy').values().values()]}")
    print(f"loss: {[round(float(v), 3) for v in trial.tensor('loss').values().values()]}")
    print(f"gradients: {trial.tensor_names(collection='gradients')}")
    return args.out_dir


if __name__ == "__main__":
    main()
    sys.exit(0)
