"""Cost of the flight recorder on the benchmark MLP.

Two protocols, one process, one thread:

* ``--protocol runs`` (bench/protocol.py's ``interleaved``): the variants' runs interleaved, one
  warm-up run and ``--runs`` measured runs each, the median reported; a run is a fresh model, hook and
  out_dir, ``--steps`` steps plus ``hook.close()``.
* ``--protocol blocks`` (the default): every variant made once and kept alive, one untimed
  block of ``--block`` steps each, then ``--blocks`` rounds each timing one block of every
  variant in turn, in an order shuffled each round (a block right after one of the same trainer
  starts with its caches warm: a fixed order would favour the same variants every round). The
  recorder is timed in its steady state (its ring full), and the blocks of a round are
  milliseconds apart, so a machine that slows down for a while (a shared VM) moves both sides of
  a paired ratio. ``hook`` saves only its step 0 here.
  torch.optim's step hooks are global, so each mltrace hook alive would also be called after
  the other models' optimizer steps: only the timed variant's hook is installed during its
  block. ``saving`` is left out (its writer thread would still be writing during the next
  variant's block). The ``_nocheck`` variants and the one-op yardstick are not trainers of their
  own here: they are blocks of their checked twin's trainer, its check switched off (and the op
  on) for the block. Two trainers made alike differ by a point or two on their own, for as long
  as the process lives (measured: ``recorder_minmax``'s check, which only tests 18 floats read
  anyway, read +1.0% to +2.5% between two trainers), which is the size of what is measured.

Variants:

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
* ``recorder_nocheck_one_op`` (a yardstick): ``recorder_nocheck`` plus, in backward, one PyTorch
  op on 64 values and one read of its result (``sum().item()`` in a gradient hook of the first
  layer's weight, not mltrace): the least any on-device check per step costs, one op and one
  host transfer. On a step this small that is a cold kernel call, not arithmetic.
* ``recorder_minmax``: ``recorder`` keeping only min and max (one ``aminmax`` per tensor, no
  copies: a copy costs as much): what the choice of reductions costs.
* ``recorder_minmax_nocheck``: the same without the check (its reductions are read on the host
  when the step is packed all the same: the check only tests them).
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
    .venv/bin/python bench/flight_recorder.py [--blocks 60 --block 100]
    .venv/bin/python bench/flight_recorder.py --protocol runs --steps 500 --runs 5
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import math
import os
import random
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import mltrace.pytorch as smd  # noqa: E402
from mltrace.capture.recorder_config import DEFAULT_REDUCTIONS  # noqa: E402

import protocol  # noqa: E402
from pytorch_overhead import make_data, make_model, train_steps  # noqa: E402

VARIANTS = ("none", "hook", "recorder", "recorder_nocheck", "recorder_nocheck_one_op", "recorder_minmax",
            "recorder_minmax_nocheck", "saving", "noop_hooks", "lean", "lean_minmax")
BUDGET = 16 * 1024 * 1024
CHECKED = ("recorder", "recorder_minmax")  # each against its ``_nocheck`` twin
ONE_OP = "recorder_nocheck_one_op"  # against ``recorder_nocheck``: the floor of any check
#: blocks protocol: variants timed on their checked twin's trainer (see the module docstring)
TWIN_OF = {"recorder_nocheck": "recorder", ONE_OP: "recorder", "recorder_minmax_nocheck": "recorder_minmax"}
#: the mltrace hook of the variants that add something of their own to one
_MLTRACE_PART = {ONE_OP: "recorder_nocheck", "noop_hooks": "hook", "lean": "hook", "lean_minmax": "hook"}


def _hook(variant: str, out_dir: str, interval: int = 1000) -> Any:
    if variant == "none":
        return None
    recorder = None
    smd.del_hook()  # the collection below is the next hook's, not a live one's (blocks protocol)
    smd.get_collection("activations").include(r"_output_0$")  # every module's output
    if variant.startswith("recorder"):
        recorder = smd.FlightRecorderConfig(
            steps=50, collections=["gradients", "activations"], loss_spike=None,
            nonfinite=not variant.endswith("_nocheck"), memory_budget=BUDGET,
            reductions=["min", "max"] if "minmax" in variant else list(DEFAULT_REDUCTIONS))
    if variant == "saving":
        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                        include_collections=["gradients", "activations"],
                        reduction_config=smd.ReductionConfig(reductions=["min", "max", "mean", "std"],
                                                             norms=["l2"]))
        return hook
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=interval),
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


def _trainer(variant: str, out_dir: str, interval: int = 1000) -> tuple[nn.Module, nn.Module, Any, Any]:
    """(model, loss, optimizer, mltrace hook or None) of ``variant``, hooks registered."""
    model, loss_fn = make_model(), nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = _hook(_MLTRACE_PART.get(variant, variant), out_dir, interval)
    if hook is not None:
        hook.register_module(model)
        hook.register_loss(loss_fn)
    if variant in ("noop_hooks", "lean", "lean_minmax"):
        LeanRecorder(model, loss_fn, reduce=variant != "noop_hooks", minmax=variant == "lean_minmax")
    if variant == ONE_OP:
        _one_op(model)
    return model, loss_fn, opt, hook


def _one_op(model: nn.Module) -> Any:
    """The one-op yardstick's gradient hook on ``model``'s first parameter (its handle)."""
    scratch = torch.ones(64)

    def one_op(grad: torch.Tensor) -> None:
        scratch.sum().item()

    return next(model.parameters()).register_hook(one_op)


def _set_check(hook: Any, on: bool) -> None:
    """Switch the recorder's non-finite check on or off between blocks (blocks protocol). Through
    its internals: no user needs that switch, the recorder is configured once."""
    recorder = hook.recorder
    recorder.config = dataclasses.replace(recorder.config, nonfinite=on)
    if recorder._copies is not None:
        recorder._copies.checked = on


def one_run(variant: str, out_dir: str, data: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    model, loss_fn, opt, hook = _trainer(variant, out_dir)
    gc.collect()
    start = time.perf_counter()
    train_steps(model, loss_fn, opt, data)
    ring = hook.recorder.ring_bytes if hook is not None and hook.recorder is not None else 0
    kept = len(hook.recorder.ring) if hook is not None and hook.recorder is not None else 0
    if hook is not None:
        hook.close()
    elapsed = time.perf_counter() - start
    return {"ms_per_step": elapsed * 1000.0 / len(data), "ring_bytes": ring, "ring_steps": kept}


def measure_runs(args: argparse.Namespace, workdir: str) -> dict[str, list[dict[str, float]]]:
    """The ``runs`` protocol (see the module docstring): per variant, its measured runs."""
    data = make_data(args.steps)

    def run(variant: str) -> dict[str, float]:  # a fresh out_dir each run
        return one_run(variant, tempfile.mkdtemp(prefix=f"{variant}_", dir=workdir), data)

    measured = protocol.interleaved({v: functools.partial(run, v) for v in VARIANTS}, args.runs)
    return {v: m.runs for v, m in measured.items()}


def measure_blocks(args: argparse.Namespace, workdir: str) -> dict[str, list[dict[str, float]]]:
    """The ``blocks`` protocol (see the module docstring): per variant, its timed blocks."""
    data = make_data(args.block)
    variants = [v for v in VARIANTS if v != "saving"]
    trainers = {v: _trainer(v, os.path.join(workdir, v), interval=1 << 30)
                for v in variants if v not in TWIN_OF}
    hooks = [hook for _, _, _, hook in trainers.values() if hook is not None]
    steps = dict.fromkeys(trainers, args.block)  # the untimed block

    def only(hook: Any) -> None:  # the optimizer-step hook of ``hook`` alone, if any
        for other in hooks:
            other.torch.optimizer_steps.remove()
        if hook is not None:
            hook.torch.optimizer_steps.install()

    for model, loss_fn, opt, hook in trainers.values():  # the untimed block: the ring fills
        only(hook)
        train_steps(model, loss_fn, opt, data)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    gc.collect()
    order = random.Random(0)
    for _ in range(args.blocks):
        for variant in order.sample(variants, len(variants)):
            twin = TWIN_OF.get(variant, variant)
            model, loss_fn, opt, hook = trainers[twin]
            only(hook)
            if hook is not None and hook.recorder is not None:
                _set_check(hook, variant == twin)
            extra = _one_op(model) if variant == ONE_OP else None
            start = time.perf_counter()
            train_steps(model, loss_fn, opt, data)
            elapsed = time.perf_counter() - start
            steps[twin] += args.block
            if extra is not None:
                extra.remove()
            recorder = hook.recorder if hook is not None else None
            runs[variant].append({"ms_per_step": elapsed * 1000.0 / len(data),
                                  "ring_bytes": recorder.ring_bytes if recorder is not None else 0,
                                  "ring_steps": len(recorder.ring) if recorder is not None else 0})
    for variant, (_, _, _, hook) in trainers.items():
        if hook is not None:
            hook.close()
            if hook.step != steps[variant] - 1:
                raise RuntimeError(f"{variant}: the hook counted {hook.step + 1} steps of {steps[variant]}")
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=("blocks", "runs"), default="blocks")
    parser.add_argument("--steps", type=int, default=500, help="runs: steps per run")
    parser.add_argument("--runs", type=int, default=5, help="runs: measured runs per variant")
    parser.add_argument("--block", type=int, default=100, help="blocks: steps per block")
    parser.add_argument("--blocks", type=int, default=60, help="blocks: timed rounds")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    protocol.warn_if_busy()
    load_start, machine = protocol.load_average(), protocol.machine()
    with tempfile.TemporaryDirectory() as workdir:
        runs = (measure_blocks if args.protocol == "blocks" else measure_runs)(args, workdir)
    variants = list(runs)
    measured = protocol.pick({v: protocol.Measured(runs[v]) for v in variants}, "ms_per_step")
    ms = {v: m.median for v, m in measured.items()}
    paired = {v: protocol.paired(measured, "hook", v) for v in variants}
    out = {
        "ms_per_step": ms,
        "runs_ms_per_step": {v: m.runs for v, m in measured.items()},
        "recorder_over_hook": ms["recorder"] / ms["hook"],
        "paired_over_hook": {v: {"median": protocol.median(paired[v]), "min": min(paired[v]),
                                 "max": max(paired[v])} for v in variants},
        "recorder_added_over_hook_added": (ms["recorder"] - ms["none"]) / max(ms["hook"] - ms["none"], 1e-9),
        "check_share_of_step": {v: (ms[v] - ms[f"{v}_nocheck"]) / ms[f"{v}_nocheck"] for v in CHECKED},
        "check_share_paired": {v: protocol.median(r - 1.0 for r in protocol.paired(
            measured, f"{v}_nocheck", v)) for v in CHECKED},
        "one_op_share_of_step": (ms[ONE_OP] - ms["recorder_nocheck"]) / ms["recorder_nocheck"],
        "one_op_share_paired": protocol.median(r - 1.0 for r in protocol.paired(
            measured, "recorder_nocheck", ONE_OP)),
        "ring_bytes": max(r["ring_bytes"] for r in runs["recorder"]),
        "ring_steps": max(r["ring_steps"] for r in runs["recorder"]),
        "budget_bytes": BUDGET,
        "load": [load_start, protocol.load_average()],
        "machine": machine,
        "protocol": args.protocol,
        **({"block": args.block, "blocks": args.blocks} if args.protocol == "blocks"
           else {"steps": args.steps, "runs": args.runs}),
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    how = (f"{args.blocks} rounds of {args.block}-step blocks, variants alive at once"
           if args.protocol == "blocks" else f"{args.steps} steps, median of {args.runs} runs")
    print(f"flight recorder on the benchmark MLP ({how}, load {out['load'][0]:.1f} -> {out['load'][1]:.1f})")
    for v in variants:
        print(f"  {v:24s} {ms[v]:.4f} ms/step  ({ms[v] / ms['none']:.3f}x no hook)")
    print(f"  recorder / hook (step time)            {out['recorder_over_hook']:.3f}")
    print(f"  recorder's added time / hook's added   {out['recorder_added_over_hook_added']:.2f}")
    for v in CHECKED:
        print(f"  non-finite check alone, share of the step ({v}): "
              f"{out['check_share_of_step'][v] * 100:+.1f}%; paired {out['check_share_paired'][v] * 100:+.1f}%")
    print(f"  one PyTorch op and one read, share of the step (yardstick, {ONE_OP} / recorder_nocheck): "
          f"{out['one_op_share_of_step'] * 100:+.1f}%; paired {out['one_op_share_paired'] * 100:+.1f}%")
    print(f"  ring: {out['ring_steps']} steps, {out['ring_bytes']} bytes (budget {BUDGET})")
    print("  / hook: ratio of medians; paired within rounds, median [min, max]")
    for v in ("noop_hooks", "lean", "lean_minmax", "recorder", "recorder_nocheck", ONE_OP, "recorder_minmax",
              "recorder_minmax_nocheck"):
        pair = out["paired_over_hook"][v]
        print(f"  {v} / hook{'':{24 - len(v)}} {ms[v] / ms['hook']:.3f}; paired {pair['median']:.3f} "
              f"[{pair['min']:.3f}, {pair['max']:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
