"""What the stability signals add to a transformer's training step: mltrace's ``stability``
collection beside the same quantities computed by hand with torch, on the SpikeBench model
(bench/spikebench; bench/nanogpt.py's transformer at SpikeBench's size).

Every setting trains the same model on the same batches (AdamW, one torch thread). Settings:

* ``none``: no monitoring.
* ``stability``: mltrace's hook with ``include_collections=["stability"]``, saving every step:
  per attention call and head the largest logit and the entropy, the output logits' log Z, max
  and entropy, every module output's max |a|, median |a| and (Linear) L2 norm, the gradient
  norms, the update the optimizer applied and Adam's state per parameter, and the loss.
* ``by_hand``: the same quantities written by hand with torch, as a user who wants these
  numbers would: forward hooks on the modules and on the model, torch's attention function
  wrapped to recompute the attention scores, ``torch._foreach_norm`` for the gradient norms, a
  copy of the parameters before the optimizer steps, a loop over Adam's state after it; the
  step's values concatenated, copied to the host once and appended to a file. The yardstick
  of ``stability`` (target: at most 1.2 times its added time).
* ``stability_i10``: mltrace saving the signals every 10 steps (target: at most 5% added to
  the step).
* ``by_hand_i10``: the by-hand computation every 10 steps (the hooks return at once on the
  others): the floor of ``stability_i10``.

Protocol (bench/protocol.py): fresh model, optimizer, hook and out_dir per run; a run's time is
its training loop plus ``hook.close()``, per step; settings interleaved, a warm-up run each, the
median of ``--runs`` with the spread, ratios of the medians' added times and paired by round.

Examples:
    .venv/bin/python bench/stability_overhead.py
    .venv/bin/python bench/stability_overhead.py --settings none,stability,by_hand --runs 7
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import protocol
from nanogpt import LanguageModelLoss, make_batches, make_model, make_optimizer

SETTINGS = ("none", "stability", "by_hand", "stability_i10", "by_hand_i10")
LONG = ("stability_i10", "by_hand_i10")


def spikebench_config() -> Any:
    """SpikeBench's model size (bench/spikebench/train.py)."""
    from spikebench.train import CONFIG

    return CONFIG


class Monitor:
    """What a setting adds to the loop: called around ``optimizer.step()``; ``close()`` once,
    inside the timed region."""

    def before_step(self) -> None:
        pass

    def after_step(self, loss: torch.Tensor) -> None:
        pass

    def close(self) -> None:
        pass


class Mltrace(Monitor):
    """mltrace's hook with the stability collection, as a user would set it up."""

    def __init__(self, out_dir: str, model: nn.Module, loss: nn.Module, interval: int) -> None:
        import mltrace.pytorch as smd

        self.hook = smd.Hook(out_dir=out_dir, include_collections=["stability"],
                             save_config=smd.SaveConfig(save_interval=interval))
        self.hook.register_module(model)
        self.hook.register_loss(loss)

    def close(self) -> None:
        self.hook.close()


