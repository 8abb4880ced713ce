"""Gradient norms before the optimizer steps, and after it the update it applied and Adam's state.

Each parameter's signals come from sums and maxima over its elements (count, sums of squares,
absolute maxima, counts of elements past a threshold), computed on its device, a few kernels
per parameter stacked into one tensor for all of them. For a sharded parameter (FSDP2's DTensor) they are computed over the local shard and
combined across the ranks that hold the other shards: one all-reduce of the sums and one of the
maxima per step, the full tensor never gathered, and the result the same as a single process's
up to float rounding.

Gradient norms are taken when ``torch.nn.utils.clip_grad_norm_`` is about to clip (the norms
a spike shows in), else before the optimizer steps. The update is the parameter after
``optimizer.step()`` less a copy taken before it: that copy exists only on steps that save
updates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from mltrace.pytorch.sharded import _owns_shard, _reduction_group, is_sharded
from mltrace.pytorch.stability.step_signals import StepSignals
from mltrace.stability.signals import (
    EPS_DOMINANCE_FACTOR,
    GRAD_NORMS,
    OPTIMIZER_STATE,
    QUANTITIES,
    UPDATES,
    signal_name,
)

# Sums per parameter: update^2, weight-before^2, count, exp_avg^2, v_hat, count(v > 0),
# count(v > 0 and sqrt(v_hat) within EPS_DOMINANCE_FACTOR of eps), grad^2.
_D2, _W2, _N, _M2, _V, _VPOS, _VEPS, _G2 = range(8)
# Maxima per parameter: |update|, |exp_avg|, v_hat.
_DMAX, _MMAX, _VMAX = range(3)


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if is_sharded(t) else t).detach()  # type: ignore[attr-defined]


def _norms(tensors: Sequence[torch.Tensor], order: float) -> torch.Tensor:
    """Each tensor's ``order``-norm (2 or 1) in float32; an empty tensor (an uneven shard: this
    rank holds no row of the parameter) has norm 0."""
    if not tensors:
        return torch.zeros(0)
    return torch.stack([torch.linalg.vector_norm(t, order).float() for t in tensors])


def _abs_maxes(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each tensor's largest absolute value in float32 (0 for an empty shard), from one
    ``aminmax`` each: on a CPU several times faster than an infinity norm."""
    if not tensors:
        return torch.zeros(0)
    pairs = [torch.aminmax(t if t.numel() else t.new_zeros(1)) for t in tensors]
    return torch.maximum(torch.stack([p.max for p in pairs]), -torch.stack([p.min for p in pairs])).float()


def combine_across_shards(params: Sequence[torch.Tensor], sums: torch.Tensor,
                          maxes: torch.Tensor | None) -> None:
    """Add up ``sums`` (one row per parameter) and take the maxima of ``maxes`` over the ranks
    holding the shards of each sharded parameter, in place. Rows of unsharded parameters stay as
    they are. Every rank calls this with the same parameters in the same order."""
    groups: dict[Any, list[int]] = {}
    for i, p in enumerate(params):
        if is_sharded(p):
            group = _reduction_group(p)  # type: ignore[arg-type]
            if group is None:
                raise RuntimeError(f"cannot combine the shards of a {tuple(p.shape)} parameter placed "
                                   f"{p.placements}")  # type: ignore[attr-defined]
            if not _owns_shard(p):  # type: ignore[arg-type]  # a replica: its shard counts once
                sums[i] = 0
            groups.setdefault(group, []).append(i)
    for group, rows in groups.items():
        index = torch.tensor(rows, device=sums.device)
        part = sums.index_select(0, index)
        dist.all_reduce(part, op=dist.ReduceOp.SUM, group=group)
        sums.index_copy_(0, index, part)
        if maxes is not None:
            part = maxes.index_select(0, index)
            dist.all_reduce(part, op=dist.ReduceOp.MAX, group=group)
            maxes.index_copy_(0, index, part)


