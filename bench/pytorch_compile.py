"""Compiled PyTorch training with and without mltrace's hook, side by side in one process.

What is measured: an MLP (``--width`` wide, 4 Linear layers with ReLU, batch 64, SGD) compiled
with ``torch.compile`` (inductor by default), trained ``--steps`` steps per run. ``--model mlp``
(the default) is a model class of its own, as training scripts compile; ``--model sequential``
is the same layers in an ``nn.Sequential``, whose call TorchDynamo traces from the outside
(torch.nn's own classes are in its trace rules): the hook's step boundary on it, registered
before compiling, is one graph break.

- ``compiled``: the compiled model, no hook;
- ``hook-after``: ``hook.register_module(torch.compile(model))``;
- ``hook-before``: ``hook.register_module(model)`` and then ``torch.compile(model)``;
- ``eager``: the model not compiled, no hook (for scale).

The hook saves weights, biases, gradients and losses every ``--interval`` steps (100). For each
variant a fresh compile is made first, untimed; TorchDynamo's counters are read after it: graph
breaks and unique graphs. Then, with ``--protocol blocks`` (the default), the four variants are
made once and stay alive, and ``--blocks`` (40) rounds each time ``--interval`` steps of every
variant in turn, the order alternating: a block holds exactly one saving step, so its time is
the step time at that interval, and each variant's ratio is taken within a round against the
compiled model's block (the "paired" column; the compiled baseline itself moves by a few
percent between processes and compiles, which a run-per-process protocol cannot pair away).
``hook.close()`` is timed apart. With ``--protocol runs`` (the protocol of earlier tables),
``--runs`` runs are interleaved across the variants, each a fresh model and hook compiled
afresh, 5 untimed steps and then ``--steps`` timed steps plus ``hook.close()``. Either way the
bench checks the hook counted every step (TorchDynamo does not guard on module hooks: a graph
cached for another copy of the model would skip the new copy's hooks). One thread; medians and
paired ratios from bench/protocol.py.

Run: ``.venv/bin/python bench/pytorch_compile.py [--blocks 40] [--protocol runs --runs 5 --steps 300]``
Writes bench/results/pytorch_compile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

import mltrace.pytorch as smd

import protocol

VARIANTS = ("compiled", "hook-after", "hook-before", "eager")
BATCH = 64
WARM_STEPS = 5  # untimed steps of every run before its timed steps


class MLP(nn.Module):
    """4 Linear layers with ReLU between them: a model class of its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width if i < 3 else 1) for i in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < 3:
                x = torch.relu(x)
        return x


def _model(width: int, kind: str = "sequential") -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        return MLP(width)
    layers: list[nn.Module] = []
    for i in range(4):
        layers += [nn.Linear(width, width if i < 3 else 1), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Run:
    """One variant: its model, optimizer, maybe a hook, and a step function."""

    def __init__(self, variant: str, width: int, interval: int, backend: str, out_dir: str,
                 kind: str = "mlp") -> None:
        self.variant, self.hook = variant, None
        model = _model(width, kind)
        self.loss_fn = nn.MSELoss()
        if variant.startswith("hook"):
            self.hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=interval),
                                 include_collections=["weights", "biases", "gradients", "losses"])
            if variant == "hook-before":
                self.hook.register_module(model)
        self.called = model if variant == "eager" else torch.compile(model, backend=backend)
        if self.hook is not None:
            if variant == "hook-after":
                self.hook.register_module(self.called)
            self.hook.register_loss(self.loss_fn)
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.opt.zero_grad()
        self.loss_fn(self.called(x), y).backward()
        self.opt.step()

    def close(self) -> None:
        if self.hook is not None:
            self.hook.close()


