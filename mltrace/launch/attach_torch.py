"""PyTorch under ``mltrace run``: models, losses and modes found from what the script calls.

Global module hooks (``torch.nn.modules.module.register_module_forward_pre_hook`` and
``register_module_forward_hook``) watch every module call while the first training step runs:

- a module with trainable parameters called at the top level (not from inside another
  module's forward) in training mode with gradients enabled is a model: it is registered with
  the hook (DistributedDataParallel and DataParallel are seen through, so tensor names are the
  model's own). The first one drives the step (smdebug's forward-pre-hook step boundary);
  several (a GAN's generator and discriminator) are each registered, named by their class (a
  second model of the same class gets the class name numbered: ``Sequential2``);
  modules without trainable parameters (data transforms) are not models;
- a loss module (``torch.nn`` losses, or any module whose class name ends in ``Loss``) called at
  the top level is registered as a loss (``<LossClass>_output_0``);
- a loss computed without a module (``F.cross_entropy``) is saved as ``loss_output_0`` when it is
  the tensor handed to ``backward()`` and no registered loss module ran in the step (smdebug's
  ``record_tensor_value("loss", ...)``). PyTorch has no public callback for "backward began",
  so ``torch.autograd.backward`` (which ``Tensor.backward`` calls) is wrapped.

Once the first model begins its second training step, the global hooks are removed: the model's
own callbacks do the rest and unrelated modules run at full speed. Modes follow the first
model at each of its calls: training mode with gradients is TRAIN, ``torch.inference_mode()``
is PREDICT, anything else (``model.eval()``, ``torch.no_grad()``) is EVAL.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.nn.modules import module as torch_module

from mltrace.launch.session import Session, guarded
from mltrace.modes import ModeKeys
from mltrace.pytorch.module_hooks import forward_hook, forward_pre_hook

FRAMEWORK = "pytorch"
FUNCTIONAL_LOSS = "loss"  # saved as loss_output_<i>, smdebug's name for record_tensor_value("loss")


def is_loss(module: torch.nn.Module) -> bool:
    """A loss module: torch.nn's losses and modules whose class name ends in Loss."""
    # torch internal: _Loss is the base class of torch.nn's losses, which torch exports no name for
    return isinstance(module, torch.nn.modules.loss._Loss) or type(module).__name__.endswith("Loss")


def unwrap_parallel(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside DistributedDataParallel / DataParallel, else ``module``."""
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return module.module if isinstance(module, wrappers) else module


def mode_of(module: torch.nn.Module) -> ModeKeys:
    """The mode a forward of ``module`` runs in, as smdebug's modes mean it."""
    if torch.is_inference_mode_enabled():
        return ModeKeys.PREDICT
    if module.training and torch.is_grad_enabled():
        return ModeKeys.TRAIN
    return ModeKeys.EVAL


class TorchAttachment:
    """Finds the script's models and losses and registers them with a hook of the session."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.hook: Any = None
        self.models: list[torch.nn.Module] = []  # registered, unwrapped
        self.losses: list[torch.nn.Module] = []
        self.driver: torch.nn.Module | None = None  # the module the script calls for the first model
        self.depth = 0
        self.loss_step = -2  # the step in which a registered loss module last ran
        self._guard = guarded(session, FRAMEWORK)
        self._handles = [
            torch_module.register_module_forward_pre_hook(self._pre_call),
            torch_module.register_module_forward_hook(self._post_call, always_call=True),
        ]
        self._backward = torch.autograd.backward
        torch.autograd.backward = self._wrap_backward(self._backward)
        self._on_backward = self._guard(self._save_functional_loss)
        self._on_top_level = self._guard(self._top_level)

    # -- discovery (global module hooks, first training step only) ------------------------------
    def _pre_call(self, module: torch.nn.Module, args: Any) -> None:
        depth, self.depth = self.depth, self.depth + 1
        if depth == 0:
            self._on_top_level(module, args)

    def _post_call(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.depth = max(0, self.depth - 1)

    def _top_level(self, module: torch.nn.Module, args: Any) -> None:
        if is_loss(module):
            if all(module is not m for m in self.losses) and self._ensure_hook():
                self.hook.register_loss(module)
                forward_hook(module, self._loss_ran)
                self.losses.append(module)
            return
        if mode_of(module) is not ModeKeys.TRAIN:
            return
        inner = unwrap_parallel(module)
        if not any(p.requires_grad for p in inner.parameters()):
            return  # nothing to train: a data transform (torchvision's are modules), a frozen net
        if any(inner is m for m in self.models) or not self._ensure_hook():
            return
        first = self.driver is None
        if first:
            self.driver = module
            forward_pre_hook(module, self._guard(self._set_mode))  # before the hook's own
            self.hook.set_mode(mode_of(module))
        root = self._root_name(inner)
        self.hook.torch.register_module(inner, root)
        self.models.append(inner)
        if first and inner is module:
            # Its pre-hooks were collected before it was registered: begin this call's step here
            # (a wrapper's inner model is called later, with its new pre-hook in place).
            self.hook.torch.forward_began(module, args)
        elif not first and self.hook.step_active:
            # A model first called after the step began (a GAN's discriminator): its weights
            # now, before this step's update, as if it had been registered before the loop.
            for name, param in inner.named_parameters():
                self.hook.torch.save(f"{root}_{name}", param)

    def _root_name(self, model: torch.nn.Module) -> str:
        """The class name, numbered from the second model of a class on (a GAN whose generator
        and discriminator are both nn.Sequential: Sequential, Sequential2)."""
        from mltrace.pytorch.compiled import class_name  # with the hook: mltrace.pytorch is loaded

        name = class_name(model)
        count = sum(class_name(m) == name for m in self.models)
        return f"{name}{count + 1}" if count else name

    def _ensure_hook(self) -> bool:
        if self.hook is None:
            import mltrace.pytorch

            self.hook = self.session.create_hook(mltrace.pytorch.Hook, FRAMEWORK)
            if self.hook is None:  # the script has its own hook
                self.detach()
        return self.hook is not None

    def _set_mode(self, module: torch.nn.Module, args: Any) -> None:
        """Each call of the first model: its mode; the end of discovery at its second TRAIN step."""
        mode = mode_of(module)
        if mode is not self.hook.mode:
            self.hook.set_mode(mode)
        if self._handles and mode is ModeKeys.TRAIN and self.hook.mode_steps.get(ModeKeys.TRAIN, -1) >= 0:
            self._remove_global_hooks()

    def _remove_global_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.depth = 0

    # -- losses ----------------------------------------------------------------------------------
    def _loss_ran(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.hook is not None:
            self.loss_step = self.hook.step

    def _wrap_backward(self, original: Any) -> Any:
        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if self.hook is not None and self.hook.step_active:
                self._on_backward(tensors)
            return original(tensors, *args, **kwargs)

        return backward

    def _save_functional_loss(self, tensors: Any) -> None:
        hook = self.hook
        if (isinstance(tensors, torch.Tensor) and tensors.numel() == 1
                and self.loss_step != hook.step and not self.session.script_has_own_hook()):
            hook.record_tensor_value(FUNCTIONAL_LOSS, tensors)

    def detach(self) -> None:
        """Remove the global hooks and the backward wrapper (the script keeps its own hook)."""
        self._remove_global_hooks()
        if torch.autograd.backward is not self._backward:
            torch.autograd.backward = self._backward


def attach(session: Session, torch_module_: Any = None) -> TorchAttachment:
    """Attach to PyTorch (called once torch is imported)."""
    return TorchAttachment(session)
