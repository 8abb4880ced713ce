"""Gradients: the hooks on parameters (installed only for steps that save), the accumulated
gradients at the optimizer step, and a GradScaler's loss scale (saved gradients are unscaled)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mltrace.capture.errors import guarded
from mltrace.collections import GRADIENT_PREFIX
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.pytorch.adapter_state import TorchAdapterState
from mltrace.pytorch.module_hooks import tensor_hook
from mltrace.pytorch.optim import ScalerWatch
from mltrace.pytorch.sharded import is_sharded

logger = logging.getLogger("mltrace.pytorch.adapter")


class Gradients(TorchAdapterState):
    """Parameter gradients, the optimizer step and mixed precision's loss scale."""

    def register_grad_scaler(self, scaler: Any) -> None:
        """Learn the loss scale of ``scaler`` (see mltrace.pytorch.optim.ScalerWatch)."""
        if self.scaler is not None:
            raise MltraceValueError("a GradScaler is already registered with the hook; register one")
        self.optimizer_steps.install()
        try:
            self.scaler = ScalerWatch(scaler, self.optimizer_steps, self._after_scaler_step)
        except TypeError as exc:
            raise MltraceTypeError(f"register_grad_scaler: {exc}") from None

    def _gradient_hooks(self, on: bool) -> None:
        """Install the gradient hooks for a step that saves, remove them for one that does not.

        Autograd calls a tensor hook for every parameter in every backward, and the call itself
        costs microseconds per parameter even when the hook returns at once; with a save interval
        of 100 that was most of the hook's cost on the 99 steps that save nothing. Installing
        them at a saving step's beginning costs about as much once. Before the first step they
        are installed (a gradient arriving then means the model ran without the step boundary;
        see _warn_not_stepping).
        """
        if on and not self._gradient_handles:
            for name, param in self._gradients:
                self._hook_gradient(name, param)
        elif not on and self._gradient_handles:
            for handle in self._gradient_handles:
                handle.remove()
            self._gradient_handles.clear()

    def _hook_gradient(self, name: str, param: torch.nn.Parameter) -> None:
        """Per-backward gradients (smdebug's value). A sharded parameter (FSDP2) gets its gradient
        after the reduce-scatter, through the post-accumulate-grad hook FSDP2 calls."""
        if is_sharded(param):
            if not param.is_leaf:
                self.warn_once(name, "not saving %s: a sharded parameter that is not a leaf has no "
                               "accumulated gradient; save it with hook.save_tensor", name)
                return
            on_gradient = self._gradient_callback(name)
            self._gradient_handles.append(param.register_post_accumulate_grad_hook(
                tensor_hook(lambda p: on_gradient(p.grad))))
        else:
            self._gradient_handles.append(param.register_hook(tensor_hook(self._gradient_callback(name))))

    def _gradient_callback(self, name: str) -> Callable[[torch.Tensor | None], None]:
        """What autograd calls with a parameter's gradient: on a step that saves nothing it
        returns after reading one flag (it runs for every parameter of every backward)."""
        traced, errors = self.traced, self.errors

        def on_gradient(grad: torch.Tensor | None) -> None:
            if not traced.active:
                if not self.stepped:
                    self._warn_not_stepping()
                return
            keep = self._keep
            if keep is None or self.scaler is not None:
                self._on_gradient(name, grad)
                return
            # a step that only records (no loss scale to undo): straight to the recorder
            if grad is not None and not errors.disabled:
                try:
                    keep(name, grad)
                except Exception as exc:  # noqa: BLE001 - as guarded() does: the hook stops, not training
                    errors.failed(exc, "recording a gradient")

        return on_gradient

    @guarded()
    def _on_gradient(self, name: str, grad: torch.Tensor | None) -> None:
        hook = self.hook
        if hook is None or not hook.step_active or grad is None:
            return
        if self.scaler is not None:
            if self._grad_scale is None:
                self._grad_scale = self.scaler.scale()
            if self._grad_scale != 1.0:
                grad = grad.detach() / self._grad_scale  # saved unscaled; inf and NaN stay
        self.save(name, grad)

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """With ``step_boundary="optimizer"`` or ``"trainer"``: save the accumulated gradients the optimizer used
        (a GradScaler has unscaled them in place by now). Then combine the step's reductions of
        sharded tensors: every rank steps its optimizer, while its process group is alive."""
        if self.step_boundary != "forward":
            self._save_accumulated(optimizer)
        self._save_sharded_reductions()

    @guarded()
    def _save_accumulated(self, optimizer: Any) -> None:
        hook = self.hook
        if hook is None or not hook.step_active:
            return
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for module in self.modules:
            root = self.names[id(module)]
            for pname, param in module.named_parameters():
                if id(param) in owned and param.grad is not None:
                    self.save(f"{GRADIENT_PREFIX}{root}_{pname}", param.grad)

    @guarded()
    def _after_scaler_step(self, optimizer: Any, skipped: bool) -> None:
        """Record the loss scale and whether the scaler skipped the optimizer step. A skipped
        step still ends the step, and its (non-finite) gradients are saved."""
        hook = self.hook
        if hook is None:
            return
        if skipped:
            logger.info("GradScaler skipped the optimizer step at step %d (inf or NaN gradients)",
                        hook.step)
            if hook.recorder is not None:  # the scaler's business, not a reason to dump
                hook.recorder.excuse_gradients(GRADIENT_PREFIX)
            self._after_optimizer_step(optimizer)
            self.optimizer_steps.count += 1  # a step boundary all the same
        if hook.step_active and self.scaler is not None:
            scale = self._grad_scale if self._grad_scale is not None else self.scaler.scale()
            hook.save_tensor("GradScaler_scale", np.float64(scale), "grad_scaler")
            hook.save_tensor("GradScaler_step_skipped", np.float64(skipped), "grad_scaler")
