"""The failures SpikeBench injects: one class each, with the rules meant to catch it.

A scenario is made for one run with the step it strikes at and, where it has one, the block it
strikes (both drawn from the run's seed by ``draw``). The training loop calls
``inject(step, model, optimizer, batch)`` every step, after the learning rate of the step is
set and before the forward pass; it returns the batch to train on and may change the model's
weights or the optimizer's settings in place.

Sudden faults strike at one step (or switch something on there) and a rule should see them
within ``SUDDEN_DEADLINE`` steps; gradual ones degrade training over many steps and a rule should
see them before the loss diverges.
"""

from __future__ import annotations

import random
import types
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from .corpus import ALPHABET

Batch = tuple[torch.Tensor, torch.Tensor]
#: A sudden fault counts as caught when a meant-for rule fires this many steps after it or fewer.
SUDDEN_DEADLINE = 5
#: Where the injection step is drawn from, as fractions of the run's steps (150-350 of 500).
WINDOW = (0.3, 0.7)


class Scenario:
    """A run's injected failure (the base class is the healthy run: it injects nothing).

    Args:
        at: the step it strikes at (None: never).
        layer: the block it strikes (None where it strikes no block).
        seed: the run's seed (for whatever else a scenario draws).
        rank: the process's rank in a distributed run (0 otherwise).
    """

    name: ClassVar[str] = "healthy"
    #: False for the healthy runs, which inject nothing.
    injects: ClassVar[bool] = False
    #: The rules meant to catch it (any one of them counts).
    meant_for: ClassVar[tuple[str, ...]] = ()
    gradual: ClassVar[bool] = False
    strikes_layer: ClassVar[bool] = False
    #: How many processes the run trains with (DistributedDataParallel above 1).
    workers: ClassVar[int] = 1

    def __init__(self, at: int | None, layer: int | None, seed: int, rank: int = 0) -> None:
        self.at, self.layer, self.seed, self.rank = at, layer, seed, rank

    def inject(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: Batch) -> Batch:
        """The batch to train on at ``step`` (changing model or optimizer in place if due)."""
        return batch

    def describe(self) -> str:
        """What it does, in a few words (for the table)."""
        return "nothing injected"


class Fault(Scenario):
    """A scenario that injects a failure."""

    injects = True


class HealthyWorkers(Scenario):
    """A healthy run of two DistributedDataParallel workers (the workers rule's false alarms)."""

    name = "healthy_workers"
    workers = 2

    def describe(self) -> str:
        return "2 DDP workers, nothing injected"


class LrSpike(Fault):
    """The learning rate multiplied by ``factor`` for one optimizer step (a schedule bug)."""

    name = "lr_spike"
    meant_for = ("UpdateRatio", "LossSpike", "GradNormSpike")
    factor = 100.0

    def inject(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: Batch) -> Batch:
        if step == self.at:
            for group in optimizer.param_groups:
                group["lr"] *= self.factor  # the loop sets the next step's rate afresh
        return batch

    def describe(self) -> str:
        return f"learning rate x{self.factor:g} for one step"


def shuffled_targets(batch: Batch, seed: int) -> Batch:
    """The batch with its targets shuffled across every position of every window."""
    x, y = batch
    gen = torch.Generator().manual_seed(seed)
    flat = y.reshape(-1)
    return x, flat[torch.randperm(flat.numel(), generator=gen)].view_as(y)


class ShuffledLabels(Fault):
    """One poisoned batch: its targets shuffled (a corrupt shard, a misaligned record)."""

    name = "shuffled_labels"
    meant_for = ("LossSpike",)

    def inject(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: Batch) -> Batch:
        return shuffled_targets(batch, self.seed) if step == self.at else batch

    def describe(self) -> str:
        return "one batch with shuffled targets"


class RepeatedToken(Fault):
    """One poisoned batch made of a single rare character, inputs and targets (padding gone
    wrong, a corrupt file)."""

    name = "repeated_token"
    meant_for = ("LossSpike", "GradNormSpike")

    def inject(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: Batch) -> Batch:
        if step != self.at:
            return batch
        token = ALPHABET.index(random.Random(self.seed).choice("xyzqjkv"))
        return torch.full_like(batch[0], token), torch.full_like(batch[1], token)

    def describe(self) -> str:
        return "one batch of a single repeated character"


class CorruptedWeights(Fault):
    """One block's MLP ``c_fc`` weight multiplied by ``factor`` in place, outside autograd and
    the optimizer: a silent hardware fault (a flipped exponent bit)."""

    name = "corrupted_weights"
    meant_for = ("MassiveActivation", "LinearOutputGrowth")
    strikes_layer = True
    factor = 1e3

    def inject(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: Batch) -> Batch:
        if step == self.at:
            with torch.no_grad():
                model.h[self.layer].mlp.c_fc.weight.mul_(self.factor)
        return batch

    def describe(self) -> str:
        return f"one block's MLP c_fc weight x{self.factor:g} in place (a silent fault)"