class ByHand(Monitor):
    """The same quantities by hand with torch; one host copy per step, appended to a file."""

    def __init__(self, out_dir: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                 interval: int = 1) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.interval, self.step, self.active = interval, 0, True
        self.file = open(os.path.join(out_dir, "signals.f32"), "wb")  # noqa: SIM115 - closed in close()
        self.model, self.optimizer = model, optimizer
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.values: list[torch.Tensor] = []
        self.before: list[torch.Tensor] = []
        self.handles = [m.register_forward_hook(self._outliers) for m in model.modules() if m is not model]
        self.handles.append(model.register_forward_hook(self._logits))
        self.sdpa = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._attention  # type: ignore[assignment]

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self.sdpa(q, k, v, *args, **kwargs)
        if not self.active:
            return out
        with torch.no_grad():
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            t = scores.shape[-1]
            scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
            p = torch.softmax(scores, -1)
            self.values += [scores.amax(dim=(0, 2, 3)), (-torch.special.xlogy(p, p).sum(-1)).mean(dim=(0, 2))]
        return out

    def _outliers(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if not self.active or not isinstance(output, torch.Tensor) or not output.is_floating_point():
            return
        with torch.no_grad():
            a = output.detach().reshape(-1).abs()
            top, median = a.max(), a[:: max(1, a.numel() // 4096)][:4096].median()
            parts = [top, median, top / median]
            if isinstance(module, nn.Linear):
                parts.append(torch.linalg.vector_norm(a))
            self.values.append(torch.stack(parts))

    def _logits(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        if not self.active:
            return
        with torch.no_grad():
            x = output.detach().reshape(-1, output.shape[-1])
            log_z = torch.logsumexp(x, -1)
            entropy = log_z - (torch.softmax(x, -1) * x).sum(-1)
            self.values.append(torch.stack([log_z.mean(), log_z.max(), x.max(), entropy.mean()]))

    def before_step(self) -> None:
        if not self.active:
            return
        with torch.no_grad():
            norms = torch.stack(torch._foreach_norm([p.grad for p in self.params]))  # type: ignore[misc]
            self.values += [norms, torch.linalg.vector_norm(norms).reshape(1)]
            self.before = [p.detach().clone() for p in self.params]

    def after_step(self, loss: torch.Tensor) -> None:
        self.step += 1
        if not self.active:
            self.active = self.step % self.interval == 0
            return
        self.active = self.step % self.interval == 0
        with torch.no_grad():
            for p, before in zip(self.params, self.before):
                delta = p.detach() - before
                l2 = torch.linalg.vector_norm(delta)
                state = self.optimizer.state[p]
                group = self.optimizer.param_groups[0]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                correction = 1 - group["betas"][1] ** float(state["step"])
                v_hat = v / correction
                positive = v > 0
                near = (positive & (v_hat.sqrt() < 10 * group["eps"])).sum() / positive.sum().clamp_min(1)
                self.values.append(torch.stack([
                    l2, delta.abs().max(), l2 / torch.linalg.vector_norm(before),
                    m.pow(2).mean().sqrt(), m.abs().max(), v_hat.mean(), v_hat.max(), near,
                    p.grad.pow(2).sum() / v_hat.sum(),  # type: ignore[union-attr]
                ]))
            self.values.append(loss.detach().reshape(1))
            flat = torch.cat([t.reshape(-1).float() for t in self.values]).numpy()
            flat.tofile(self.file)
            self.values, self.before = [], []

    def close(self) -> None:
        F.scaled_dot_product_attention = self.sdpa  # type: ignore[assignment]
        for handle in self.handles:
            handle.remove()
        self.file.close()


def monitor(setting: str, out_dir: str, model: nn.Module, loss: nn.Module,
            optimizer: torch.optim.Optimizer) -> Monitor:
    """The setting's monitor, made before the timed region."""
    if setting == "none":
        return Monitor()
    if setting in ("stability", "stability_i10"):
        return Mltrace(out_dir, model, loss, 10 if setting == "stability_i10" else 1)
    if setting in ("by_hand", "by_hand_i10"):
        return ByHand(out_dir, model, optimizer, 10 if setting == "by_hand_i10" else 1)
    raise SystemExit(f"unknown setting {setting!r}: choose from {', '.join(SETTINGS)}")


def one_run(setting: str, batches: list[tuple[torch.Tensor, torch.Tensor]], out_dir: str) -> float:
    """Milliseconds per step of one run: a fresh model and monitor, the loop, ``close()``."""
    config = spikebench_config()
    model = make_model(config)
    optimizer = make_optimizer(model)
    loss_fn = LanguageModelLoss()
    watch = monitor(setting, out_dir, model, loss_fn, optimizer)
    gc.collect()
    start = time.perf_counter()
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        watch.before_step()
        optimizer.step()
        watch.after_step(loss)
    watch.close()
    elapsed = time.perf_counter() - start
    shutil.rmtree(out_dir, ignore_errors=True)
    return elapsed * 1000.0 / len(batches)


def report(results: dict[str, protocol.Measured]) -> list[str]:
    """The ratios the targets are stated in (see transformer_overhead.report)."""
    lines = []
    if {"stability", "by_hand", "none"} <= set(results):
        a = results["stability"].median - results["none"].median
        b = results["by_hand"].median - results["none"].median
        paired = [x / y for x, y in zip(protocol.added_runs(results, "none", "stability"),
                                        protocol.added_runs(results, "none", "by_hand")) if y > 0]
        text = f"stability / by hand, every step (target <= 1.2): {a:.2f} / {b:.2f} ms"
        if b > 0:
            text += f" = {a / b:.2f}"
        if paired:
            text += f"; paired by round {protocol.median(paired):.2f} ({min(paired):.2f}..{max(paired):.2f})"
        lines.append(text)
        base = results["none"].median
        lines.append(f"stability every step: {100 * a / base:+.1f}% of the step; by hand {100 * b / base:+.1f}%")
    if {"stability_i10", "none_long"} <= set(results):
        base = results["none_long"].median
        a = results["stability_i10"].median - base
        lines.append(f"stability every 10 steps: {a:+.2f} ms/step = {100 * a / base:+.1f}% of the step (target <= 5%)")
        if "by_hand_i10" in results:
            b = results["by_hand_i10"].median - base
            lines.append(f"by hand every 10 steps (the floor): {b:+.2f} ms/step = {100 * b / base:+.1f}% of the step")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, from {SETTINGS}")
    parser.add_argument("--steps", type=int, default=30, help="steps of a run saving every step")
    parser.add_argument("--long-steps", type=int, default=100, help="steps of a run saving every 10 steps")
    parser.add_argument("--runs", type=int, default=5, help="measured runs of each (after a warm-up)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        parser.error(f"--settings {','.join(unknown)}: choose from {', '.join(SETTINGS)}")
    torch.set_num_threads(1)
    protocol.warn_if_busy()
    workdir = tempfile.mkdtemp(prefix="mltrace-bench-stability-")
    try:
        results = protocol.step_groups(settings, LONG, args.steps, args.long_steps, args.runs, workdir,
                                       lambda n: make_batches(n, spikebench_config()), one_run)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    config = spikebench_config()
    protocol.print_step_report("SpikeBench model", make_model(config), config, results, report(results), args.json,
                               {"torch": torch.__version__, "numpy": np.__version__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