class OptimizerSignals:
    """Grad norms, updates and Adam's state of the registered models' parameters, per step.

    Args:
        signals: where the step's signals are kept until it ends.
    """

    def __init__(self, signals: StepSignals) -> None:
        self.signals = signals
        self.grad_norms = self.updates = self.state = False  # what the current step saves
        self._before: dict[int, torch.Tensor] = {}
        self._clipped: set[int] = set()  # parameters whose grad norms were taken before clipping
        self._models: list[tuple[str, list[tuple[str, torch.Tensor]]]] = []

    def begin_step(self, models: Iterable[tuple[str, torch.nn.Module]], grad_norms: bool,
                   updates: bool, state: bool) -> None:
        """Say what this step saves, with the registered models as ``(root name, module)``."""
        self.grad_norms, self.updates, self.state = grad_norms, updates, state
        self._before.clear()
        self._clipped.clear()
        self._models = [(root, [(f"{root}_{n}", p) for n, p in m.named_parameters() if p.requires_grad])
                        for root, m in models] if (grad_norms or updates or state) else []

    @property
    def active(self) -> bool:
        """True if this step saves any optimizer-side signal."""
        return bool(self._models)

    def _owned(self, optimizer: torch.optim.Optimizer) -> list[tuple[str, list[tuple[str, torch.Tensor]]]]:
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        return [(root, [(n, p) for n, p in params if id(p) in ids]) for root, params in self._models]

    def before_clipping(self, parameters: list[torch.Tensor]) -> None:
        """``clip_grad_norm_`` is about to clip ``parameters``' gradients: their norms now, as
        they came from backward (a spike is measured before clipping hides it)."""
        if not self.grad_norms:
            return
        ids = {id(p) for p in parameters}
        for root, params in self._models:
            self._grad_norms(root, [(n, p) for n, p in params if id(p) in ids])
        self._clipped.update(ids)

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The gradients' norms (the model's and each parameter's) unless taken before clipping,
        and copies of the parameters whose update is saved."""
        for root, params in self._owned(optimizer):
            if self.updates:
                for _, p in params:
                    self._before[id(p)] = p.detach().clone()
            if self.grad_norms:
                self._grad_norms(root, [(n, p) for n, p in params if id(p) not in self._clipped])

    def _grad_norms(self, root: str, params: list[tuple[str, torch.Tensor]]) -> None:
        with_grad = [(n, p) for n, p in params if p.grad is not None]
        if not with_grad:
            return
        squares = _norms([_local(p.grad) for _, p in with_grad], 2.0).square().unsqueeze(1)  # type: ignore[arg-type]
        combine_across_shards([p for _, p in with_grad], squares, None)
        self.signals.put([signal_name(GRAD_NORMS, n) for n, _ in with_grad], squares.squeeze(1).sqrt(), "l2")
        self.signals.put([signal_name(GRAD_NORMS, root)], squares.sum().sqrt().reshape(1), "l2")

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The updates the step applied and Adam's state (exp_avg, exp_avg_sq) after it."""
        if not (self.updates or self.state):
            return
        settings = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        updated: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        adam: list[tuple[str, torch.Tensor, dict[str, Any]]] = []
        for _, params in self._owned(optimizer):
            for name, p in params:
                before = self._before.pop(id(p), None)
                if before is not None:
                    updated.append((name, p, before))
                state = optimizer.state.get(p, {}) if self.state else {}
                if "exp_avg" in state and "exp_avg_sq" in state and "betas" in settings[id(p)]:
                    adam.append((name, p, state))
        self._before.clear()
        if updated:
            self._put_updates(updated)
        if adam:
            self._put_state(adam, settings)

    def _put_updates(self, updated: list[tuple[str, torch.Tensor, torch.Tensor]]) -> None:
        after = [_local(p) for _, p, _ in updated]
        before = [_local(b) for _, _, b in updated]
        delta = [a - b for a, b in zip(after, before)]
        sums = torch.stack([_norms(delta, 2.0).square(), _norms(before, 2.0).square()], dim=1)
        maxes = _abs_maxes(delta).unsqueeze(1)
        combine_across_shards([p for _, p, _ in updated], sums, maxes)
        l2 = sums[:, 0].sqrt()
        values = torch.stack([l2, maxes[:, 0], l2 / sums[:, 1].sqrt()], dim=1).reshape(-1)
        names = [signal_name(UPDATES, n, q) for n, _, _ in updated for q in QUANTITIES[UPDATES]]
        self.signals.put(names, values)

    def _put_state(self, adam: list[tuple[str, torch.Tensor, dict[str, Any]]],
                   settings: dict[int, dict[str, Any]]) -> None:
        """Adam's state, v read bias-corrected (v_hat = exp_avg_sq / (1 - beta2^step), what Adam
        divides by), so ``grad_sq_ratio`` is sum g^2 / sum v_hat; exp_avg read as stored."""
        device = _local(adam[0][1]).device
        ms = [_local(s["exp_avg"]) for _, _, s in adam]
        vs = [_local(s["exp_avg_sq"]) for _, _, s in adam]
        grads = [_local(p.grad) if p.grad is not None else torch.full((1,), float("nan"), device=device)
                 for _, p, _ in adam]
        steps = torch.stack([torch.as_tensor(s.get("step", 1), dtype=torch.float64).to(device) for _, _, s in adam])
        beta2 = torch.tensor([float(settings[id(p)]["betas"][1]) for _, p, _ in adam], dtype=torch.float64, device=device)
        eps = torch.tensor([float(settings[id(p)]["eps"]) for _, p, _ in adam], dtype=torch.float64, device=device)
        correction = 1 - beta2 ** steps
        limits = ((EPS_DOMINANCE_FACTOR * eps) ** 2 * correction).float()  # sqrt(v / correction) < 10 eps
        positive = torch.stack([torch.count_nonzero(v) for v in vs]).float()  # v >= 0
        below = torch.stack([torch.count_nonzero(v < limits[i]) for i, v in enumerate(vs)]).float()
        count = torch.tensor([float(v.numel()) for v in vs], device=device)
        correction = correction.float()
        sums = torch.stack([torch.zeros_like(count), torch.zeros_like(count), count,
                            _norms(ms, 2.0).square(), _norms(vs, 1.0) / correction, positive,
                            below - (count - positive), _norms(grads, 2.0).square()], dim=1)
        maxes = torch.stack([torch.zeros_like(count), _abs_maxes(ms), _abs_maxes(vs) / correction], dim=1)
        combine_across_shards([p for _, p, _ in adam], sums, maxes)
        n = sums[:, _N]
        values = torch.stack([(sums[:, _M2] / n).sqrt(), maxes[:, _MMAX], sums[:, _V] / n, maxes[:, _VMAX],
                              sums[:, _VEPS] / sums[:, _VPOS].clamp_min(1), sums[:, _G2] / sums[:, _V]], dim=1)
        names = [signal_name(OPTIMIZER_STATE, n, q) for n, _, _ in adam for q in QUANTITIES[OPTIMIZER_STATE]]
        self.signals.put(names, values.reshape(-1))


__all__ = ["OptimizerSignals", "combine_across_shards"]
