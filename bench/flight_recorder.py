"""Cost of the flight recorder on the benchmark MLP (issue "catch the moment").

Variants, their runs interleaved in one process (bench/README.md's protocol: one warm-up run and
``--runs`` measured runs each, the median reported; a run is a fresh model, hook and out_dir,
``--steps`` steps plus ``hook.close()``):

* ``none``: no hook.
* ``hook``: mltrace's hook saving the losses every 1000 steps, no recorder: nothing is due after
  step 0 (the hook's own cost at a step that saves nothing).
* ``recorder``: the same hook with a flight recorder keeping the reductions (min, max, mean,
  std, l2) of every gradient and every activation (module output) for 50 steps, no trigger
  firing; the non-finite check on, the loss spike off. PyTorch copies each tensor into the
  recorder's slots and reduces it only when its step is read (mltrace.pytorch.copy_ring); the
  ring's memory printed includes the slots.
* ``recorder_nocheck``: the same without the non-finite check: nothing is read on the host
  until a dump. ``recorder`` minus this is the check alone.
* ``recorder_minmax``: ``recorder`` keeping only min and max (one ``aminmax`` per tensor, no
  copies: a copy costs as much): what the choice of reductions costs.
* ``saving``: no recorder; the hook saves the same reductions of the same tensors to the trial
  on every step (what a run would do to have every step without a recorder).

Yardsticks, the ``hook`` variant plus hand-written hooks on every module and parameter (not
mltrace; a floor for any recorder built on PyTorch's hooks):

* ``noop_hooks``: hooks that do nothing: what PyTorch charges for calling Python on each tensor.
* ``lean``: hooks that compute min, max, mean and a std with the fewest kernels (``aminmax``,
  ``std_mean``, or mean and a centred norm above 512 elements; l2 left to be derived) and keep
  them in a list, stacked, read as floats for a finite check and kept for 50 steps at each
  step's start: no names, no budget, no dumps.
* ``lean_minmax``: the same with ``aminmax`` alone.

Printed: ms/step of each, the ratios of the medians, the check's share of the step, and the
recorder's memory (its ring's bytes at the end against the budget). The ratios to ``hook`` are
also given paired: each variant's run divided by the ``hook`` run of the same round, the median
and the range over rounds. Runs of one round are seconds apart, so a machine that slows down for
a while moves both sides of a paired ratio; the ratio of medians pairs runs of different rounds.

Example:
    .venv/bin/python bench/flight_recorder.py --steps 500 --runs 5
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from pytorch_overhead import make_data, make_model, train_steps  # noqa: E402
from torch import nn  # noqa: E402

import mltrace.pytorch as smd  # noqa: E402
from mltrace.capture.recorder_config import DEFAULT_REDUCTIONS  # noqa: E402

VARIANTS = ("none", "hook", "recorder", "recorder_nocheck", "recorder_minmax", "saving",
            "noop_hooks", "lean", "lean_minmax")
BUDGET = 16 * 1024 * 1024


def _hook(variant: str, out_dir: str) -> Any:
    if variant == "none":
        return None
    recorder = None
    smd.get_collection("activations").include(r"_output_0$")  # every module's output
    if variant.startswith("recorder"):
        recorder = smd.FlightRecorderConfig(
            steps=50, collections=["gradients", "activations"], loss_spike=None,
            nonfinite=variant != "recorder_nocheck", memory_budget=BUDGET,
            reductions=["min", "max"] if variant == "recorder_minmax" else list(DEFAULT_REDUCTIONS))
    if variant == "saving":
        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                        include_collections=["gradients", "activations"],
                        reduction_config=smd.ReductionConfig(reductions=["min", "max", "mean", "std"],
                                                             norms=["l2"]))
        return hook
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1000),
                    include_collections=["losses"], flight_recorder=recorder)
    return hook


class LeanRecorder:
    """The yardstick variants' hand-written recorder (see the module docstring)."""

    def __init__(self, model: nn.Module, loss_fn: nn.Module, reduce: bool, minmax: bool) -> None:
        self.values: list[torch.Tensor] = []
        self.ring: list[torch.Tensor] = []
        self.minmax = minmax
        keep = self.keep if reduce else (lambda tensor: None)
        for module in [*model.modules(), loss_fn]:
            module.register_forward_hook(lambda module, inputs, output: keep(output))
        for param in model.parameters():
            param.register_hook(keep)
        if reduce:
            model.register_forward_pre_hook(lambda module, inputs: self.step())

    def keep(self, tensor: torch.Tensor) -> None:
        t = tensor.detach()
        low, high = torch.aminmax(t)
        if self.minmax:
            self.values += (low, high)
        elif t.numel() <= 512:
            std, mean = torch.std_mean(t, correction=0)
            self.values += (low, high, mean, std)
        else:
            mean = t.mean()
            self.values += (low, high, mean, torch.linalg.vector_norm(t - mean))

    def step(self) -> None:
        if not self.values:
            return
        stacked, self.values = torch.stack(self.values), []
        if not math.isfinite(sum(stacked.tolist())):
            raise FloatingPointError("a recorded value is not finite")
        self.ring.append(stacked)
        del self.ring[:-50]


