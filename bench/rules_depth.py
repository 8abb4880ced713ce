"""A rule over a deep model, as the overview issue's user ran it: a 100-layer MLP (Linear+ReLU
pairs and an output layer: 202 parameters, so 202 gradients) trained ``--steps`` steps with the
PyTorch hook saving weights, biases, gradients (raw) and the loss at every step. Target: the
built-in rule over the whole trial in under 10 s.

Measured, side by side in one process (bench/protocol.py: interleaved runs, medians):
- ``VanishingGradient`` (threshold 0: it never fires, so it reads every gradient at every step)
  and ``ExplodingTensor`` (collections weights and gradients) through ``invoke_rule`` on a fresh
  ``create_trial`` (opening the trial included);
- by hand: the same question asked the cheapest way the reader allows, a fresh trial and, per
  step, one batch read of every gradient (``Trial.read_tensors``) and mean(|g|) of each.

    .venv/bin/python bench/rules_depth.py [--steps 300] [--runs 3] [--workdir DIR --keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from rules_throughput import mltrace_rules  # noqa: E402
from torch import nn  # noqa: E402

import protocol  # noqa: E402

LINEAR = 101
WIDTH = 32


def write_trial(path: str, steps: int) -> None:
    """The 100-layer MLP, trained ``steps`` SGD steps, every step saved."""
    if os.path.exists(os.path.join(path, "training_job_end.ts")):
        return
    import mltrace.pytorch as smd

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LINEAR - 1):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 1))
    hook = smd.Hook(out_dir=path, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    loss_fn = nn.MSELoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x, y = torch.randn(64, WIDTH), torch.randn(64, 1)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    hook.close()


def rule(path: str, name: str) -> int:
    """The built-in rule over every step of a fresh trial; the steps it evaluated. Threshold 0:
    VanishingGradient never fires, so it reads every gradient of every step (a firing step stops
    at the first vanishing gradient: the deep layers' do vanish here)."""
    return mltrace_rules(path, name, None if name == "ExplodingTensor" else {"threshold": 0.0})


def by_hand(path: str) -> int:
    """mean(|g|) of every gradient at every step, one batch read a step."""
    from mltrace.modes import ModeKeys
    from mltrace.trials import create_trial

    trial = create_trial(path)
    names = trial.tensor_names(collection="gradients")
    entries = [trial.index_entries(n) for n in names]
    steps = trial.steps(ModeKeys.GLOBAL)
    for step in steps:
        locations = [min(e.values[step].items())[1] for e in entries if step in e.values]
        for value in trial.read_tensors(locations):
            float(np.abs(value).mean())
    return len(steps)


def timed(fn: Callable[[], int], steps: int) -> Callable[[], float]:
    """``fn`` as a measurement: its seconds (and a check that it read every step)."""
    def run() -> float:
        start = time.perf_counter()
        done = fn()
        elapsed = time.perf_counter() - start
        assert done == steps, f"{done} steps evaluated, not {steps}"
        return elapsed
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    protocol.warn_if_busy()
    workdir = args.workdir or tempfile.mkdtemp(prefix="mltrace-bench-rules-depth-")
    path = os.path.join(workdir, "mlp100")
    try:
        start = time.perf_counter()
        write_trial(path, args.steps)
        written = time.perf_counter() - start
        fns = {"VanishingGradient": timed(lambda: rule(path, "VanishingGradient"), args.steps),
               "ExplodingTensor": timed(lambda: rule(path, "ExplodingTensor"), args.steps),
               "by hand": timed(lambda: by_hand(path), args.steps)}
        measured = protocol.interleaved(fns, args.runs)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report = {name: {"median_s": m.median, "runs_s": m.runs} for name, m in measured.items()}
    if args.json:
        print(json.dumps({"steps": args.steps, "write_s": written, "results": report,
                          "machine": protocol.machine(), "loadavg": protocol.load_average()}, indent=1))
        return 0
    hand = measured["by hand"].median
    print(f"100-layer MLP, {args.steps} steps saved (written in {written:.0f} s); median of {args.runs}, "
          f"load {protocol.load_average():.2f}")
    for name, m in measured.items():
        spread = f"{min(m.runs):.2f}..{max(m.runs):.2f}"
        ratio = "" if name == "by hand" else f"  {m.median / hand:5.1f}x by hand; target < 10 s"
        print(f"  {name:18s} {m.median:7.2f} s ({spread}){ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
