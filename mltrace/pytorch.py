"""PyTorch adapter: ``Hook`` for ``nn.Module`` training loops, with smdebug's names and defaults.

Tensor names (as smdebug's PyTorch hook): parameters ``<RootClass>_<param path>`` (saved at the
start of each step, before the update), gradients ``gradient/<RootClass>_<param path>``, module
inputs/outputs ``<module path>_input_<i>`` / ``<module path>_output_<i>`` (the root module by its
class name), losses ``<LossClass>_output_0``.

Distributed jobs (torch.distributed, or Horovod): each process is ``worker_<rank>``. With
``include_workers="all"`` every worker writes its own files and the trial's ``num_workers`` is the
world size; with "one" (the default) only worker_0 writes. Gradients are the worker's own, as the
gradient hook receives them before DistributedDataParallel averages them (smdebug saved the same).

Example:
    >>> import mltrace.pytorch as smd
    >>> hook = smd.Hook(out_dir="/tmp/run", save_config=smd.SaveConfig(save_interval=10),
    ...                 include_collections=["weights", "gradients", "losses"])
    >>> hook.register_module(model); hook.register_loss(loss_fn)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from mltrace import modes
from mltrace.capture.adapter import Adapter, ReductionItems, as_numpy
from mltrace.capture.errors import guarded
from mltrace.capture.options import HookOptions
from mltrace.collections import (
    GRADIENT_PREFIX,
    TORNASOLE_INCLUDE_COLLECTIONS,
    CollectionKeys,
    PendingCollections,
    manager_with_defaults,
    parameter_collection_regexes,
)
from mltrace.collections import Collection as _CoreCollection
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.format.tensors import BFloat16Bits
from mltrace.hook import Hook as CoreHook
from mltrace.hook import check_tensor_name, get_hook
from mltrace.json_config import create_hook_from_config
from mltrace.reductions import canonical_name
from mltrace.trials import create_trial

DEFAULT_COLLECTIONS = parameter_collection_regexes("[Ll]oss_(?!input).*output")
DEFAULT_INCLUDE_COLLECTIONS = [CollectionKeys.LOSSES]


class Collection(_CoreCollection):
    """A collection that can also hold a module's inputs and outputs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._modules: dict[torch.nn.Module, tuple[bool, bool]] = {}

    def add_module_tensors(self, module: torch.nn.Module, inputs: bool = False, outputs: bool = True) -> None:
        """Save ``module``'s inputs and/or outputs with this collection (names are resolved when
        the hook registers the model, so this may be called before the hook exists)."""
        if not isinstance(module, torch.nn.Module):
            raise MltraceTypeError(f"add_module_tensors needs a torch.nn.Module, got {type(module).__name__}")
        self._modules[module] = (inputs, outputs)

    @property
    def modules(self) -> dict[torch.nn.Module, tuple[bool, bool]]:
        """Modules added with add_module_tensors, with their (inputs, outputs) flags."""
        return self._modules


# Collections made with smd.get_collection(...) before a hook exists (seed 000 does this) land
# here and are handed to the next hook created.
_pending = PendingCollections(lambda: manager_with_defaults(DEFAULT_COLLECTIONS, Collection))


def get_collection(name: str, create: bool = True) -> Collection:
    """The collection ``name`` of the current hook, or of the hook about to be created."""
    return _pending.of(get_hook(), Hook, name, create)  # type: ignore[return-value]


def add_to_collection(collection_name: str, args: Any) -> None:
    """Add tensor names (or regexes) to a collection, as smdebug's module-level helper."""
    get_collection(collection_name).include(args)


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
        big_median = any(n == "median" for n, _ in items) and getattr(value, "numel", lambda: 0)() > _QUANTILE_LIMIT
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


