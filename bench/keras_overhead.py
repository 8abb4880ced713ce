"""Time per step of Keras 3 ``model.fit`` (TensorFlow 2.21): no hook vs mltrace's KerasHook.

Runs in .venv. Model: MLP 32-64-1 (Dense relu, Dense), MSE loss, SGD (lr 0.01), batch 64,
``--steps`` steps per fit, CPU, TensorFlow limited to one thread (intra- and inter-op). The hook
saves weights, biases, gradients and losses (metrics too: KerasHook always saves them, as smdebug)
every step (interval 1) and every 100 steps (interval 100), in ``--intervals``.

Protocol (bench/protocol.py), side by side in one process: the configurations' runs are
interleaved round by round (one warm-up round, then ``--runs`` measured rounds); medians are
reported. A run is: fresh model (compiled), fresh hook on a fresh out_dir, a 20-step fit that
traces the train function (not timed: tracing happens once per job, hook or not), then the timed
region: a ``--steps``-step fit plus ``hook.close()`` (close waits for the background writer, so
deferred work is counted). Columns:

  ms/step, cpu ms/step  wall and process CPU time of the timed region per step (medians)
  overhead              median ms/step over no hook's, minus 1 (the target: < 5% at interval 100)
  paired                median over rounds of (this run / the no-hook run of its round) - 1: the
                        two ran seconds apart, so a busy machine moves both alike
  self                  wall time spent inside mltrace (its callbacks and the py_function calls
                        of in-step captures) over the rest of the timed region; what other
                        processes' load moves least. (Keras' TensorFlow backend calls every
                        callback synchronously, hook or not: keras backend IS_THREAD_SAFE is
                        False for TensorFlow, so its async batch-end dispatch never applies.)

Example:
    .venv/bin/python bench/keras_overhead.py                 # about 2 minutes
    .venv/bin/python bench/keras_overhead.py --steps 300 --runs 3 --json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import protocol  # noqa: E402

COLLECTIONS = ["weights", "biases", "gradients", "losses"]
BATCH, N_IN, N_HIDDEN, N_OUT = 64, 32, 64, 1
WARM_STEPS = 20
CALLBACKS = (
    "on_train_begin",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_epoch_end",
    "on_train_end",
)


def make_data(steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps * BATCH, N_IN), dtype=np.float32)
    return x, rng.standard_normal((steps * BATCH, N_OUT), dtype=np.float32)


def make_model(seed: int = 0) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((N_IN,)),
            tf.keras.layers.Dense(N_HIDDEN, activation="relu"),
            tf.keras.layers.Dense(N_OUT),
        ]
    )
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    return model


class _Stopwatch:
    """Sums the wall time spent inside the wrapped methods of one hook."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def make_hook(interval: int, out_dir: str, watch: _Stopwatch) -> Any:
    import mltrace.tensorflow as smd

    hook = smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=interval),
        include_collections=list(COLLECTIONS),
    )
    for name in CALLBACKS:  # Keras looks callbacks up on the instance
        setattr(hook, name, watch.wrap(getattr(hook, name)))
    # In-step captures call back through this method (bound when the train step is traced).
    hook.adapter.receive = watch.wrap(hook.adapter.receive)
    return hook


def one_run(
    interval: int | None, out_dir: str, data: tuple[np.ndarray, np.ndarray]
) -> dict[str, float]:
    """Wall and CPU ms per step of the timed fit plus hook.close(), and mltrace's self time."""
    x, y = data
    model = make_model()
    watch = _Stopwatch()
    hook = make_hook(interval, out_dir, watch) if interval is not None else None
    callbacks = [hook] if hook is not None else []
    warm = WARM_STEPS * BATCH
    model.fit(
        x[:warm],
        y[:warm],
        batch_size=BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    gc.collect()
    watch.seconds = 0.0
    cpu_start, start = time.process_time(), time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    if hook is not None:
        close_start = time.perf_counter()
        hook.close()
        watch.seconds += time.perf_counter() - close_start
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    steps = len(x) // BATCH
    return {
        "ms": wall * 1000.0 / steps,
        "cpu_ms": cpu * 1000.0 / steps,
        "self": watch.seconds / max(wall - watch.seconds, 1e-9),
    }


def benchmark(intervals: list[int], steps: int, runs: int, workdir: str) -> dict[str, Any]:
    data = make_data(steps)
    configs: dict[str, int | None] = {"none": None, **{f"mltrace@{i}": i for i in intervals}}
    counter = 0

    def timed(interval: int | None) -> dict[str, float]:
        nonlocal counter
        counter += 1
        out_dir = os.path.join(workdir, f"run_{counter}")
        try:
            return one_run(interval, out_dir, data)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    measured = protocol.interleaved(
        {name: functools.partial(timed, interval) for name, interval in configs.items()}, runs)
    ms, cpu_ms = protocol.pick(measured, "ms"), protocol.pick(measured, "cpu_ms")
    self_ = protocol.pick(measured, "self")
    results: dict[str, Any] = {}
    for name in configs:
        results[name] = {
            "ms_per_step": ms[name].median,
            "cpu_ms_per_step": cpu_ms[name].median,
            "paired_ratio": protocol.median(protocol.paired(ms, "none", name)),
            "self_fraction": self_[name].median,
            "runs_ms_per_step": ms[name].runs,
            "runs_cpu_ms_per_step": cpu_ms[name].runs,
            "warmup_ms_per_step": ms[name].warmup,
        }
    return results


def table(results: dict[str, Any]) -> str:
    base = results["none"]
    header = (
        f"{'config':<13}{'ms/step':>9}{'cpu ms/step':>13}{'overhead':>10}{'(cpu)':>8}"
        f"{'paired':>9}{'self':>8}"
    )
    lines = [header]
    for name, r in results.items():
        over = r["ms_per_step"] / base["ms_per_step"] - 1
        cpu = r["cpu_ms_per_step"] / base["cpu_ms_per_step"] - 1
        paired = r["paired_ratio"] - 1
        self_ = "" if name == "none" else f"{r['self_fraction']:>8.1%}"
        lines.append(
            f"{name:<13}{r['ms_per_step']:>9.3f}{r['cpu_ms_per_step']:>13.3f}"
            f"{over:>10.1%}{cpu:>8.1%}{paired:>9.1%}{self_}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5, help="measured rounds (after one warm-up)")
    parser.add_argument(
        "--intervals", default="1,100", help="save_interval values, comma-separated"
    )
    parser.add_argument("--json", action="store_true", help="also write bench/results/keras.json")
    args = parser.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    intervals = [int(i) for i in args.intervals.split(",") if i]
    protocol.warn_if_busy()
    machine = protocol.machine()
    load_start = protocol.load_average()
    with tempfile.TemporaryDirectory(prefix="mltrace_keras_bench_") as workdir:
        results = benchmark(intervals, args.steps, args.runs, workdir)
    load_end = protocol.load_average()
    env = {
        "python": machine["python"],
        "tensorflow": tf.__version__,
        "keras": tf.keras.__version__,
        "numpy": np.__version__,
        "cpu_count": machine["cores"],
        "tf_threads": 1,
        "steps": args.steps,
        "runs": args.runs,
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "machine": machine,
    }
    print(
        f"Keras fit, MLP {N_IN}-{N_HIDDEN}-{N_OUT}, batch {BATCH}, {args.steps} steps, median of "
        f"{args.runs} rounds (load average {load_start:.2f} -> {load_end:.2f}, "
        f"{machine['cores']} CPUs, commit {machine['commit']})"
    )
    print(table(results))
    if args.json:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "keras.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"environment": env, "results": results}, f, indent=2)
        print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
