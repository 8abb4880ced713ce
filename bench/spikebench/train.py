"""One SpikeBench run: a small nanoGPT-style model trained char-level on the synthetic corpus,
one scenario injected, the mltrace hook saving every step as a user would configure it.

The model is bench/nanogpt.py's ``GPT`` at ``CONFIG`` (imported from the bench folder, which
run.py puts on ``sys.path``); AdamW as nanoGPT sets it (betas 0.9 and 0.95, weight decay 0.1),
gradients clipped to norm 1, the learning rate warmed up linearly over the first tenth of the
run, then a cosine from ``PEAK_LR`` down to ``MIN_LR``. One torch thread per process.
Clipping keeps gradient spikes out of the optimizer, as in most real training: it also decides
what a gradient-norm signal recorded after it can see.

``train(spec)`` trains in this process; ``train_distributed(spec)`` starts the scenario's
workers (DistributedDataParallel, gloo on 127.0.0.1, one process each through
``torch.multiprocessing.spawn``). Both write ``<run_dir>/trial`` (the hook's out_dir) and return
a ``RunRecord``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from .corpus import ALPHABET, make_batches
from .scenarios import Scenario, draw, scenario_class
from nanogpt import GPT, GPTConfig, LanguageModelLoss, make_model, make_optimizer

CONFIG = GPTConfig(blocks=4, width=64, heads=4, context=64, vocabulary=len(ALPHABET), batch=8)
PEAK_LR = 1e-3
MIN_LR = 1e-4
#: Gradients are clipped to this norm (nanoGPT's default); RunSpec.clip overrides it.
CLIP = 1.0
#: The loss has diverged at the first step from the injection on whose loss is not finite or
#: above DIVERGENCE_FACTOR times the median loss of the DIVERGENCE_WINDOW steps before it.
DIVERGENCE_FACTOR = 2.0
DIVERGENCE_WINDOW = 50


@dataclass(frozen=True)
class RunSpec:
    """What to train: a scenario ("healthy" for none), a seed, how long, where, which of the
    hook's collections to save (none: no hook), and the gradient-clipping norm (0: none)."""

    scenario: str
    seed: int
    steps: int
    run_dir: str
    collections: tuple[str, ...] = ("stability",)
    clip: float = CLIP

    @property
    def trial_dir(self) -> str:
        return os.path.join(self.run_dir, "trial")

    @property
    def workers(self) -> int:
        return scenario_class(self.scenario).workers


@dataclass
class RunRecord:
    """What a run did: where and when the fault struck, the losses (of worker 0), when the loss
    diverged, and the wall time of the training loop with ``hook.close()``."""

    scenario: str
    seed: int
    steps: int
    trial_dir: str
    workers: int
    injected_at: int | None
    layer: int | None
    losses: list[float | None] = field(default_factory=list)
    diverged_at: int | None = None
    wall_s: float = 0.0
    collections: list[str] = field(default_factory=list)
    clip: float = CLIP

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def learning_rate(step: int, steps: int) -> float:
    """Linear warm-up over the first tenth of the run, then a cosine to MIN_LR."""
    warmup = max(1, steps // 10)
    if step < warmup:
        return PEAK_LR * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return MIN_LR + 0.5 * (PEAK_LR - MIN_LR) * (1.0 + math.cos(math.pi * progress))


def divergence_step(losses: Sequence[float | None], at: int | None) -> int | None:
    """The first step from ``at`` on whose loss is not finite or above DIVERGENCE_FACTOR times
    the median of the DIVERGENCE_WINDOW losses before ``at``; None if none is (or no ``at``)."""
    if at is None:
        return None
    before = [v for v in losses[max(0, at - DIVERGENCE_WINDOW):at]
              if v is not None and math.isfinite(v)]
    base = statistics.median(before) if before else math.inf
    for step in range(at, len(losses)):
        value = losses[step]
        if value is None or not math.isfinite(value) or value > DIVERGENCE_FACTOR * base:
            return step
    return None


def _make_hook(spec: RunSpec, model: nn.Module, loss: nn.Module) -> Any:
    if not spec.collections:
        return None
    import mltrace.pytorch as smd

    hook = smd.Hook(out_dir=spec.trial_dir, include_collections=list(spec.collections),
                    save_config=smd.SaveConfig(save_interval=1),
                    include_workers="all" if spec.workers > 1 else "one")
    hook.register_module(model)
    hook.register_loss(loss)
    return hook


def _loop(spec: RunSpec, model: GPT, net: nn.Module, scenario: Scenario, rank: int
          ) -> tuple[list[float | None], float]:
    """Train ``net`` (``model`` or its DDP wrapper); the losses and the loop's wall time."""
    optimizer = make_optimizer(model, PEAK_LR)
    loss_fn = LanguageModelLoss()
    batches = make_batches(spec.steps, CONFIG.batch, CONFIG.context, spec.seed * 1000 + rank)
    start = time.perf_counter()
    hook = _make_hook(spec, model, loss_fn)
    losses: list[float | None] = []
    for step in range(spec.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, spec.steps)
        x, y = scenario.inject(step, model, optimizer, batches[step])
        loss = loss_fn(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if spec.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), spec.clip)
        optimizer.step()
        value = loss.item()
        losses.append(value if math.isfinite(value) else None)
    if hook is not None:
        hook.close()
    return losses, time.perf_counter() - start