class Hook(CoreHook):
    """Saves weights, biases, gradients, losses and module inputs/outputs of a PyTorch model.

    Args: smdebug's constructor (each is described in mltrace.capture.options.HookOptions),
    plus ``saveall`` (Tornasole's spelling of ``save_all``).

    When a rule's StopTraining action fires, the next forward pass of the registered model
    closes the trial and raises mltrace.exceptions.StopTrainingRequested: catch it around your
    loop to end training cleanly (``hook.stop_requested`` says the same without raising).
    """

    _default_include = DEFAULT_INCLUDE_COLLECTIONS

    def __init__(
        self,
        out_dir: str | None = None,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config: ReductionConfig | None = None,
        save_config: Any = None,
        include_regex: str | Iterable[str] | None = None,
        include_collections: Iterable[str] | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        strict: bool = False,
        saveall: bool | None = None,
        mlflow: bool | dict[str, Any] | None = None,
        stop_check_interval: float | None = None,
    ) -> None:
        options = HookOptions(
            out_dir or "", export_tensorboard, tensorboard_dir, dry_run, reduction_config, save_config,
            include_regex, include_collections, bool(save_all or saveall), include_workers, strict,
            mlflow, stop_check_interval)
        self.torch = TorchAdapter()
        super().__init__(options, self.torch, collection_manager=_pending.take(),
                         default_include_collections=self._default_include,
                         default_saved_collections=DEFAULT_INCLUDE_COLLECTIONS)

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None) -> Hook:
        """Build a hook from smdebug's JSON configuration (see mltrace.json_config)."""
        return create_hook_from_config(cls, json_file_path)

    @guarded(user_facing=True)
    def register_module(self, module: torch.nn.Module) -> None:
        """Attach the hook to a model: step boundaries, parameters, gradients, module I/O."""
        self.torch.register_module(module)

    register_hook = register_module  # Tornasole's name

    @guarded(user_facing=True)
    def register_loss(self, loss_module: torch.nn.Module) -> None:
        """Save the output of a loss module as ``<LossClass>_output_0`` (collection losses)."""
        self.torch.register_loss(loss_module)

    @guarded(user_facing=True)
    def record_tensor_value(self, tensor_name: str, tensor_value: torch.Tensor) -> None:
        """Save a value computed outside a module (a functional loss) as ``<name>_output_0``."""
        check_tensor_name(tensor_name, "record_tensor_value name")
        if not isinstance(tensor_value, torch.Tensor):
            raise MltraceTypeError(f"record_tensor_value({tensor_name!r}) needs a torch.Tensor")
        if self.step_active:
            self.torch.save_io(tensor_name, "_output_", tensor_value)


def torch_reductions(value: torch.Tensor, items: ReductionItems) -> list[np.ndarray | None]:
    """mltrace.reductions' definitions computed with torch ops on ``value``'s device."""
    if value.numel() == 0:
        return [None] * len(items)
    if value.is_quantized:
        raise MltraceTypeError(f"cannot reduce a quantized tensor ({value.dtype}); save "
                               "tensor.dequantize() instead")
    t = value.detach().reshape(-1)
    if not t.is_floating_point():
        t = t.double()  # ints and bools reduce in float64, as numpy's definition here says
    elif t.dtype in (torch.float16, torch.bfloat16) or t.element_size() == 1:
        t = t.float()  # float8 too: torch has few operators for it
    names = [canonical_name(name) for name, _ in items]
    outs = [_torch_reduction(t, name, abs_).double() for name, (_, abs_) in zip(names, items)]
    host = torch.stack(outs).cpu().numpy()  # one device-to-host copy per tensor
    return [np.asarray(np.int64(h) if n in _COUNTS else h) for n, h in zip(names, host)]


_QUANTILE_LIMIT = 16_000_000
_COUNTS = ("nan_count", "inf_count")


def _torch_reduction(t: torch.Tensor, name: str, abs_: bool) -> torch.Tensor:
    """numpy's definitions (ddof=0, flattened norms) with torch ops, on the tensor's device."""
    if abs_:
        t = t.abs()
    if name == "min":
        return t.min()
    if name == "max":
        return t.max()
    if name == "mean":
        return t.mean()
    if name == "std":
        return t.std(correction=0)
    if name == "variance":
        return t.var(correction=0)
    if name == "sum":
        return t.sum()
    if name == "prod":
        return t.prod()
    if name == "median":
        return t.double().quantile(0.5)
    if name == "l1":
        return t.abs().sum()
    if name == "l2":
        return t.abs().square().sum().sqrt() if t.is_complex() else torch.linalg.vector_norm(t, 2)
    if name == "nan_count":
        return torch.isnan(t).sum()
    if name == "inf_count":
        return torch.isinf(t).sum()
    if name == "zero_fraction":
        return (t == 0).sum().double() / t.numel()
    raise MltraceValueError(f"unknown reduction {name!r}")


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


class TornasoleHook(Hook):
    """Seed 000's Tornasole hook: saves weights, biases and gradients when no collection is named."""

    _default_include = TORNASOLE_INCLUDE_COLLECTIONS


__all__ = [
    "Hook", "TornasoleHook", "Collection", "SaveConfig", "SaveConfigMode", "ReductionConfig", "modes",
    "get_collection", "add_to_collection", "get_hook", "create_trial",
]
