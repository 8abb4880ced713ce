"""Time per training step of a small PyTorch MLP with no hook, with mltrace, with real smdebug,
or with W&B's ``watch``; also mltrace exporting TensorBoard summaries with or without histograms.

Runs in either venv (.venv: none, mltrace; .venv-legacy: none, mltrace, smdebug), or in the
bench-only .venv-bench-wandb that bench/setup_wandb_env.sh builds (none, mltrace, wandb). Model: MLP
32-64-1 (Linear, ReLU, Linear), MSE loss, SGD, batch 64, ``--steps`` steps on CPU with
``torch.set_num_threads(1)``. The hook saves the collections weights, biases, gradients and losses
every ``--interval`` steps (smdebug's SaveConfig(save_interval=N)). ``mltrace_tb`` adds
``export_tensorboard=True`` with no histograms (the loss as a TensorBoard scalar), ``mltrace_hist``
the same with the histograms of every weight, bias and gradient (``save_histogram``): their
ratio of added times is what TensorBoard histograms cost. ``mltrace_thread`` is ``mltrace`` with
``MLTRACE_WRITER=thread`` (files written by a thread of the training process, not the writer
process).

Protocol (bench/protocol.py): one warm-up run and ``--runs`` measured runs per library, the
median reported. A run is: fresh model, fresh hook on a fresh out_dir, ``--steps`` steps, then
``hook.close()``; the timed region is the training loop *plus* close(), because both libraries may
defer writing to a background thread and close() waits for it. Hook construction and registration
are not timed (once per job, not per step). ms/step = timed region / steps. Each run also reports
process CPU time per step (all threads), a cross-check that other processes' load hardly moves.

``--lib`` takes one library or a comma-separated list (``none,mltrace,smdebug``): with several,
their runs are interleaved (warm-up of each, then measured run k of each in turn), so that all of
them see the same machine state; that is how bench/run_pytorch.py measures them side by side.

Examples:
    .venv/bin/python bench/pytorch_overhead.py --lib none,mltrace --interval 1
    .venv-legacy/bin/python bench/pytorch_overhead.py --lib none,mltrace,smdebug --json
    .venv/bin/python bench/pytorch_overhead.py --lib mltrace --write-trial /tmp/t_mltrace
    .venv-bench-wandb/bin/python bench/pytorch_overhead.py --lib none,mltrace,wandb
    .venv/bin/python bench/pytorch_overhead.py --lib none,mltrace_tb,mltrace_hist
    .venv-legacy/bin/python bench/pytorch_overhead.py --lib none,mltrace,mltrace_thread,smdebug --interval 1
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

# Quiet both libraries before they are imported (their log lines are not what is measured).
os.environ.setdefault("SMDEBUG_LOG_LEVEL", "error")
os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import torch
from torch import nn

import protocol

LIBS = ("none", "mltrace", "mltrace_thread", "mltrace_tb", "mltrace_hist", "smdebug", "wandb")
COLLECTIONS = ["weights", "biases", "gradients", "losses"]
BATCH, N_IN, N_HIDDEN, N_OUT = 64, 32, 64, 1


def make_data(steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One fixed batch per step, generated once (data generation is not part of a step)."""
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(BATCH, N_IN, generator=gen), torch.randn(BATCH, N_OUT, generator=gen))
        for _ in range(steps)
    ]


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(N_IN, N_HIDDEN), nn.ReLU(), nn.Linear(N_HIDDEN, N_OUT))


def hook_factory(lib: str) -> Callable[[str, int, nn.Module, nn.Module], Any] | None:
    """A function (out_dir, interval, model, loss_fn) -> hook for ``lib``; None for no hook.

    The library is imported here, so a venv without smdebug can still run the others.
    """
    if lib == "none":
        return None
    if lib == "wandb":
        return lambda out_dir, interval, model, loss_fn: WandbWatch(out_dir, interval, model)
    if lib.startswith("mltrace"):
        import mltrace.pytorch as smd
    elif lib == "smdebug":
        import smdebug.pytorch as smd  # type: ignore[no-redef]
    else:
        raise SystemExit(f"--lib {lib!r}: choose from {', '.join(LIBS)}")

    def create(out_dir: str, interval: int, model: nn.Module, loss_fn: nn.Module) -> Any:
        # mltrace_thread: the trial's files written by a thread of this process, as before the
        # writer process (mltrace.writer.process); read when the writer is made, at the first step.
        os.environ["MLTRACE_WRITER"] = "thread" if lib == "mltrace_thread" else "process"
        export = {"export_tensorboard": True} if lib in ("mltrace_tb", "mltrace_hist") else {}
        hook = smd.Hook(
            out_dir=out_dir,
            save_config=smd.SaveConfig(save_interval=interval),
            include_collections=list(COLLECTIONS),
            **export,
        )
        if lib == "mltrace_tb":  # the TensorBoard export without histograms (the loss scalar)
            for name in COLLECTIONS:
                hook.get_collection(name).save_histogram = False
        hook.register_module(model)
        hook.register_loss(loss_fn)
        return hook

    return create


