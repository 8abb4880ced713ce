"""A wide model's saved step: reductions of many large tensors, against torch alone.

The model holds ``--tensors`` (200) parameters of ``--elements`` (1,000,000) float32 each. Its
forward reads one element of each, so a step costs almost nothing but the work of saving. Three
configurations run interleaved, round by round, in this one process (one torch thread):

* ``forward``: the forward alone, no hook (what the step costs without saving);
* ``mltrace``: ``mltrace.pytorch.Hook`` saving the weights collection every step as reductions
  only (``l2`` norm, ``mean``, ``max``, ``nan_count``; ``save_raw_tensor=False``), timed over
  the forwards plus ``hook.close()``;
* ``torch``: the floor: the same four reductions of every parameter with torch ops, stacked per
  tensor, concatenated and copied to the host once per step; no hook, nothing written.

Reported: ms per saved step for each, the hook's added time (mltrace - forward), and the ratio
added / torch (the target: at most 2). ``--json`` prints one JSON object.

    .venv/bin/python bench/pytorch_wide.py                      # 200 x 1M, 5 steps, 3 rounds
    .venv/bin/python bench/pytorch_wide.py --tensors 50 --elements 100000
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import tempfile
import time

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import torch
from torch import nn

import protocol

REDUCTIONS = ["mean", "max", "nan_count"]
NORMS = ["l2"]


class Wide(nn.Module):
    """``tensors`` parameters of ``elements`` each; the forward touches one element of each."""

    def __init__(self, tensors: int, elements: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.weights = nn.ParameterList(
            nn.Parameter(torch.randn(elements, generator=gen), requires_grad=False)
            for _ in range(tensors))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + sum(w[0] for w in self.weights)


def run_forward(model: Wide, steps: int) -> float:
    x = torch.zeros(())
    start = time.perf_counter()
    for _ in range(steps):
        model(x)
    return (time.perf_counter() - start) * 1000.0 / steps


def run_mltrace(model: Wide, steps: int) -> float:
    import mltrace.pytorch as smd

    out_dir = tempfile.mkdtemp(prefix="mltrace-wide-")
    try:
        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                        include_collections=["weights"],
                        reduction_config=smd.ReductionConfig(reductions=REDUCTIONS, norms=NORMS,
                                                             save_raw_tensor=False))
        hook.register_module(model)
        x = torch.zeros(())
        start = time.perf_counter()
        for _ in range(steps):
            model(x)
        hook.close()
        elapsed = (time.perf_counter() - start) * 1000.0 / steps
        _check(out_dir, model, steps)
        return elapsed
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _check(out_dir: str, model: Wide, steps: int) -> None:
    """Every parameter's four reductions at every step, or the run measured the wrong thing."""
    from mltrace.trials import create_trial

    trial = create_trial(out_dir)
    names = trial.tensor_names(collection="weights")
    if len(names) != len(model.weights) or trial.steps() != list(range(steps)):
        raise SystemExit(f"mltrace saved {len(names)} tensors at steps {trial.steps()}")
    trial.tensor(names[-1]).reduction_value(steps - 1, "l2")


def run_torch(model: Wide, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        per_tensor = [torch.stack([torch.linalg.vector_norm(w), w.mean(), w.max(),
                                   w.isnan().sum().double()]).double() for w in model.weights]
        torch.cat(per_tensor).cpu().numpy()
    return (time.perf_counter() - start) * 1000.0 / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--elements", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = Wide(args.tensors, args.elements)
    protocol.warn_if_busy()
    machine = protocol.machine()
    load = [protocol.load_average()]
    run_mltrace(model, 1)  # warm-up of every path, one step each
    run_torch(model, 1)
    measured = protocol.interleaved(
        {name: functools.partial(run, model, args.steps)
         for name, run in (("forward", run_forward), ("mltrace", run_mltrace), ("torch", run_torch))},
        args.rounds, warmup=False)
    load.append(protocol.load_average())
    runs = {k: m.runs for k, m in measured.items()}
    med = {k: m.median for k, m in measured.items()}
    added = protocol.added(measured, "forward")["mltrace"]
    result = {"tensors": args.tensors, "elements": args.elements, "steps": args.steps,
              "rounds": args.rounds, "ms_per_step": med, "added_ms": added,
              "added_over_torch": added / med["torch"], "load_average": load, "runs": runs,
              "machine": machine}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"wide model: {args.tensors} x {args.elements:,} float32, reductions l2, mean, max, "
          f"nan_count; {args.steps} steps x {args.rounds} rounds, medians; load average "
          f"{load[0]:.1f} -> {load[1]:.1f}")
    print("| config | ms per saved step |")
    print("|---|---|")
    for name in runs:
        print(f"| {name} | {med[name]:.1f} |")
    print(f"mltrace added {added:.1f} ms; added / torch alone = {added / med['torch']:.2f} "
          "(target: at most 2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
