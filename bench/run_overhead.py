"""Overhead of ``mltrace run`` (zero script change): the examples without their mltrace lines
(examples/zero_change/), plain vs under ``mltrace run`` with a hook that saves nothing due
(``--save-interval 1000``), side by side.

Workloads (the stripped examples, longer than their defaults so that training dominates):

- ``pytorch``: pytorch_hook_demos.py, ``--steps 3000`` (the Tornasole network, batch 32), with
  pytorch_weights_bias_gradients.json: weights, biases, gradients (and the loss);
- ``keras``: keras_fit.py, ``--epochs 4`` (fit on 576 samples, validation, evaluate, predict),
  with keras_fit.json: weights, biases, gradients, losses, metrics;
- ``xgboost``: feature_importance.py, ``--rounds 3000``, with feature_importance.json: metrics
  and feature importance.

What is timed: each run is a fresh process (``python timed.py SCRIPT ARGS`` or ``mltrace run
--config ... timed.py SCRIPT ARGS``), where timed.py first imports the framework and mltrace's
module for it (in both configurations: a script with mltrace lines pays that import too, and it
is a fixed cost: about 2 s for mltrace.pytorch today, which imports torch.distributed.tensor),
then times the script's ``__main__`` (runpy) with ``time.perf_counter``: the training time and
what mltrace run adds to it (the hook's creation at the first step, the discovery of models
and losses during the first step, the hook's callbacks; its close at exit is not included:
atexit runs after). The process's wall time is reported too (it adds mltrace's bootstrap, the
imports and the hook's close). With interval 1000, steps 0, 1000, 2000 save.

For comparison, the pytorch workload also runs in-process with the hook created and registered
by the script (the original example's way, same collections, interval 1000): the hook's own
cost, which ``mltrace run`` includes; and with one forward pre-hook that does nothing, the floor
of any step boundary kept by a module hook.

Protocol (bench/protocol.py): one thread (OMP/MKL threads 1; ``torch.set_num_threads(1)`` follows
from OMP_NUM_THREADS), one warm-up and ``--runs`` (5) measured runs per configuration, plain
and mltrace run interleaved, the median reported. On a loaded machine read the CPU ratio (the
training process's own CPU time) next to the wall ratios.

Example:
    .venv/bin/python bench/run_overhead.py            # about 3 minutes on one core
    .venv/bin/python bench/run_overhead.py --only pytorch --runs 3
"""

from __future__ import annotations

import argparse
import ast
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import protocol

ROOT = Path(__file__).resolve().parents[1]
STRIPPED = ROOT / "examples" / "zero_change"
WORKLOADS = {
    "pytorch": ("torch,mltrace.pytorch", "pytorch_hook_demos.py", ["--steps", "3000"],
                "pytorch_weights_bias_gradients.json"),
    "keras": ("tensorflow,keras,mltrace.tensorflow", "keras_fit.py", ["--epochs", "4"],
              "keras_fit.json"),
    "xgboost": ("xgboost,mltrace.xgboost", "feature_importance.py", ["--rounds", "3000"],
                "feature_importance.json"),
    "gradienttape": ("tensorflow,keras,mltrace.tensorflow", "tf_keras_gradienttape.py",
                     ["--epochs", "20"], "tf_keras_gradienttape.json"),
    "tf_session": ("tensorflow,mltrace.tensorflow", "session_hook.py", ["--steps", "2000"],
                   "session_hook.json"),
}
TIMED = '''
import importlib, os, runpy, sys, time
for name in os.environ["BENCH_IMPORTS"].split(","):
    importlib.import_module(name)
script = sys.argv[1]
sys.argv = sys.argv[1:]
start, cpu = time.perf_counter(), time.process_time()
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit:
    pass
with open(os.environ["BENCH_RESULT"], "w") as f:
    f.write(repr((time.perf_counter() - start, time.process_time() - cpu)))
'''


def run_once(workload: str, under_mltrace: bool, work: Path,
             index: int) -> tuple[float, float, float]:
    """(training seconds, training CPU seconds, process wall seconds) of one run."""
    imports, script, args, config = WORKLOADS[workload]
    timed = work / "timed.py"
    result = work / f"{workload}-{under_mltrace}-{index}.txt"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2",
               BENCH_IMPORTS=imports, BENCH_RESULT=str(result), MLTRACE_LOG_LEVEL="error")
    command = [sys.executable, str(timed), str(STRIPPED / script), *args]
    if under_mltrace:
        out_dir = work / f"trial-{workload}-{index}"
        command = [sys.executable, "-m", "mltrace", "run", "--config", str(STRIPPED / config),
                   "--out-dir", str(out_dir), "--save-interval", "1000", *command[1:]]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=work, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr}")
    wall = time.perf_counter() - start
    train, cpu = ast.literal_eval(result.read_text())
    return train, cpu, wall