class QueryGrowth(Fault):
    """The query rows of one block's QKV weight (``c_attn.weight[:width]``) multiplied by
    ``rate`` every step from the injection on: attention-logit growth. On this small model the
    attention turns one-hot but the loss barely rises, so a run may end without diverging."""

    name = "query_growth"
    meant_for = ("AttentionLogitGrowth", "AttentionEntropyCollapse")
    gradual = True
    strikes_layer = True
    rate = 1.03

    def inject(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: Batch) -> Batch:
        if self.at is not None and step >= self.at:
            attn = model.h[self.layer].attn.c_attn
            with torch.no_grad():
                attn.weight[:attn.in_features].mul_(self.rate)
        return batch

    def describe(self) -> str:
        return f"one block's query weights x{self.rate:g} per step"


class AdamEpsilon(Fault):
    """Adam's epsilon set to ``eps`` from the injection on. With gradients clipped to norm 1 over
    0.2M elements, sqrt(v_hat) is about 1e-3 per element: epsilon 0.1 dominates it everywhere,
    every update shrinks some 50 to 100 times and training stalls."""

    name = "adam_epsilon"
    meant_for = ("AdamEpsilonDominance",)
    gradual = True
    eps = 1e-1

    def inject(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: Batch) -> Batch:
        if step == self.at:
            for group in optimizer.param_groups:
                group["eps"] = self.eps
        return batch

    def describe(self) -> str:
        return f"Adam's epsilon set to {self.eps:g}"


class AdamBeta2(Fault):
    """Adam's beta2 set to ``beta2`` from the injection on. v then hardly changes while torch's
    bias correction (1 - beta2**t, t the step count) falls to about t x 1e-5, so v_hat is some
    hundreds of times the squared gradient: a stale second moment, updates a few tens of times
    too small, training stalls; a sudden gradient would be measured against it."""

    name = "adam_beta2"
    meant_for = ("AdamStaleSecondMoment",)
    gradual = True
    beta2 = 0.99999

    def inject(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: Batch) -> Batch:
        if step == self.at:
            for group in optimizer.param_groups:
                group["betas"] = (group["betas"][0], self.beta2)
        return batch

    def describe(self) -> str:
        return f"Adam's beta2 set to {self.beta2:g}"


def half_precision_forward(linear: nn.Linear, scale: float) -> types.MethodType:
    """A forward for ``linear`` computed in float16 on its input times ``scale`` (the result
    divided by it again): values past float16's 65504 become inf, and inf - inf NaN."""

    def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.half()
        return F.linear((x * scale).half(), self.weight.half(), bias).float() / scale

    return types.MethodType(forward, linear)


class Fp16Overflow(Fault):
    """One block's MLP ``c_fc`` computed in float16 from the injection on, on its input times
    ``scale``: inputs past 65504 / scale overflow to inf, the loss turns NaN and stays so."""

    name = "fp16_overflow"
    meant_for = ("MassiveActivation", "LossSpike")
    strikes_layer = True
    scale = 3e4

    def inject(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: Batch) -> Batch:
        if step == self.at:
            fc = model.h[self.layer].mlp.c_fc
            fc.forward = half_precision_forward(fc, self.scale)  # this one instance only
        return batch

    def describe(self) -> str:
        return f"one block's MLP c_fc in float16 on its input x{self.scale:g}"


class DivergentWorker(Fault):
    """Two DistributedDataParallel workers; from the injection on, worker 1's targets are
    shuffled every step (a bad data shard on one rank)."""

    name = "worker_divergence"
    meant_for = ("WorkerDivergence",)
    workers = 2

    def inject(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: Batch) -> Batch:
        if self.rank == 1 and self.at is not None and step >= self.at:
            return shuffled_targets(batch, self.seed * 100_003 + step)
        return batch

    def describe(self) -> str:
        return "2 DDP workers; worker 1 trains on shuffled targets"


SCENARIOS: dict[str, type[Scenario]] = {cls.name: cls for cls in (
    LrSpike, ShuffledLabels, RepeatedToken, CorruptedWeights, QueryGrowth, AdamEpsilon,
    AdamBeta2, Fp16Overflow, DivergentWorker)}
HEALTHY = Scenario.name
HEALTHY_WORKERS = HealthyWorkers.name
_ALL: dict[str, type[Scenario]] = {HEALTHY: Scenario, HEALTHY_WORKERS: HealthyWorkers,
                                   **SCENARIOS}


def scenario_class(name: str) -> type[Scenario]:
    """The scenario called ``name``: a fault of ``SCENARIOS``, "healthy" or "healthy_workers"."""
    return _ALL[name]


def draw(name: str, seed: int, steps: int, blocks: int) -> tuple[int | None, int | None]:
    """The step a scenario strikes at (uniform in ``WINDOW`` of the run) and its block (where
    it strikes one), drawn from the scenario's name and the seed alone."""
    cls = scenario_class(name)
    if not cls.injects:
        return None, None
    rng = random.Random(f"spikebench/{name}/{seed}")
    at = rng.randint(int(WINDOW[0] * steps), int(WINDOW[1] * steps))
    layer = rng.randrange(blocks)
    return at, layer if cls.strikes_layer else None