class WandbWatch:
    """What a W&B user does for the same job: ``run.watch(model, log="all", log_freq=interval)``
    (histograms of parameters and gradients) in an offline run, and the loss logged each step
    (the losses collection's counterpart). ``close()`` finishes the run, writing its files.
    System-metrics sampling and console capture are off (they are not what is compared).
    Needs the bench-only environment of bench/setup_wandb_env.sh: wandb is never a dependency."""

    def __init__(self, out_dir: str, interval: int, model: nn.Module) -> None:
        import wandb

        os.makedirs(out_dir, exist_ok=True)
        settings = wandb.Settings(console="off", x_disable_stats=True, x_disable_machine_info=True,
                                  silent=True)
        self.run = wandb.init(mode="offline", dir=out_dir, project="mltrace-bench",
                              settings=settings)
        self.run.watch(model, log="all", log_freq=interval)

    def after_step(self, loss: torch.Tensor) -> None:
        self.run.log({"loss": loss.item()})

    def close(self) -> None:
        self.run.finish()


def train_steps(model: nn.Module, loss_fn: nn.Module, opt: torch.optim.Optimizer,
                data: list[tuple[torch.Tensor, torch.Tensor]],
                after_step: Callable[[torch.Tensor], None] | None = None) -> None:
    """The benchmarks' training loop: one SGD step per batch, ``after_step(loss)`` after each."""
    for x, y in data:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if after_step is not None:
            after_step(loss)


