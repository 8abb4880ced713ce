"""Gradient norms before the optimizer steps, and after it the update it applied and Adam's state.

Each parameter's signals come from sums and maxima over its elements (count, sums of squares,
absolute maxima, counts of elements past a threshold), computed on its device. For a sharded
parameter (FSDP2's DTensor) they are computed over the local shard and combined across the
ranks that hold the other shards: one all-reduce of the sums and one of the maxima per step, the
full tensor never gathered, and the result the same as a single process's up to float rounding.

The update is the parameter after ``optimizer.step()`` less a copy taken before it: that copy
(one per parameter whose update is saved) exists only on steps that save updates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from mltrace.pytorch.sharded import _owns_shard, _reduction_group, is_sharded
from mltrace.pytorch.stability.step_signals import StepSignals
from mltrace.stability.signals import (
    EPS_DOMINANCE_FACTOR,
    GRAD_NORMS,
    OPTIMIZER_STATE,
    UPDATES,
    signal_name,
)

# Sums per parameter: update^2, weight-before^2, count, exp_avg^2, exp_avg_sq, count(v > 0),
# count(v > 0 and sqrt(v_hat) within EPS_DOMINANCE_FACTOR of eps), grad^2.
_D2, _W2, _N, _M2, _V, _VPOS, _VEPS, _G2 = range(8)
_SUMS = 8
# Maxima per parameter: |update|, |exp_avg|, exp_avg_sq.
_DMAX, _MMAX, _VMAX = range(3)
_MAXES = 3


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if is_sharded(t) else t  # type: ignore[attr-defined]


def _sum_sq(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().float()
    return (t * t).sum()


def _abs_max(t: torch.Tensor) -> torch.Tensor:
    if t.numel() == 0:  # an uneven shard: this rank holds no rows of the parameter
        return torch.zeros((), dtype=torch.float32, device=t.device)
    return t.detach().abs().max().float()


def combine_across_shards(params: list[torch.Tensor], sums: torch.Tensor,
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
    """Grad norms, updates and Adam's state of the named parameters, for one step.

    Args:
        signals: where the step's signals are kept until it ends.
        model: the registered models' root names' parameters by id: ``{id(param): name}``,
            asked afresh at each step that saves (``<model>_<param>`` names).
    """

    def __init__(self, signals: StepSignals) -> None:
        self.signals = signals
        self.grad_norms = self.updates = self.state = False  # what the current step saves
        self._before: dict[int, torch.Tensor] = {}
        self._models: list[tuple[str, list[tuple[str, torch.Tensor]]]] = []

    def begin_step(self, models: Iterable[tuple[str, torch.nn.Module]], grad_norms: bool,
                   updates: bool, state: bool) -> None:
        """Say what this step saves, with the registered models as ``(root name, module)``."""
        self.grad_norms, self.updates, self.state = grad_norms, updates, state
        self._before.clear()
        self._models = [(root, [(f"{root}_{n}", p) for n, p in m.named_parameters() if p.requires_grad])
                        for root, m in models] if (grad_norms or updates or state) else []

    @property
    def active(self) -> bool:
        """True if this step saves any optimizer-side signal."""
        return bool(self._models)

    def _owned(self, optimizer: torch.optim.Optimizer) -> list[tuple[str, list[tuple[str, torch.Tensor]]]]:
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        return [(root, [(n, p) for n, p in params if id(p) in ids]) for root, params in self._models]

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The gradients' norms (the model's and each parameter's), and copies of the
        parameters whose update is saved."""
        for root, params in self._owned(optimizer):
            with_grad = [(n, p) for n, p in params if p.grad is not None]
            if self.updates:
                for _, p in params:
                    self._before[id(p)] = p.detach().clone()
            if not self.grad_norms or not with_grad:
                continue
            sums = torch.stack([_sum_sq(_local(p.grad)) for _, p in with_grad]).unsqueeze(1)  # type: ignore[arg-type]
            combine_across_shards([p for _, p in with_grad], sums, None)
            norms = sums.squeeze(1).sqrt()
            self.signals.put_parts([signal_name(GRAD_NORMS, n) for n, _ in with_grad], norms, "l2")
            self.signals.put(signal_name(GRAD_NORMS, root), sums.sum().sqrt(), "l2")

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The updates the step applied and Adam's state (exp_avg, exp_avg_sq) after it."""
        if not (self.updates or self.state):
            return
        settings = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        rows: list[tuple[str, torch.Tensor, bool, bool]] = []
        parts_sums, parts_max = [], []
        for _, params in self._owned(optimizer):
            for name, p in params:
                before = self._before.pop(id(p), None)
                state = optimizer.state.get(p, {}) if self.state else {}
                adam = "exp_avg" in state and "exp_avg_sq" in state and "betas" in settings[id(p)]
                if before is None and not adam:
                    continue
                sums, maxes = _parameter_partials(p, before, state if adam else None, settings[id(p)])
                parts_sums.append(sums)
                parts_max.append(maxes)
                rows.append((name, p, before is not None, adam))
        if not rows:
            return
        sums, maxes = torch.stack(parts_sums), torch.stack(parts_max)
        combine_across_shards([p for _, p, _, _ in rows], sums, maxes)
        for i, (name, _, updated, adam) in enumerate(rows):
            s, m = sums[i], maxes[i]
            if updated:
                l2 = s[_D2].sqrt()
                self.signals.put_parts([signal_name(UPDATES, name, q) for q in ("l2", "abs_max", "ratio")],
                                       torch.stack([l2, m[_DMAX], l2 / s[_W2].sqrt()]))
            if adam:
                n = s[_N]
                values = torch.stack([(s[_M2] / n).sqrt(), m[_MMAX], s[_V] / n, m[_VMAX],
                                      s[_VEPS] / s[_VPOS].clamp_min(1), s[_G2] / s[_V]])
                quantities = ("exp_avg_rms", "exp_avg_abs_max", "exp_avg_sq_mean", "exp_avg_sq_max",
                              "eps_fraction", "grad_sq_ratio")
                self.signals.put_parts([signal_name(OPTIMIZER_STATE, name, q) for q in quantities], values)
        self._before.clear()


