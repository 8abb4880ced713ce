"""The PyTorch side of the capture: module and parameter callbacks, the worker's rank, host
copies and on-device reductions of torch tensors (see mltrace.capture.adapter for the protocol)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from mltrace.capture.adapter import Adapter, ReductionItems, as_numpy
from mltrace.capture.errors import guarded
from mltrace.collections import GRADIENT_PREFIX
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.format.tensors import BFloat16Bits
from mltrace.hook import check_tensor_name
from mltrace.pytorch.reductions import QUANTILE_LIMIT, torch_reductions

if TYPE_CHECKING:
    from mltrace.hook import Hook


class TorchAdapter(Adapter):
    """The PyTorch side of the capture: module and parameter callbacks, host copies and
    on-device reductions of torch tensors, the worker's rank. Names are kept here, never
    written onto the user's modules."""

    hook: Hook | None

    def __init__(self) -> None:
        super().__init__()
        self.modules: list[torch.nn.Module] = []
        self.names: dict[int, str] = {}  # id(module) -> its tensor-name prefix
        self._owned: list[torch.nn.Module] = []  # keeps ids in ``names`` from being reused
        self._handles: list[Any] = []
        self._io_index: dict[str, int] = {}

    # -- Adapter protocol -------------------------------------------------------------------------
    def worker_identity(self) -> tuple[str, int]:
        """``worker_<rank>`` and the world size, asked when the first step starts, from (as
        smdebug) torch.distributed if initialized, else Horovod if the job initialized it."""
        if dist.is_available() and dist.is_initialized():
            return f"worker_{dist.get_rank()}", dist.get_world_size()
        hvd = _horovod()
        if hvd is not None:
            return f"worker_{hvd.rank()}", hvd.size()
        return "worker_0", 1

    def to_numpy(self, value: Any) -> np.ndarray:
        """A host copy of a torch tensor (bfloat16 as its bits); other values as numpy."""
        if not isinstance(value, torch.Tensor):
            return as_numpy(value)
        if value.dtype == torch.bfloat16:
            return value.detach().cpu().view(torch.uint16).numpy().view(BFloat16Bits)
        try:
            return value.numpy(force=True)  # detach, host copy and conj/neg resolution in one call
        except TypeError as exc:  # quantized, float8, complex32: dtypes numpy does not have
            raise MltraceTypeError(
                f"cannot save a tensor of dtype {value.dtype}: {exc} (numpy has no such dtype; "
                "save a converted copy: tensor.float(), or tensor.dequantize() if quantized)"
            ) from exc

    def reduce(self, value: Any, items: ReductionItems) -> list[np.ndarray | None]:
        """Reductions on the tensor's device, one device-to-host copy per tensor."""
        # Complex tensors and huge medians take numpy's path on the host.
        big_median = any(n == "median" for n, _ in items) and getattr(value, "numel", lambda: 0)() > QUANTILE_LIMIT
        if not isinstance(value, torch.Tensor) or value.is_complex() or big_median:
            return super().reduce(value, items)
        return torch_reductions(value, items)

    def on_prepare(self) -> None:
        """Turn modules added with Collection.add_module_tensors into regexes of their names."""
        assert self.hook is not None
        for coll in self.hook.collection_manager.get_collections().values():
            for module, (inputs, outputs) in getattr(coll, "modules", {}).items():
                name = self.names.get(id(module))
                if name is None:
                    raise MltraceValueError(
                        f"collection {coll.name!r} holds a module that is not part of a registered "
                        "model: call hook.register_module(model) on the model that contains it"
                    )
                if inputs:
                    coll.include(f"^{re.escape(name)}_input_")
                if outputs:
                    coll.include(f"^{re.escape(name)}_output_")

    def on_prepared(self) -> None:
        """Keep only the callbacks whose tensors a saved collection can match."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module in self.modules:
            self._install_tensor_hooks(module)

    # -- attaching to PyTorch ---------------------------------------------------------------------
    def register_module(self, module: torch.nn.Module) -> None:
        """Attach to a model: step boundaries, parameters, gradients, module I/O."""
        if not isinstance(module, torch.nn.Module):
            raise MltraceTypeError(f"register_module needs a torch.nn.Module, got {type(module).__name__}")
        if any(module is m for m in self.modules):
            raise MltraceValueError("this module is already registered with the hook; register it once")
        root = type(module).__name__  # what torch prints as the module's name
        named = list(module.named_modules())
        for name, _ in named:  # torch allows names no trial can store (lone surrogates)
            if name:
                check_tensor_name(name, "module name")
        for name, sub in named:
            self._name(sub, name)
        self._name(module, root)
        self.modules.append(module)
        module.register_forward_pre_hook(self._forward_pre_hook)
        self._install_tensor_hooks(module)

    def register_loss(self, loss_module: torch.nn.Module) -> None:
        """Save the output of a loss module as ``<LossClass>_output_0``."""
        if not isinstance(loss_module, torch.nn.Module):
            raise MltraceTypeError(f"register_loss needs a loss module, got {type(loss_module).__name__}")
        self._name(loss_module, type(loss_module).__name__)
        loss_module.register_forward_hook(self._forward_hook)

    def _name(self, module: torch.nn.Module, name: str) -> None:
        if id(module) not in self.names:
            self._owned.append(module)
        self.names[id(module)] = name

    def _install_tensor_hooks(self, module: torch.nn.Module) -> None:
        """Forward hooks on submodules and gradient hooks on parameters. Before the first step
        all are installed; once collections are prepared, only those whose tensors some saved
        collection can match stay (a hook that fires every step costs even when it saves nothing)."""
        assert self.hook is not None
        plan = self.hook.plan
        root = self.names[id(module)]
        for sub in module.modules():
            if plan.prepared and not self._may_save_io(self.names[id(sub)]):
                continue
            self._handles.append(sub.register_forward_hook(self._forward_hook))
        for pname, param in module.named_parameters():
            name = f"{GRADIENT_PREFIX}{root}_{pname}"
            # frozen parameters get no gradient (smdebug issue #184)
            if param.requires_grad and (not plan.prepared or plan.may_save(name)):
                self._handles.append(param.register_hook(self._gradient_hook(name)))

    def _may_save_io(self, module_name: str) -> bool:
        assert self.hook is not None
        return any(self.hook.plan.may_save(f"{module_name}{suffix}{i}")
                   for suffix in ("_input_", "_output_") for i in range(4))

    # -- callbacks from PyTorch -------------------------------------------------------------------
    @guarded()
    def _forward_pre_hook(self, module: torch.nn.Module, inputs: Any) -> None:
        hook = self.hook
        if hook is None or module is not self.modules[0]:
            return
        hook.begin_step()
        if hook.stop_requested is not None:
            # A rule asked to stop: finish the trial, then end the user's loop at this boundary.
            raise hook.stop_training_error()
        self._io_index.clear()
        if hook.step_active:
            root = self.names[id(module)]
            for pname, param in module.named_parameters():
                hook.save_for_tensor(f"{root}_{pname}", param)

    @guarded()
    def _forward_hook(self, module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
        if self.hook is None or not self.hook.step_active:
            return
        name = self.names[id(module)]
        self.save_io(name, "_input_", inputs)
        self.save_io(name, "_output_", outputs)

    def _gradient_hook(self, name: str) -> Any:
        def on_gradient(grad: torch.Tensor) -> None:
            if self.hook is not None and self.hook.step_active and grad is not None:
                self._save_gradient(name, grad)

        return on_gradient

    @guarded()
    def _save_gradient(self, name: str, grad: torch.Tensor) -> None:
        assert self.hook is not None
        self.hook.save_for_tensor(name, grad)

    def save_io(self, module_name: str, suffix: str, value: Any) -> None:
        """Save the tensors in ``value`` as ``<module_name><suffix><i>``, counting on from the
        module's earlier calls this step."""
        assert self.hook is not None
        prefix = module_name + suffix
        index = self._io_index.get(prefix, 0)
        for tensor in _flatten_tensors(value):
            self.hook.save_for_tensor(f"{prefix}{index}", tensor)  # detached only if saved
            index += 1
        self._io_index[prefix] = index


def _horovod() -> Any:
    """``horovod.torch`` if the job imported and initialized it, else None. Never imported here:
    a job that uses Horovod has imported it to call ``hvd.init()``, and importing it loads MPI."""
    import sys

    hvd = sys.modules.get("horovod.torch")
    try:
        return hvd if hvd is not None and hvd.is_initialized() else None
    except Exception:  # noqa: BLE001 - an unusable Horovod means a single worker
        return None


def _flatten_tensors(value: Any) -> list[torch.Tensor]:
    """Tensors in (nested) tuples and lists, in order; anything else is skipped (as smdebug)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flatten_tensors(v)]
    return []