def _setup(width: int, steps: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], str]:
    """One thread, ``steps`` batches of seeded data, and a fresh folder for the trials."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, width, generator=gen), torch.randn(BATCH, 1, generator=gen))
            for _ in range(steps)]
    return data, tempfile.mkdtemp(prefix="mltrace-compile-bench-")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    data, work = _setup(args.width, args.steps)
    compile_info: dict[str, dict[str, int]] = {}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for k in range(args.runs + 1):  # run 0 compiles and is the warm-up
        order = VARIANTS if k % 2 else tuple(reversed(VARIANTS))
        for variant in order:
            # Every run compiles afresh: TorchDynamo does not guard on module hooks, so a graph
            # cached for a hook-less copy of the model would run a later copy without its hooks.
            torch._dynamo.reset()
            if k == 0:
                counters.clear()
            run = Run(variant, args.width, args.interval, args.backend, f"{work}/{variant}-{k}",
                      args.model)

            for x, y in data[:WARM_STEPS]:  # a fresh model may recompile (or hit the
                run.step(x, y)                # compile cache): not part of the step time

            def loop(run: Run = run) -> None:
                for x, y in data:
                    run.step(x, y)
                run.close()

            elapsed = protocol.timed(loop)
            if run.hook is not None and run.hook.step != WARM_STEPS + args.steps - 1:
                raise RuntimeError(f"{variant}: the hook counted {run.hook.step + 1} steps of "
                                   f"{WARM_STEPS + args.steps}; its callbacks did not all run")
            if k == 0:
                compile_info[variant] = {
                    "graph_breaks": sum(counters["graph_break"].values()),
                    "unique_graphs": counters["stats"]["unique_graphs"]}
            else:
                times[variant].append(1000 * elapsed / args.steps)
    return {"ms_per_step": times, "compile": compile_info, "args": vars(args),
            "load": protocol.load_average(), "torch": torch.__version__}


def measure_blocks(args: argparse.Namespace) -> dict[str, Any]:
    """The ``blocks`` protocol: every variant alive at once, then ``--blocks`` rounds, each
    timing ``--interval`` steps of every variant in turn (the order alternating). A block holds
    exactly one saving step, so its time is the step time at that interval; a variant's ratio
    is taken per round, against the compiled model's block of the same round. Graph counts come
    from a fresh compile of each variant first. ``close`` is timed once per variant, apart."""
    data, work = _setup(args.width, args.interval)
    compile_info: dict[str, dict[str, int]] = {}
    for variant in VARIANTS:  # each compiled afresh, for its graph counts
        torch._dynamo.reset()
        counters.clear()
        run = Run(variant, args.width, args.interval, args.backend, f"{work}/{variant}-graphs", args.model)
        for x, y in data[:WARM_STEPS]:
            run.step(x, y)
        run.close()
        compile_info[variant] = {"graph_breaks": sum(counters["graph_break"].values()),
                                 "unique_graphs": counters["stats"]["unique_graphs"]}
    torch._dynamo.reset()
    runs = {v: Run(v, args.width, args.interval, args.backend, f"{work}/{v}", args.model) for v in VARIANTS}
    for run in runs.values():  # the compile, then one untimed block
        for x, y in data[:WARM_STEPS] + data:
            run.step(x, y)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for k in range(args.blocks):
        for variant in VARIANTS if k % 2 else tuple(reversed(VARIANTS)):
            run = runs[variant]
            start = time.perf_counter()
            for x, y in data:
                run.step(x, y)
            times[variant].append(1000 * (time.perf_counter() - start) / args.interval)
    close_ms = {v: 1000 * protocol.timed(runs[v].close) for v in VARIANTS}
    for variant, run in runs.items():
        if run.hook is not None and run.hook.step != WARM_STEPS + args.interval * (args.blocks + 1) - 1:
            raise RuntimeError(f"{variant}: the hook counted {run.hook.step + 1} steps; its callbacks did not all run")
    return {"ms_per_step": times, "compile": compile_info, "close_ms": close_ms, "args": vars(args),
            "load": protocol.load_average(), "torch": torch.__version__}


def table(result: dict[str, Any]) -> str:
    """The medians, their ratio to ``compiled``, and the median of the runs' own ratios (run k
    of a variant over run k of ``compiled``, measured next to each other: the steadier one)."""
    times = {v: protocol.Measured(runs) for v, runs in result["ms_per_step"].items()}
    base = times["compiled"].median
    rows = ["| variant | ms/step (median) | / compiled | paired | graph breaks | graphs |",
            "|---|---|---|---|---|---|"]
    for variant in VARIANTS:
        med = times[variant].median
        paired = protocol.median(protocol.paired(times, "compiled", variant))
        info = result["compile"].get(variant, {})
        rows.append(f"| {variant} | {med:.3f} | {med / base:.3f} | {paired:.3f} | "
                    f"{info.get('graph_breaks', '-') if variant != 'eager' else '-'} | "
                    f"{info.get('unique_graphs', '-') if variant != 'eager' else '-'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--model", choices=("mlp", "sequential"), default="mlp")
    parser.add_argument("--interval", type=int, default=100)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--protocol", choices=("blocks", "runs"), default="blocks",
                        help="blocks: variants alive at once, interleaved blocks of --interval steps; "
                             "runs: a fresh model, hook and compile per run of --steps steps")
    parser.add_argument("--blocks", type=int, default=40)
    args = parser.parse_args(argv)
    torch._dynamo.config.cache_size_limit = 64  # the variants compile the same code several times
    protocol.warn_if_busy()
    machine = protocol.machine()
    result = measure_blocks(args) if args.protocol == "blocks" else measure(args)
    result["machine"] = machine
    print(table(result))
    if "close_ms" in result:
        print("close: " + ", ".join(f"{v} {ms:.2f} ms" for v, ms in result["close_ms"].items()))
    print(f"load average {result['load']:.2f}, torch {result['torch']}, backend {args.backend}, "
          f"model {args.model}, commit {machine['commit']}")
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results",
                           f"pytorch_compile{'' if args.model == 'mlp' else '_' + args.model}.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