def measure(workload: str, runs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="mltrace-run-bench-") as tmp:
        work = Path(tmp)
        (work / "timed.py").write_text(TIMED)
        index = itertools.count()  # each run's own result file and trial folder

        def once(under: bool) -> tuple[float, float, float]:
            return run_once(workload, under, work, next(index))

        measured = protocol.interleaved({"plain": functools.partial(once, False),
                                         "run": functools.partial(once, True)}, runs)
    result = {}
    for i, what in enumerate(("train", "cpu", "wall")):
        figure = protocol.pick(measured, i)
        plain, run = figure["plain"].median, figure["run"].median
        result.update({f"plain_{what}_s": plain, f"run_{what}_s": run, f"{what}_ratio": run / plain})
    return result


def hook_in_the_script(runs: int, steps: int = 3000) -> dict[str, float]:
    """The pytorch workload in this process, plain vs with the hook created and registered by
    the script itself (what the example's mltrace lines do; interval 1000): the part of
    ``mltrace run``'s cost that is the hook's own. Thread CPU time of the training loop.

    A third variant registers one forward pre-hook that does nothing on the model: the floor
    of any step boundary kept by a module hook (PyTorch's own dispatch of a hook, which takes
    the module off its hook-less fast path)."""
    import torch
    from torch import nn, optim

    import mltrace.pytorch as smd

    torch.set_num_threads(1)
    sys.path.insert(0, str(STRIPPED))
    example = __import__("pytorch_hook_demos")

    def once(kind: str, tmp: str, n: int) -> float:
        torch.manual_seed(0)
        model = example.Net()
        optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.NLLLoss()
        hook = None
        if kind == "hook":
            hook = smd.Hook(out_dir=tempfile.mkdtemp(dir=tmp), include_collections=[
                "weights", "biases", "gradients"], save_config=smd.SaveConfig(save_interval=1000))
            hook.register_module(model)
            hook.register_loss(loss_fn)
        elif kind == "noop_pre_hook":
            model.register_forward_pre_hook(lambda module, args: None)
        start = time.thread_time()
        example.train(model, optimizer, loss_fn, n, 32, 0)
        elapsed = time.thread_time() - start
        if hook is not None:
            hook.close()
        return elapsed

    kinds = ("plain", "noop_pre_hook", "hook")
    with tempfile.TemporaryDirectory(prefix="mltrace-run-bench-") as tmp:
        times = protocol.interleaved({kind: functools.partial(once, kind, tmp, steps)
                                      for kind in kinds}, runs)
    plain = times["plain"].median
    noop, hooked = times["noop_pre_hook"].median, times["hook"].median
    return {"plain_cpu_s": plain, "noop_pre_hook_cpu_s": noop, "hook_cpu_s": hooked,
            "noop_pre_hook_ratio": noop / plain, "cpu_ratio": hooked / plain}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    protocol.warn_if_busy()
    machine = protocol.machine()
    results = {name: measure(name, args.runs) for name in args.only or WORKLOADS}
    print(f"commit {machine['commit']}, {machine['cores']} cores, load {machine['load_per_core']} "
          f"per core before, {protocol.load_per_core():.2f} after")
    print("medians; train = the script's run after the imports, cpu = its process CPU time,")
    print("wall = the whole process; ratio = mltrace run / plain")
    print(f"{'workload':<10}" + "".join(f"{'plain ' + w:>13}{'run ' + w:>11}{'ratio':>7}"
                                        for w in ("train", "cpu", "wall")))
    for name, r in results.items():
        print(f"{name:<10}" + "".join(
            f"{r[f'plain_{w}_s']:>13.3f}{r[f'run_{w}_s']:>11.3f}{r[f'{w}_ratio']:>7.3f}"
            for w in ("train", "cpu", "wall")))
    if args.only is None or "pytorch" in args.only:
        inside = hook_in_the_script(args.runs)
        results["pytorch_hook_in_the_script"] = inside
        print(f"pytorch, hook created by the script itself (in-process, training-loop thread CPU):"
              f" plain {inside['plain_cpu_s']:.3f} s, with the hook {inside['hook_cpu_s']:.3f} s, "
              f"ratio {inside['cpu_ratio']:.3f}; one no-op forward pre-hook (the floor of a "
              f"module-hook step boundary) {inside['noop_pre_hook_cpu_s']:.3f} s, ratio "
              f"{inside['noop_pre_hook_ratio']:.3f}")
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
