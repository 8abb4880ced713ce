"""Write the mltrace-written Keras trial that the legacy suite reads with real smdebug 1.0.34.

Run with the main venv (TensorFlow 2.21, Keras 3; the legacy venv has no TensorFlow)::

    .venv/bin/python tests/golden/make_mltrace_keras_golden.py [--out DIR]

It trains a small seeded Keras model with ``mltrace.tensorflow.KerasHook`` (fit with validation
for 2 epochs of 2 steps, then predict; every TensorFlow collection; a custom collection that
saves only reductions of the gradients, mltrace's ``nan_count`` among them) into
``DIR/keras_run/`` and writes ``DIR/expected.json``: tensor names, steps per mode, the mode of
each global step (``global_step``), every value (dtype, shape, data), every stored reduction and
the collections' members, as mltrace's reader returns them. Before writing, the script checks
those values against what it captured in the process (weights after each step, Keras' logs, the
batches), so the JSON is the truth that tests/legacy/test_smdebug_reads_mltrace_keras.py holds smdebug's
reader to. DIR defaults to ``tests/golden/mltrace_keras`` beside this file. Event files carry wall
times, so their bytes differ between runs; the values do not (seeded, one CPU thread).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import numpy as np
import tensorflow as tf

import mltrace
import mltrace.tensorflow as smd
from mltrace.modes import ModeKeys
from mltrace.trials import create_trial

MODES = ("TRAIN", "EVAL", "PREDICT")
COLLECTIONS = [
    "weights",
    "biases",
    "gradients",
    "optimizer_variables",
    "layers",
    "inputs",
    "outputs",
    "losses",
    "metrics",
    "grad_stats",
]
STATS = {
    "reductions": ["min", "max", "mean", "nan_count"],
    "abs_reductions": ["max"],
    "norms": ["l2"],
}


class Capture(tf.keras.callbacks.Callback):
    """What the process knows each TRAIN step must hold: weights after it, and Keras' logs."""

    def __init__(self) -> None:
        super().__init__()
        self.weights: list[dict[str, np.ndarray]] = []
        self.logs: list[dict[str, float]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append({v.path: v.numpy().copy() for v in self.model.weights})
        self.logs.append(dict(logs))


def train(out_dir: Path) -> tuple[Capture, np.ndarray, np.ndarray]:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(7)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 4)).astype("float32")
    y = rng.standard_normal((8, 2)).astype("float32")
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((4,)),
            tf.keras.layers.Dense(3, activation="relu", name="dense"),
            tf.keras.layers.Dense(2, name="dense_1"),
        ],
        name="sequential",
    )
    model.compile(
        optimizer=tf.keras.optimizers.SGD(0.05, momentum=0.9, name="sgd"),
        loss="mse",
        metrics=["mae"],
    )
    hook = smd.KerasHook(
        out_dir=str(out_dir),
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=COLLECTIONS,
    )
    stats = hook.get_collection("grad_stats")
    stats.include("^gradients/")
    stats.reduction_config = smd.ReductionConfig(**STATS, save_raw_tensor=False)
    capture = Capture()
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        shuffle=False,
        verbose=0,
        validation_data=(x[:4], y[:4]),
        callbacks=[hook, capture],
    )
    model.predict(x[:4], batch_size=4, verbose=0, callbacks=[hook])
    hook.close()
    return capture, x, y


def _array(value: np.ndarray) -> dict:
    return {"dtype": str(value.dtype), "shape": list(value.shape), "value": value.tolist()}


def describe(out_dir: Path) -> dict:
    trial = create_trial(str(out_dir))
    mode_keys = {m: ModeKeys[m] for m in MODES}
    tensors: dict[str, dict] = {}
    reductions: dict[str, dict] = {}
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        for mode, key in mode_keys.items():
            for step in tensor.steps(mode=key):
                tensors.setdefault(name, {}).setdefault(mode, {})[str(step)] = _array(
                    tensor.value(step, mode=key)
                )
    for name in trial.tensor_names(collection="grad_stats"):
        tensor = trial.tensor(name)
        for step in trial.steps(mode=ModeKeys.TRAIN):
            stored = {}
            for red in STATS["reductions"] + STATS["norms"]:
                stored[red] = float(tensor.reduction_value(step, red, mode=ModeKeys.TRAIN))
            stored["abs_max"] = float(
                tensor.reduction_value(step, "max", abs=True, mode=ModeKeys.TRAIN)
            )
            reductions.setdefault(name, {})[str(step)] = stored
    return {
        "mltrace_version": mltrace.__version__,
        "tensorflow_version": tf.__version__,
        "keras_version": tf.keras.__version__,
        "trial": out_dir.name,
        "steps": {m: trial.steps(mode=k) for m, k in mode_keys.items()} | {"GLOBAL": trial.steps()},
        "global_step": {
            m: {str(s): trial.global_step(k, s) for s in trial.steps(mode=k)}
            for m, k in mode_keys.items()
        },
        "tensor_names": trial.tensor_names(),
        "tensors": tensors,
        "reductions": reductions,
        "collections": {c: trial.tensor_names(collection=c) for c in COLLECTIONS},
        "workers": sorted(trial.workers()),
        "num_workers": trial.num_workers,
    }


def check(expected: dict, capture: Capture, x: np.ndarray, y: np.ndarray) -> None:
    """The trial holds what the process computed (the round trip this golden relies on)."""
    train = {name: modes.get("TRAIN", {}) for name, modes in expected["tensors"].items()}
    assert expected["steps"]["TRAIN"] == [0, 1, 2, 3] and expected["steps"]["EVAL"] == [0, 1]
    assert expected["steps"]["PREDICT"] == [0]
    for step in range(4):
        s = str(step)
        for path, value in capture.weights[step].items():
            layer = path.split("/")[1]
            np.testing.assert_array_equal(train[f"{layer}/weights/{path}:0"][s]["value"], value)
        assert train["loss"][s]["value"] == np.float32(capture.logs[step]["loss"])
        batch = slice((step % 2) * 4, (step % 2) * 4 + 4)
        np.testing.assert_array_equal(train["inputs"][s]["value"], x[batch])
        np.testing.assert_array_equal(train["labels"][s]["value"], y[batch])
        grad = np.array(train["gradients/sequential/dense/kernelGrad"][s]["value"])
        stored = expected["reductions"]["gradients/sequential/dense/kernelGrad"][s]
        np.testing.assert_allclose(
            [stored["min"], stored["max"], stored["l2"]],
            [grad.min(), grad.max(), np.linalg.norm(grad)],
            rtol=1e-6,
        )
        assert stored["nan_count"] == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "mltrace_keras"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    run_dir = out / "keras_run"
    shutil.rmtree(run_dir, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    capture, x, y = train(run_dir)
    expected = describe(run_dir)
    check(expected, capture, x, y)
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"wrote {run_dir} and {out / 'expected.json'} ({len(expected['tensor_names'])} tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