def one_run(
    factory: Callable | None,
    out_dir: str | None,
    interval: int,
    data: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[float, float]:
    """One training run; returns (wall ms per step, process CPU ms per step), loop + hook.close().

    CPU time is that of the whole process (all threads, the libraries' writer threads included):
    unlike wall time it hardly moves when other processes load the machine.
    """
    model = make_model()
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = factory(out_dir, interval, model, loss_fn) if factory is not None else None
    gc.collect()
    cpu_start = time.process_time()
    start = time.perf_counter()
    train_steps(model, loss_fn, opt, data, hook.after_step if isinstance(hook, WandbWatch) else None)
    if hook is not None:
        hook.close()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    return elapsed * 1000.0 / len(data), cpu * 1000.0 / len(data)


def library_version(lib: str) -> str | None:
    if lib == "none":
        return None
    module = __import__(lib.split("_")[0])  # mltrace_tb, mltrace_hist: mltrace
    return getattr(module, "__version__", None)


def benchmark(
    libs: list[str], interval: int, steps: int, runs: int, workdir: str
) -> dict[str, Any]:
    data = make_data(steps)
    factories = {lib: hook_factory(lib) for lib in libs}
    counter = 0

    def timed(lib: str) -> tuple[float, float]:
        nonlocal counter
        counter += 1
        out_dir = os.path.join(workdir, f"{lib}_{interval}_{counter}") if factories[lib] else None
        try:
            return one_run(factories[lib], out_dir, interval, data)
        finally:
            if out_dir:
                shutil.rmtree(out_dir, ignore_errors=True)

    measured = protocol.interleaved({lib: functools.partial(timed, lib) for lib in libs}, runs)
    wall, cpu = protocol.pick(measured, 0), protocol.pick(measured, 1)
    return {
        lib: {
            "ms_per_step": wall[lib].median if runs else None,
            "cpu_ms_per_step": cpu[lib].median if runs else None,
            "runs_ms_per_step": wall[lib].runs,
            "runs_cpu_ms_per_step": cpu[lib].runs,
            "warmup_ms_per_step": wall[lib].warmup,
            "version": library_version(lib),
        }
        for lib in libs
    }


def environment() -> dict[str, Any]:
    import numpy as np

    machine = protocol.machine()
    return {
        "python": machine["python"],
        "executable": machine["executable"],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": machine["cores"],
        "machine": machine,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--lib",
        default="none",
        help="none, mltrace, smdebug or wandb, or a comma-separated list to interleave",
    )
    parser.add_argument("--interval", type=int, default=1, help="save_interval of the hook")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5, help="measured runs (after one warm-up)")
    parser.add_argument(
        "--workdir", default=None, help="where trials are written (default: a temp dir)"
    )
    parser.add_argument(
        "--write-trial",
        metavar="DIR",
        default=None,
        help="instead of benchmarking, write one run's trial to DIR and keep it",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    libs = [lib.strip() for lib in args.lib.split(",") if lib.strip()]
    for lib in libs:
        if lib not in LIBS:
            parser.error(f"--lib {lib!r}: choose from {', '.join(LIBS)}")
    if args.interval < 1 or args.steps < 1 or args.runs < 0:
        parser.error("--interval and --steps must be >= 1, --runs >= 0")

    if args.write_trial:
        if len(libs) != 1 or libs[0] == "none":
            parser.error("--write-trial needs exactly one of --lib mltrace / --lib smdebug")
        if os.path.exists(args.write_trial):
            parser.error(f"--write-trial {args.write_trial}: exists; pass a new directory")
        ms, _cpu = one_run(
            hook_factory(libs[0]), args.write_trial, args.interval, make_data(args.steps)
        )
        result: dict[str, Any] = {
            "lib": libs[0],
            "interval": args.interval,
            "steps": args.steps,
            "trial": os.path.abspath(args.write_trial),
            "ms_per_step": ms,
            "version": library_version(libs[0]),
            "env": environment(),
        }
        print(json.dumps(result) if args.json else f"wrote {args.write_trial} ({ms:.3f} ms/step)")
        return 0

    protocol.warn_if_busy()
    env = environment()
    workdir = args.workdir or tempfile.mkdtemp(prefix="mltrace-bench-pytorch-")
    if args.workdir is None:
        # smdebug's hooks write training_job_end.ts again from their atexit handlers; handlers run
        # last-registered first, so this one (registered before any hook) removes what they leave.
        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    try:
        results = benchmark(libs, args.interval, args.steps, args.runs, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "interval": args.interval,
        "steps": args.steps,
        "runs": args.runs,
        "batch": BATCH,
        "model": f"{N_IN}-{N_HIDDEN}-{N_OUT}",
        "collections": COLLECTIONS,
        "results": results,
        "env": env,
        "load_end": protocol.load_average(),
    }
    if args.json:
        print(json.dumps(report))
    else:
        for lib, r in results.items():
            runs = ", ".join(f"{v:.3f}" for v in r["runs_ms_per_step"])
            print(
                f"{lib:12s} interval {args.interval:4d}: {r['ms_per_step']:.3f} ms/step, "
                f"CPU {r['cpu_ms_per_step']:.3f} ms/step (median of {args.runs}: {runs}; "
                f"warm-up {r['warmup_ms_per_step']:.3f})"
            )
        for peer in ("smdebug", "wandb"):
            if {"none", "mltrace", peer} <= set(results):
                added = {lib: results[lib]["ms_per_step"] - results["none"]["ms_per_step"]
                         for lib in ("mltrace", peer)}
                print(f"added time, mltrace / {peer}: {added['mltrace']:.3f} / {added[peer]:.3f} ms/step "
                      f"= {added['mltrace'] / added[peer]:.3f} (a regression check: "
                      "bench/transformer_overhead.py holds the targets)")
        if {"none", "mltrace_tb", "mltrace_hist"} <= set(results):
            added = {lib: results[lib]["ms_per_step"] - results["none"]["ms_per_step"]
                     for lib in ("mltrace_tb", "mltrace_hist")}
            print(f"TensorBoard histograms: added {added['mltrace_hist']:.3f} ms/step with them, "
                  f"{added['mltrace_tb']:.3f} without: "
                  f"{added['mltrace_hist'] / added['mltrace_tb']:.2f}x (target: <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