def one_run(variant: str, out_dir: str, data: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    model, loss_fn = make_model(), nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = _hook("hook" if variant in ("noop_hooks", "lean", "lean_minmax") else variant, out_dir)
    if hook is not None:
        hook.register_module(model)
        hook.register_loss(loss_fn)
    if variant in ("noop_hooks", "lean", "lean_minmax"):
        LeanRecorder(model, loss_fn, reduce=variant != "noop_hooks", minmax=variant == "lean_minmax")
    gc.collect()
    start = time.perf_counter()
    train_steps(model, loss_fn, opt, data)
    ring = hook.recorder.ring_bytes if hook is not None and hook.recorder is not None else 0
    kept = len(hook.recorder.ring) if hook is not None and hook.recorder is not None else 0
    if hook is not None:
        hook.close()
    elapsed = time.perf_counter() - start
    return {"ms_per_step": elapsed * 1000.0 / len(data), "ring_bytes": ring, "ring_steps": kept}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = make_data(args.steps)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as workdir:
        for k in range(args.runs + 1):  # the first round warms up
            for variant in VARIANTS:
                result = one_run(variant, os.path.join(workdir, f"{variant}_{k}"), data)
                if k:
                    runs[variant].append(result)
    ms = {v: statistics.median(r["ms_per_step"] for r in runs[v]) for v in VARIANTS}
    paired = {v: [r["ms_per_step"] / h["ms_per_step"] for r, h in zip(runs[v], runs["hook"])]
              for v in VARIANTS}
    out = {
        "ms_per_step": ms,
        "runs_ms_per_step": {v: [r["ms_per_step"] for r in runs[v]] for v in VARIANTS},
        "recorder_over_hook": ms["recorder"] / ms["hook"],
        "paired_over_hook": {v: {"median": statistics.median(paired[v]), "min": min(paired[v]),
                                 "max": max(paired[v])} for v in VARIANTS},
        "recorder_added_over_hook_added": (ms["recorder"] - ms["none"]) / max(ms["hook"] - ms["none"], 1e-9),
        "check_share_of_step": (ms["recorder"] - ms["recorder_nocheck"]) / ms["recorder_nocheck"],
        "check_share_paired": statistics.median(
            r["ms_per_step"] / n["ms_per_step"] - 1.0 for r, n in zip(runs["recorder"], runs["recorder_nocheck"])),
        "ring_bytes": max(r["ring_bytes"] for r in runs["recorder"]),
        "ring_steps": max(r["ring_steps"] for r in runs["recorder"]),
        "budget_bytes": BUDGET,
        "load": [load_start, os.getloadavg()[0]],
        "steps": args.steps,
        "runs": args.runs,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"flight recorder on the benchmark MLP ({args.steps} steps, median of {args.runs} runs, "
          f"load {out['load'][0]:.1f} -> {out['load'][1]:.1f})")
    for v in VARIANTS:
        print(f"  {v:18s} {ms[v]:.4f} ms/step  ({ms[v] / ms['none']:.3f}x no hook)")
    print(f"  recorder / hook (step time)            {out['recorder_over_hook']:.3f}")
    print(f"  recorder's added time / hook's added   {out['recorder_added_over_hook_added']:.2f}")
    print(f"  non-finite check alone, share of step  {out['check_share_of_step'] * 100:+.1f}% "
          f"(paired within rounds: {out['check_share_paired'] * 100:+.1f}%)")
    print(f"  ring: {out['ring_steps']} steps, {out['ring_bytes']} bytes (budget {BUDGET})")
    print("  / hook: ratio of medians; paired within rounds, median [min, max]")
    for v in ("noop_hooks", "lean", "lean_minmax", "recorder", "recorder_nocheck", "recorder_minmax"):
        pair = out["paired_over_hook"][v]
        print(f"  {v} / hook{'':{18 - len(v)}} {ms[v] / ms['hook']:.3f}; paired {pair['median']:.3f} "
              f"[{pair['min']:.3f}, {pair['max']:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
