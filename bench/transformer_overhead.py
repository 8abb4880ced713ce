"""What monitoring adds to a transformer's training step: mltrace beside the same work done by
hand with torch and numpy, and beside its peers, on a nanoGPT-style model (bench/nanogpt.py).

Every setting trains the same model on the same batches (AdamW, one torch thread); the weights,
biases and gradients of its 50 parameter tensors and the loss are what is monitored. Settings:

* ``none``: no monitoring.
* ``raw``: mltrace's hook saving the raw tensors every step (collections weights, biases,
  gradients, losses; smdebug's ``SaveConfig(save_interval=1)``).
* ``raw_unsent``: the same hook with its hand-over to the writer process dropped (nothing is
  written): the hook's own work on the training thread (host copies, encoding, CRCs, checks).
  Beside ``tofile`` it says how far that work alone is from the floor; beside ``raw``, what
  handing the bytes over and writing them in the writer process adds to the step.
* ``tofile``: by hand, the same bytes (every parameter and its gradient after ``backward()``)
  written with numpy's ``tofile`` into one file per step on the same filesystem: the floor of
  saving raw tensors.
* ``reductions``: mltrace's hook saving only reductions (mean, max, min, std, l2) of the
  weights, biases and gradients, and the loss, every step.
* ``by_hand``: by hand, the same five reductions of every parameter and gradient after
  ``backward()``, per tensor (``aminmax``, ``std_mean``, ``vector_norm``), stacked, one host
  copy per step: what a user writes to have these numbers, and the yardstick of ``reductions``.
* ``by_hand_two_pass``: the same with the std from the mean and the norm of the centred values
  (two passes, as mltrace computes it on a CPU): a stricter yardstick on CPUs where torch's
  one-pass ``std_mean`` is slow.
* ``i100``: mltrace saving the raw tensors every 100 steps.
* ``i100_recorder``: the same with the flight recorder on, at its defaults.
* ``i100_recorder_gradients``: the same with the recorder keeping the gradients and the loss
  only (``FlightRecorderConfig(collections=["gradients", "losses"])``): half the tensors.
* ``recorder_by_hand``: by hand, what the recorder keeps at its defaults, each step: min and
  max of every weight, bias and gradient as it comes (the recorded collections are those the
  hook saves), and the loss, stacked, read on the host once a step, the last 50 steps kept.
* ``smdebug``: real smdebug 1.0.34 saving the raw tensors every step (.venv-legacy only).
* ``wandb``: W&B's ``watch(log="all", log_freq=1)`` in an offline run, and the loss logged
  (.venv-bench-wandb only, see setup_wandb_env.sh).

Protocol (bench/protocol.py): fresh model, optimizer, hook and out_dir per run; a run's time is
its training loop plus ``hook.close()`` (both libraries may write in the background), per step;
settings interleaved, a warm-up run each, the median of ``--runs`` with the spread. Settings
that save every 100 steps run ``--long-steps`` steps (so that a save falls due as often as it
would in training, and the recorder's ring fills); the others ``--steps``.

Examples:
    .venv/bin/python bench/transformer_overhead.py
    .venv/bin/python bench/transformer_overhead.py --settings none,reductions,by_hand --runs 7
    .venv-legacy/bin/python bench/transformer_overhead.py --settings none,raw,smdebug
    .venv-bench-wandb/bin/python bench/transformer_overhead.py --settings none,raw,wandb
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("SMDEBUG_LOG_LEVEL", "error")
os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import numpy as np
import torch
from torch import nn

import protocol
import pytorch_overhead
from nanogpt import GPTConfig, LanguageModelLoss, make_batches, make_model, make_optimizer

COLLECTIONS = ["weights", "biases", "gradients", "losses"]
REDUCED = ["weights", "biases", "gradients"]
EVERY_STEP = ("none", "raw", "raw_unsent", "tofile", "reductions", "by_hand", "by_hand_two_pass")
LONG = ("i100", "i100_recorder", "i100_recorder_gradients", "recorder_by_hand")
PEERS = ("smdebug", "wandb")
SETTINGS = (*EVERY_STEP, *LONG, *PEERS)
DEFAULT = ("none,raw,raw_unsent,tofile,reductions,by_hand,by_hand_two_pass,i100,i100_recorder,"
           "i100_recorder_gradients,recorder_by_hand")


class Monitor:
    """What a setting adds to the training loop: ``after_backward(model)`` and
    ``after_step(loss)`` are called in every step; ``close()`` once, inside the timed region."""

    def after_backward(self, model: nn.Module) -> None:
        pass

    def after_step(self, loss: torch.Tensor) -> None:
        pass

    def close(self) -> None:
        pass


class MltraceHook(Monitor):
    """mltrace's (or smdebug's: same API) hook, configured as a user would."""

    def __init__(self, lib: str, out_dir: str, model: nn.Module, loss: nn.Module, interval: int,
                 reductions: bool = False, recorder: Any = None) -> None:
        if lib == "smdebug":
            import smdebug.pytorch as smd
        else:
            import mltrace.pytorch as smd  # type: ignore[no-redef]
        options: dict[str, Any] = {} if recorder is None else {"flight_recorder": recorder}
        self.hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=interval),
                             include_collections=list(COLLECTIONS), **options)
        if reductions:
            for name in REDUCED:
                self.hook.get_collection(name).reduction_config = smd.ReductionConfig(
                    reductions=["mean", "max", "min", "std"], norms=["l2"])
        self.hook.register_module(model)
        self.hook.register_loss(loss)

    def close(self) -> None:
        self.hook.close()


class Unsent(MltraceHook):
    """mltrace's hook saving raw every step, its hand-over to the writer process dropped while
    it runs (a bench's patch of a private method: nothing reaches the disk)."""

    def __init__(self, out_dir: str, model: nn.Module, loss: nn.Module) -> None:
        from mltrace.writer import process

        super().__init__("mltrace", out_dir, model, loss, 1)
        self.channel = process._Channel  # noqa: SLF001 - a bench's patch
        self.add = self.channel.add
        self.channel.add = lambda *args: None  # type: ignore[method-assign]

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.channel.add = self.add  # type: ignore[method-assign]


class ToFile(Monitor):
    """Every parameter and gradient written with numpy's tofile, one file per step."""

    def __init__(self, out_dir: str) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir, self.step = out_dir, 0

    def after_backward(self, model: nn.Module) -> None:
        with open(os.path.join(self.out_dir, f"{self.step:06d}.bin"), "wb") as f:
            for p in model.parameters():
                p.detach().numpy().tofile(f)
                p.grad.numpy().tofile(f)  # type: ignore[union-attr]
        self.step += 1


def five(t: torch.Tensor) -> torch.Tensor:
    """min, max, std, mean, l2 of ``t`` as one 1-d tensor, in as few kernels as torch offers."""
    mn, mx = torch.aminmax(t)
    std, mean = torch.std_mean(t, correction=0)
    return torch.stack([mn, mx, std, mean, torch.linalg.vector_norm(t)])


def five_two_pass(t: torch.Tensor) -> torch.Tensor:
    """:func:`five` with the std as the norm of the centred values over sqrt(n): two passes,
    several times faster than ``std_mean`` on a CPU without AVX2 (what mltrace does there)."""
    mn, mx = torch.aminmax(t)
    mean = t.mean()
    std = torch.linalg.vector_norm(t - mean) / t.numel() ** 0.5
    return torch.stack([mn, mx, std, mean, torch.linalg.vector_norm(t)])


class ByHand(Monitor):
    """The five reductions of every parameter and gradient, stacked, one host copy a step."""

    def __init__(self, reductions: Callable[[torch.Tensor], torch.Tensor] = five) -> None:
        self.kept: list[list[float]] = []
        self.reductions = reductions

    def after_backward(self, model: nn.Module) -> None:
        with torch.no_grad():
            parts = [self.reductions(t) for p in model.parameters() for t in (p, p.grad)]
            self.kept.append(torch.cat(parts).tolist())


class RecorderByHand(Monitor):
    """What the flight recorder keeps at its defaults, by hand: min and max of every weight and
    bias as the step begins (a forward pre-hook on the model) and of every gradient as it comes
    (a hook on each parameter), one ``aminmax`` each, and the loss; one read on the host per
    step (the finite check), the last 50 steps kept."""

    def __init__(self, model: nn.Module) -> None:
        self.params = list(model.parameters())
        self.parts: list[torch.Tensor] = []
        self.ring: list[list[float]] = []
        self.handles = [model.register_forward_pre_hook(self._weights)]
        self.handles += [p.register_hook(self._gradient) for p in self.params]

    def _weights(self, module: nn.Module, inputs: Any) -> None:
        with torch.no_grad():
            self.parts += [torch.stack(torch.aminmax(p)) for p in self.params]

    def _gradient(self, grad: torch.Tensor) -> None:
        self.parts.append(torch.stack(torch.aminmax(grad)))

    def after_step(self, loss: torch.Tensor) -> None:
        self.parts.append(loss.detach().reshape(1))
        values = torch.cat(self.parts).tolist()
        self.parts = []
        if not all(np.isfinite(values)):
            raise FloatingPointError("not finite")
        self.ring = [*self.ring[-49:], values]

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


class WandbWatch(pytorch_overhead.WandbWatch, Monitor):
    """W&B's ``watch(model, log="all")`` in an offline run, the loss logged after each step: the
    MLP benchmark's (bench/pytorch_overhead.py), the same settings, as a Monitor."""


def _recorder(setting: str) -> Any:
    """The ``flight_recorder`` option of an i100 setting (None: no recorder)."""
    if setting == "i100_recorder_gradients":
        from mltrace import FlightRecorderConfig

        return FlightRecorderConfig(collections=["gradients", "losses"])
    return True if setting == "i100_recorder" else None


def monitor(setting: str, out_dir: str, model: nn.Module, loss: nn.Module) -> Monitor:
    """The setting's monitor, made before the timed region (once per job, not per step)."""
    if setting == "none":
        return Monitor()
    if setting in ("raw", "smdebug"):
        return MltraceHook("smdebug" if setting == "smdebug" else "mltrace", out_dir, model, loss, 1)
    if setting == "reductions":
        return MltraceHook("mltrace", out_dir, model, loss, 1, reductions=True)
    if setting == "raw_unsent":
        return Unsent(out_dir, model, loss)
    if setting.startswith("i100"):
        return MltraceHook("mltrace", out_dir, model, loss, 100, recorder=_recorder(setting))
    if setting == "tofile":
        return ToFile(out_dir)
    if setting == "by_hand":
        return ByHand()
    if setting == "by_hand_two_pass":
        return ByHand(five_two_pass)
    if setting == "recorder_by_hand":
        return RecorderByHand(model)
    if setting == "wandb":
        return WandbWatch(out_dir, 1, model)
    raise SystemExit(f"unknown setting {setting!r}: choose from {', '.join(SETTINGS)}")


#: Per setting, each measured run's CPU time off the training thread, ms per step: the other
#: threads of this process and the processes it started and reaped (mltrace's writer process).
#: What a library's background work takes from the rest of the machine, which the training
#: thread's wall time shows only as far as the cores are busy.
OFF_THREAD: dict[str, list[float]] = {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _writer_pids() -> list[int]:
    """The pids of mltrace's live writer processes (the run's hook's, once it saved a step)."""
    process = sys.modules.get("mltrace.writer.process")
    return [] if process is None else [w.pid for w in list(process._LIVE)]  # noqa: SLF001 - a bench's look


def _wait_for_reaped(pids: list[int], deadline_s: float = 5.0) -> None:
    """Wait until these writer processes were reaped (their CPU time then counts in
    RUSAGE_CHILDREN): each exits once its hook closed its pipe, and a thread of the hook reaps
    it."""
    deadline = time.monotonic() + deadline_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
        if pids:
            time.sleep(0.01)


def one_run(setting: str, batches: list[tuple[torch.Tensor, torch.Tensor]], out_dir: str) -> float:
    """Milliseconds per step of one run: a fresh model and monitor, the loop, ``close()``. Its
    CPU time off the training thread goes to OFF_THREAD (outside the timed region)."""
    model = make_model()
    optimizer = make_optimizer(model)
    loss_fn = LanguageModelLoss()
    watch = monitor(setting, out_dir, model, loss_fn)
    gc.collect()
    children, process_cpu, thread_cpu = _children_cpu(), time.process_time(), time.thread_time()
    start = time.perf_counter()
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        watch.after_backward(model)
        optimizer.step()
        watch.after_step(loss)
    writers = _writer_pids()  # before close, which forgets them
    watch.close()
    elapsed = time.perf_counter() - start
    others = (time.process_time() - process_cpu) - (time.thread_time() - thread_cpu)
    _wait_for_reaped(writers)
    others += _children_cpu() - children
    OFF_THREAD.setdefault(setting, []).append(others * 1000.0 / len(batches))
    shutil.rmtree(out_dir, ignore_errors=True)
    return elapsed * 1000.0 / len(batches)


def report(results: dict[str, protocol.Measured]) -> list[str]:
    """The ratios the targets are stated in: of the medians' added times, and paired (round k
    of one setting against round k of the other, each less round k of its baseline: a machine
    that slows down for a while moves both), the median and range over rounds."""
    def ratio(ours: str, theirs: str, base: str) -> str | None:
        if not {ours, theirs, base} <= set(results):
            return None
        a = results[ours].median - results[base].median
        b = results[theirs].median - results[base].median
        paired = [x / y for x, y in zip(protocol.added_runs(results, base, ours),
                                        protocol.added_runs(results, base, theirs)) if y > 0]
        text = f"{a:.2f} / {b:.2f} ms = {a / b:.2f}" if b > 0 else f"{a:.2f} / {b:.2f} ms"
        if paired:
            text += (f"; paired by round {protocol.median(paired):.2f} "
                     f"({min(paired):.2f}..{max(paired):.2f})")
        return text

    lines = []
    pairs = [("reductions", "by_hand", "none", "reductions / by hand (target <= 1.2)"),
             ("reductions", "by_hand_two_pass", "none", "reductions / by hand, two-pass std (no target)"),
             ("raw", "tofile", "none", "raw / numpy tofile (target <= 1.5)"),
             ("raw_unsent", "tofile", "none", "raw without writing / numpy tofile (the hook's own work; no target)"),
             ("raw", "raw_unsent", "none", "raw / raw without writing (no target)"),
             ("raw", "smdebug", "none", "mltrace / smdebug, raw every step (target <= 1/15 = 0.067)"),
             ("raw", "wandb", "none", "mltrace / W&B watch, raw every step (target <= 1/15 = 0.067)"),
             ("i100_recorder", "recorder_by_hand", "none_long",
              "i100 + recorder / recorder by hand (its share: target <= 1.2)")]
    for ours, theirs, base, what in pairs:
        text = ratio(ours, theirs, base)
        if text is not None:
            lines.append(f"{what}: {text}")
    off = {name: runs[1:] for name, runs in OFF_THREAD.items() if name in results and runs[1:]}
    busy = [f"{name} {protocol.median(runs):.2f} ({min(runs):.2f}..{max(runs):.2f})"
            for name, runs in off.items() if protocol.median(runs) >= 0.05]
    if busy:  # the warm-up run left out
        lines.append("CPU off the training thread (other threads, writer process), ms/step: " + ", ".join(busy))
    base_long = results.get("none_long")
    if base_long is not None:
        for name in ("i100", "i100_recorder", "i100_recorder_gradients"):
            if name in results:
                a = results[name].median - base_long.median
                lines.append(f"{name}: {a:+.2f} ms/step = {100 * a / base_long.median:+.1f}% of the step"
                             + (" (target <= 3%)" if name == "i100_recorder" else ""))
        if {"i100", "i100_recorder"} <= set(results):
            a = results["i100_recorder"].median - results["i100"].median
            lines.append(f"the recorder alone (i100_recorder - i100): {a:+.2f} ms/step = "
                         f"{100 * a / base_long.median:+.1f}% of the step")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=DEFAULT, help=f"comma-separated, from {SETTINGS}")
    parser.add_argument("--steps", type=int, default=30, help="steps of a run saving every step")
    parser.add_argument("--long-steps", type=int, default=100,
                        help="steps of a run saving every 100 steps")
    parser.add_argument("--runs", type=int, default=5, help="measured runs of each (after a warm-up)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        parser.error(f"--settings {','.join(unknown)}: choose from {', '.join(SETTINGS)}")
    torch.set_num_threads(1)
    protocol.warn_if_busy()
    workdir = tempfile.mkdtemp(prefix="mltrace-bench-transformer-")
    try:
        results = protocol.step_groups(settings, LONG, args.steps, args.long_steps, args.runs, workdir,
                                       make_batches, one_run)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    protocol.print_step_report("nanoGPT step", make_model(), GPTConfig(), results, report(results), args.json,
                               {"torch": torch.__version__, "numpy": np.__version__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