def _fresh(spec: RunSpec) -> None:
    shutil.rmtree(spec.run_dir, ignore_errors=True)
    os.makedirs(spec.run_dir)


def _record(spec: RunSpec, at: int | None, layer: int | None, losses: list[float | None],
            wall: float) -> RunRecord:
    record = RunRecord(spec.scenario, spec.seed, spec.steps, spec.trial_dir, spec.workers, at,
                       layer, losses, divergence_step(losses, at), wall, list(spec.collections),
                       spec.clip)
    with open(os.path.join(spec.run_dir, "run.json"), "w") as f:
        json.dump(record.as_dict(), f)
    return record


def train(spec: RunSpec) -> RunRecord:
    """Train one single-process run of ``spec`` and write its trial and ``run.json``."""
    torch.set_num_threads(1)
    _fresh(spec)
    at, layer = draw(spec.scenario, spec.seed, spec.steps, CONFIG.blocks)
    model = make_model(CONFIG, spec.seed)
    scenario = scenario_class(spec.scenario)(at, layer, spec.seed)
    losses, wall = _loop(spec, model, model, scenario, rank=0)
    return _record(spec, at, layer, losses, wall)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, spec: RunSpec, port: int) -> None:
    """One worker of a distributed run (torch.multiprocessing.spawn's entry point)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=spec.workers)
    try:
        at, layer = draw(spec.scenario, spec.seed, spec.steps, CONFIG.blocks)
        model = make_model(CONFIG, spec.seed)
        ddp = nn.parallel.DistributedDataParallel(model)
        scenario = scenario_class(spec.scenario)(at, layer, spec.seed, rank)
        losses, wall = _loop(spec, model, ddp, scenario, rank)
        with open(os.path.join(spec.run_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"losses": losses, "wall_s": wall}, f)
    finally:
        dist.destroy_process_group()


def train_distributed(spec: RunSpec) -> RunRecord:
    """Train ``spec`` with one process per worker; worker 0's losses are the record's."""
    import torch.multiprocessing as mp

    _fresh(spec)
    if os.path.exists("/sys/class/net/lo"):  # gloo's own connections on loopback too
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_rank_main, args=(spec, _free_port()), nprocs=spec.workers, join=True)
    with open(os.path.join(spec.run_dir, "rank0.json")) as f:
        rank0 = json.load(f)
    at, layer = draw(spec.scenario, spec.seed, spec.steps, CONFIG.blocks)
    return _record(spec, at, layer, rank0["losses"], rank0["wall_s"])


def run(spec: RunSpec) -> RunRecord:
    """Train ``spec`` in the way its scenario needs (one process, or one per worker)."""
    return train_distributed(spec) if spec.workers > 1 else train(spec)
