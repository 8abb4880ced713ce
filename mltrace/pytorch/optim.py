"""Optimizer steps and mixed-precision loss scaling, as the PyTorch adapter observes them.

``OptimizerSteps`` counts the process's optimizer steps through torch.optim's global step
post-hook (public API, every optimizer). With ``step_boundary="optimizer"`` a step ends there,
and the gradients saved are the accumulated ones the optimizer used.

``ScalerWatch`` is how the hook learns a ``torch.amp.GradScaler``'s scale: the script hands the
scaler to ``hook.register_grad_scaler(scaler)``, which wraps that one object's ``step`` method
(an instance attribute; the class and other scalers are untouched). Gradients seen during
backward are divided by ``scaler.get_scale()`` before they are saved. When ``scaler.step`` returns
without the optimizer having stepped, the scaler skipped the step because a gradient held inf or
NaN: the hook marks that step (tensor ``GradScaler_step_skipped`` = 1) and keeps the step's
non-finite gradients, so NaN rules still see them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook


class OptimizerSteps:
    """Counts optimizer steps and calls ``on_step(optimizer)`` after each one.

    Args:
        on_step: called after every ``optimizer.step()`` of the process.
    """

    def __init__(self, on_step: Callable[[torch.optim.Optimizer], None]) -> None:
        self.count = 0
        self._on_step = on_step
        self._handle: Any = None

    def install(self) -> None:
        """Start counting (idempotent)."""
        if self._handle is None:
            self._handle = register_optimizer_step_post_hook(self._post)

    def remove(self) -> None:
        """Stop counting (the hook is removed from torch.optim)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.count += 1
        self._on_step(optimizer)


class ScalerWatch:
    """One registered GradScaler: its current scale, and whether each ``scaler.step`` skipped
    the optimizer step.

    Args:
        scaler: the script's ``torch.amp.GradScaler`` (or ``torch.cuda.amp.GradScaler``).
        steps: the optimizer-step counter (must be installed).
        on_scaler_step: called after each ``scaler.step(optimizer)`` with the optimizer and
            whether the step was skipped.
    """

    def __init__(self, scaler: Any, steps: OptimizerSteps,
                 on_scaler_step: Callable[[Any, bool], None]) -> None:
        for attr in ("get_scale", "step", "is_enabled"):
            if not callable(getattr(scaler, attr, None)):
                raise TypeError(f"{type(scaler).__name__} has no {attr}(): register a "
                                "torch.amp.GradScaler")
        self.scaler = scaler
        self._steps = steps
        self._on_scaler_step = on_scaler_step
        self._original = scaler.step
        scaler.step = self._step  # this object only

    def scale(self) -> float:
        """The loss scale in effect (1.0 when the scaler is disabled); syncs with the device."""
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0

    def remove(self) -> None:
        """Give the scaler its own ``step`` back."""
        if self.scaler.__dict__.get("step") == self._step:
            del self.scaler.step

    def _step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = self._steps.count
        result = self._original(optimizer, *args, **kwargs)
        self._on_scaler_step(optimizer, self._steps.count == before)
        return result