def _parameter_partials(p: torch.Tensor, before: torch.Tensor | None, state: dict[str, Any] | None,
                        group: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """One parameter's sums and maxima over its (local) elements, in the order of the row
    indices above. v is read bias-corrected (v_hat = exp_avg_sq / (1 - beta2^step), what Adam
    divides by), so ``grad_sq_ratio`` is sum g^2 / sum v_hat; exp_avg is read as stored."""
    local = _local(p).detach()
    device = local.device
    zero = torch.zeros((), dtype=torch.float32, device=device)
    sums = [zero] * _SUMS
    maxes = [zero] * _MAXES
    if before is not None:
        delta = local.float() - _local(before).float()
        sums[_D2], sums[_W2], maxes[_DMAX] = _sum_sq(delta), _sum_sq(_local(before)), _abs_max(delta)
    if state is not None:
        m, v = _local(state["exp_avg"]).detach(), _local(state["exp_avg_sq"]).detach().float()
        beta2, eps = float(group["betas"][1]), float(group["eps"])
        step = state.get("step", 1)
        t = step.to(device=device, dtype=torch.float64) if torch.is_tensor(step) else float(step)
        correction = torch.as_tensor(1 - beta2 ** t, dtype=torch.float64, device=device).float()
        limit = (EPS_DOMINANCE_FACTOR * eps) ** 2 * correction  # sqrt(v / correction) < 10 eps
        positive = v > 0
        grad = p.grad
        sums[_N] = torch.tensor(float(v.numel()), device=device)
        sums[_M2], sums[_V] = _sum_sq(m), v.sum() / correction
        sums[_VPOS] = positive.sum().float()
        sums[_VEPS] = (positive & (v < limit)).sum().float()
        sums[_G2] = _sum_sq(_local(grad)) if grad is not None else torch.tensor(float("nan"), device=device)
        maxes[_MMAX], maxes[_VMAX] = _abs_max(m), _abs_max(v) / correction
    return torch.stack(sums), torch.stack(maxes)


__all__ = ["OptimizerSignals", "combine_across_shards"]
