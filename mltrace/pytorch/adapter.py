"""The PyTorch side of the capture: module and parameter callbacks, the worker's rank, host
copies and on-device reductions of torch tensors (see mltrace.capture.adapter for the protocol)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from mltrace.capture.adapter import Adapter, ReductionItems, as_numpy
from mltrace.capture.errors import guarded
from mltrace.capture.hook import check_tensor_name
from mltrace.capture.plan import what_to_save
from mltrace.collections import GRADIENT_PREFIX
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.format.tensors import BFloat16Bits
from mltrace.modes import ModeKeys
from mltrace.pytorch.compiled import (
    TracedIO,
    class_name,
    compiling,
    detached,
    eager_only,
    in_backward,
    tensors_in,
    unwrap,
)
from mltrace.pytorch.copy_ring import CopiedStep, CopyRing
from mltrace.pytorch.histograms import bins_on_device, device_histogram
from mltrace.pytorch.module_hooks import (
    forward_hook,
    forward_pre_hook,
    replace_attribute,
    tensor_hook,
)
from mltrace.pytorch.optim import OptimizerSteps, ScalerWatch
from mltrace.pytorch.reductions import (
    QUANTILE_LIMIT,
    DeviceReductions,
    HostReductions,
    read_on_cpu,
    recorder_reductions,
    stack_parts,
    start_reductions,
)
from mltrace.pytorch.sharded import ReductionBatch, gather_full, is_sharded
from mltrace.reductions import all_finite, canonical_name
from mltrace.writer.histogram_bins import Binned

if TYPE_CHECKING:
    from mltrace.capture.hook import Hook

logger = logging.getLogger(__name__)

#: numpy's dtype of a torch dtype (bfloat16 and the like: float32)
_NUMPY_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
                 torch.int64: np.int64, torch.int32: np.int32}

#: ``forward``: a step per forward pass of the registered model (smdebug's); ``optimizer``: a
#: TRAIN step per optimizer step, for gradient accumulation; ``trainer``: steps begin where a
#: trainer's callback says a batch begins (:meth:`TorchAdapter.begin_batch`; mltrace.transformers,
#: mltrace.lightning), a TRAIN step per optimizer step as with ``optimizer``.
STEP_BOUNDARIES = ("forward", "optimizer", "trainer")


@dataclass(frozen=True)
class Reduced:
    """A sharded tensor's reductions, combined across ranks, standing in for the tensor when
    only reductions of it are saved (the full tensor is never gathered)."""

    shape: tuple[int, ...]
    items: ReductionItems
    results: list[np.ndarray | None]


class TorchAdapter(Adapter):
    """The PyTorch side of the capture: module and parameter callbacks, host copies and
    on-device reductions of torch tensors, the worker's rank. Names are kept here, never
    written onto the user's modules."""

    hook: Hook | None

    def __init__(self, step_boundary: str = "forward") -> None:
        super().__init__()
        if step_boundary not in STEP_BOUNDARIES:
            raise MltraceValueError(
                f"step_boundary={step_boundary!r}: use \"forward\" (a step per forward pass of the "
                "registered model, smdebug's), \"optimizer\" (a step per optimizer step, for "
                "gradient accumulation) or \"trainer\" (steps from a trainer's callback)")
        self.step_boundary = step_boundary
        self.modules: list[torch.nn.Module] = []  # the registered models (unwrapped)
        self.entries: list[torch.nn.Module] = []  # what the script calls (maybe compiled)
        self.traced = TracedIO()
        self.optimizer_steps = OptimizerSteps(self._after_optimizer_step)
        self.scaler: ScalerWatch | None = None
        self._boundary_at = -1  # optimizer steps counted when the current step began
        self._grad_scale: float | None = None  # the loss scale, read once per step
        self.names: dict[int, str] = {}  # id(module) -> its tensor-name prefix
        self._owned: list[torch.nn.Module] = []  # keeps ids in ``names`` from being reused
        self._handles: list[Any] = []
        # Parameters whose gradients may be saved, and their gradient hooks while installed:
        # only during steps that save (see _gradient_hooks)
        self._gradients: list[tuple[str, torch.nn.Parameter]] = []
        self._gradient_handles: list[Any] = []
        self._io_index: dict[str, int] = {}
        #: ``<module>_input_`` / ``_output_`` -> the most tensors seen on that side in one step:
        #: which indices a module's callback must look at (see _may_save_side)
        self._io_counts: dict[str, int] = {}
        #: numbers written in the saved collections' regexes and names (see _may_save_side)
        self._named_indices: frozenset[int] = frozenset()
        self.stepped = False  # True once a step began (a model's callbacks have run)
        #: False once the saved collections are fixed, if none can hold a parameter
        self._parameters_watched = True
        self.host_transfers = 0  # device-to-host copies of reductions (see reductions_to_host)
        #: the flight recorder's ``keep`` on a step that only records (``Hook.recording_only``):
        #: the callbacks hand tensors to it directly, else None
        self._keep: Callable[[str, Any], None] | None = None
        # Reductions of sharded tensors (FSDP2), combined across ranks once per step
        self._sharded = ReductionBatch()
        self._sharded_saves: list[tuple[str, tuple[int, ...], ReductionItems]] = []

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
        if isinstance(value, Reduced):
            raise MltraceTypeError("only reductions of this sharded tensor were gathered")
        if not isinstance(value, torch.Tensor):
            return as_numpy(value)
        if is_sharded(value):
            value = value.full_tensor()  # type: ignore[attr-defined]  # a collective: every rank
        if value.dtype == torch.bfloat16:
            return value.detach().cpu().view(torch.uint16).numpy().view(BFloat16Bits)
        try:
            return value.numpy(force=True)  # detach, host copy and conj/neg resolution in one call
        except TypeError as exc:  # quantized, float8, complex32: dtypes numpy does not have
            raise MltraceTypeError(
                f"cannot save a tensor of dtype {value.dtype}: {exc} (numpy has no such dtype; "
                "save a converted copy: tensor.float(), or tensor.dequantize() if quantized)"
            ) from exc
        except RuntimeError as exc:  # a tensor subclass torch cannot copy to numpy
            raise MltraceTypeError(
                f"cannot save a {type(value).__name__} (a torch.Tensor subclass): {exc}; save a "
                "plain copy with hook.save_tensor(name, t.as_subclass(torch.Tensor)) or convert it "
                "the way its library documents") from exc

    def reduce(self, value: Any, items: ReductionItems) -> list[np.ndarray | None]:
        """Reductions on the tensor's device, one device-to-host copy per tensor."""
        return self.reductions_to_host([self.reduce_on_device(value, items)])[0]

    def reduce_on_device(self, value: Any, items: ReductionItems) -> Any:
        """Reductions computed on the tensor's device and left there (a DeviceReductions), or
        the results where they are known or computed on the host: a sharded tensor's combined
        ones, complex tensors and huge medians (numpy's path)."""
        if isinstance(value, Reduced):
            if list(value.items) != list(items):
                raise MltraceValueError("reductions asked for differ from those combined across ranks")
            return value.results
        big_median = any(n == "median" for n, _ in items) and getattr(value, "numel", lambda: 0)() > QUANTILE_LIMIT
        if not isinstance(value, torch.Tensor) or value.is_complex() or big_median:
            return super().reduce(value, items)
        try:
            return start_reductions(value, items)
        except (RuntimeError, TypeError) as exc:
            if type(value) in (torch.Tensor, torch.nn.Parameter):
                raise
            raise MltraceTypeError(
                f"cannot reduce a {type(value).__name__} (a torch.Tensor subclass): {exc}; save a "
                "plain copy with hook.save_tensor(name, t.as_subclass(torch.Tensor))") from exc

    def reducer(self, items: ReductionItems) -> Callable[[Any], Any]:
        """The flight recorder's per-tensor call, decided once: non-empty float tensors of the
        usual dtypes go straight to the fused kernels (a few microseconds of Python less per
        tensor than :meth:`recordable` and :meth:`reduce_on_device`, which handle everything
        else, as they do a median: torch has no fused one)."""
        canonical = [(canonical_name(n), a) for n, a in items]
        general = super().reducer(items)
        if any(n == "median" for n, _ in canonical):
            return general
        return recorder_reductions(canonical, general)

    def bins_on_device(self, value: Any) -> bool:
        """Tensors on an accelerator are binned there (see mltrace.pytorch.histograms)."""
        return bins_on_device(value)

    def device_histogram(self, value: Any) -> Binned | None:
        """The TensorBoard histogram of an accelerator's tensor, binned on it."""
        return device_histogram(value)

    def recordable(self, value: Any) -> bool:
        """Sharded tensors (DTensors) are not recorded (their reductions would need collectives),
        nor complex or empty ones (no plain reductions)."""
        if isinstance(value, torch.Tensor):
            return not is_sharded(value) and not value.is_complex() and value.numel() > 0
        return not isinstance(value, Reduced)

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        """A torch tensor's shape and dtype (the recorder casts a loss back to it)."""
        if isinstance(value, torch.Tensor):
            return tuple(value.shape), _NUMPY_DTYPES.get(value.dtype, np.float32)
        return super().shape_and_dtype(value)

    def snapshot(self, value: Any) -> Any:
        """A copy on the tensor's device (no host transfer until a dump)."""
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        return super().snapshot(value)

    def nbytes(self, snapshot: Any) -> int:
        """A tensor's bytes."""
        if isinstance(snapshot, torch.Tensor):
            return snapshot.numel() * snapshot.element_size()
        return super().nbytes(snapshot)

    def reductions_to_host(self, started: list[Any]) -> list[list[np.ndarray | None]]:
        """The results of a step's reductions: those left on a device are stacked and copied to
        the host together, one copy per device (one per step on a one-GPU job)."""
        pending = [s for s in started if isinstance(s, DeviceReductions)]
        host: dict[int, np.ndarray] = {}
        for here in _by_device(pending):
            values = self._to_host(stack_parts(here))
            offsets = np.cumsum([0] + [len(s.names) for s in here])
            host.update({id(s): values[a:b] for s, a, b in zip(here, offsets, offsets[1:])})
        return [s.results(host[id(s)]) if isinstance(s, DeviceReductions) else s for s in started]

    def step_copies(self, items: ReductionItems, ring_steps: int, max_bytes: int,
                    checked: bool) -> CopyRing | None:
        """A ring of copies (mltrace.pytorch.copy_ring) where reducing a tensor takes more than
        one kernel: min and max alone are one ``aminmax``, no dearer than a copy, and a median
        has no fused kernel."""
        canonical = [(canonical_name(n), a) for n, a in items]
        if sorted(canonical) == [("max", False), ("min", False)] or any(n == "median" for n, _ in canonical):
            return None
        return CopyRing(canonical, ring_steps, max_bytes, self, checked)

    def reductions_to_flat(self, started: list[Any]) -> np.ndarray:
        """A step's reductions in one device-to-host copy, when all of them wait on one device
        (in their own dtype: the flight recorder checks every step and converts only what it
        writes); a step of copies has its reductions computed now."""
        if len(started) == 1 and type(started[0]) is HostReductions:
            return np.frombuffer(started[0].values, dtype=np.float64)
        if len(started) == 1 and type(started[0]) is CopiedStep:
            return started[0].to_flat(self)
        on_host = read_on_cpu(started)  # fresh handles of CPU tensors: a loss read for its spike
        if on_host is not None:
            return np.frombuffer(on_host.values, dtype=np.float64)
        values = _stacked_on_one_device(started)
        if values is None:
            return super().reductions_to_flat(started)
        return self._to_host(values)

    def reductions_finite(self, started: list[Any]) -> bool:
        """A packed step's reductions are read as Python floats, in one copy and no numpy call."""
        if len(started) == 1 and type(started[0]) is HostReductions:
            return all_finite(started[0].values)
        if len(started) == 1 and type(started[0]) is CopiedStep:
            return started[0].finite(self)
        if len(started) == 1 and type(started[0]) is DeviceReductions and started[0].stacked is not None:
            self.host_transfers += 1
            return all_finite(started[0].stacked.tolist())
        return super().reductions_finite(started)

    def pack_reductions(self, started: list[Any]) -> list[Any]:
        """A step's reductions as one object to keep, not one per reduction: read as floats if
        all are on the CPU, else one tensor when all wait on one device."""
        on_host = read_on_cpu(started)
        if on_host is not None:
            self.host_transfers += 1
            return [on_host]
        values = _stacked_on_one_device(started) if len(started) > 1 else None
        if values is None:
            return started
        return [DeviceReductions([n for s in started for n in s.names], [], values)]

    def _to_host(self, values: torch.Tensor) -> np.ndarray:
        """Copy reductions to the host (counted in ``host_transfers``)."""
        self.host_transfers += 1
        return values.cpu().numpy()

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
        assert self.hook is not None
        plan = self.hook.plan
        self._named_indices = plan.numbers_named()
        self._parameters_watched = any(
            plan.may_save(f"{self.names[id(model)]}_{pname}")
            for model in self.modules for pname, _ in model.named_parameters())
        self._gradient_hooks(False)
        self._gradients.clear()
        for module, entry in zip(self.modules, self.entries):
            self._install_tensor_hooks(module, entry)

    # -- attaching to PyTorch ---------------------------------------------------------------------
    def register_module(self, module: torch.nn.Module, root: str | None = None) -> None:
        """Attach to a model: step boundaries, parameters, gradients, module I/O. ``module`` may
        be the model or what ``torch.compile`` returned for it; names are the model's either way.
        ``root`` replaces the class name that starts its tensor names (two models of one class)."""
        if not isinstance(module, torch.nn.Module):
            raise MltraceTypeError(f"register_module needs a torch.nn.Module, got {type(module).__name__}")
        inner = unwrap(module)
        if any(inner is m for m in self.modules):
            raise MltraceValueError("this module is already registered with the hook; register it once")
        root = root or class_name(inner)  # the class name: what torch prints as the module's name
        named = list(inner.named_modules())
        for name, _ in named:  # torch allows names no trial can store (lone surrogates)
            if name:
                check_tensor_name(name, "module name")
        for name, sub in named:
            self._name(sub, name)
        self._name(inner, root)
        self.modules.append(inner)
        self.entries.append(module)
        if self.step_boundary != "forward":
            self.optimizer_steps.install()
        self._attach_boundary(module, inner)
        self._install_tensor_hooks(inner, module)
        assert self.hook is not None
        recording = self.hook.recording
        if recording is not None:  # a flight recorder's budget too small for one step raises
            sizes = [(n, p.numel() * p.element_size()) for n, p in inner.named_parameters()]
            recording.check_budget([(f"{root}_{n}", b) for n, b in sizes]
                                   + [(f"{GRADIENT_PREFIX}{root}_{n}", b) for n, b in sizes], self)

    def register_loss(self, loss_module: torch.nn.Module) -> None:
        """Save the output of a loss module as ``<LossClass>_output_0``."""
        if not isinstance(loss_module, torch.nn.Module):
            raise MltraceTypeError(f"register_loss needs a loss module, got {type(loss_module).__name__}")
        inner = unwrap(loss_module)
        name = class_name(inner)
        self._name(inner, name)
        forward_hook(inner, self._io_hook(name))

    def register_grad_scaler(self, scaler: Any) -> None:
        """Learn the loss scale of ``scaler`` (see mltrace.pytorch.optim.ScalerWatch)."""
        if self.scaler is not None:
            raise MltraceValueError("a GradScaler is already registered with the hook; register one")
        self.optimizer_steps.install()
        try:
            self.scaler = ScalerWatch(scaler, self.optimizer_steps, self._after_scaler_step)
        except TypeError as exc:
            raise MltraceTypeError(f"register_grad_scaler: {exc}") from None

    def _name(self, module: torch.nn.Module, name: str) -> None:
        if id(module) not in self.names:
            self._owned.append(module)
        self.names[id(module)] = name

    def _install_tensor_hooks(self, module: torch.nn.Module, entry: torch.nn.Module) -> None:
        """Forward hooks on submodules and gradient hooks on parameters of a registered model
        (``entry``: what the script calls, maybe compiled). Before the first step all are
        installed; once collections are prepared, only those whose tensors some saved
        collection can match stay (a hook that fires every step costs even when it saves nothing)."""
        assert self.hook is not None
        plan = self.hook.plan
        root = self.names[id(module)]
        io_hooks = len(self._handles)
        root_hook = None
        for sub in module.modules():
            name = self.names[id(sub)]
            if plan.prepared and not self._may_save_io(name):
                continue
            if sub is module:
                root_hook = self._io_hook(name)
            else:
                self._handles.append(forward_hook(sub, self._io_hook(name)))
        if root_hook is not None or len(self._handles) > io_hooks:
            self._install_root_hooks(module, entry, root_hook)
        if self.step_boundary != "forward":
            return  # gradients are read at the optimizer step
        added = []
        for pname, param in module.named_parameters():
            name = f"{GRADIENT_PREFIX}{root}_{pname}"
            # frozen parameters get no gradient (smdebug issue #184)
            if param.requires_grad and (not plan.prepared or plan.may_save(name)):
                added.append((name, param))
        self._gradients += added
        if self._gradient_handles or not self.stepped:  # installed now; steps then decide
            for name, param in added:
                self._hook_gradient(name, param)

    def _install_root_hooks(self, module: torch.nn.Module, entry: torch.nn.Module,
                            root_hook: Callable[[torch.nn.Module, Any, Any], None] | None) -> None:
        """The registered model's own forward hooks: its outputs' (``root_hook``, if saved),
        then the one saving what the traced hooks recorded inside a compiled forward. Both run
        eagerly: Module.__call__ calls them outside the compiled region, so they are kept out
        of TorchDynamo's reach. On a plain model they are one hook (one wrapper to pass through
        on each forward); on what torch.compile returned, the drain goes on the wrapper."""
        drain = self._after_forward
        if entry is module and root_hook is not None:
            def root_then_drain(mod: torch.nn.Module, inputs: Any, outputs: Any) -> None:
                root_hook(mod, inputs, outputs)
                drain(mod, inputs, outputs)

            self._handles.append(forward_hook(module, eager_only(root_then_drain)))
            return
        if root_hook is not None:
            self._handles.append(forward_hook(module, eager_only(root_hook)))
        self._handles.append(forward_hook(entry, eager_only(drain) if entry is module else drain))

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

    def _may_save_io(self, module_name: str) -> bool:
        return (self._may_save_side(module_name + "_input_")
                or self._may_save_side(module_name + "_output_"))

    def _may_save_side(self, prefix: str, count: int | None = None) -> bool:
        """True if a saved collection can match ``<prefix><i>`` for an index the module has:
        ``count`` tensors in this call, else as many as its calls have shown (at least 0-3), and
        every number the saved collections' regexes and names spell out (``six_output_5``).
        Callbacks are chosen before the model first runs, when only the last tell the higher
        indices; choosing them again later would make torch.compile compile the model again."""
        assert self.hook is not None
        seen = self._io_counts.get(prefix, 0) if count is None else count
        plan = self.hook.plan
        indices = self._named_indices.union(range(max(seen, 4)))
        return any(plan.may_save(f"{prefix}{i}") for i in sorted(indices))

    def _attach_boundary(self, entry: torch.nn.Module, inner: torch.nn.Module) -> None:
        """Run the step boundary where the script calls the model, outside any compiled region.

        On a plain model it is a forward pre-hook kept out of TorchDynamo's trace (the model may
        be compiled later). What torch.compile returned keeps its compiled call in the instance
        attribute ``forward``, which torch itself sets (and sets afresh on a copy); the boundary
        wraps that call instead of being a hook, so the wrapper's own call keeps
        ``Module.__call__``'s hook-less fast path: about 1% of a 1-ms compiled step
        (bench/README.md, "A quiet lane")."""
        boundary = self._boundary_callback()
        compiled_call = vars(entry).get("forward") if entry is not inner else None
        if compiled_call is None:
            forward_pre_hook(entry, boundary if entry is not inner else eager_only(boundary))
            return

        # not functools.wraps: it would copy TorchDynamo's marks (``_torchdynamo_orig_callable``)
        # from the compiled call, and code that follows them would skip the boundary
        def forward_after_boundary(*args: Any, **kwargs: Any) -> Any:
            boundary(entry, args)
            return compiled_call(*args, **kwargs)

        replace_attribute(entry, "forward", forward_after_boundary)

    # -- callbacks from PyTorch -------------------------------------------------------------------
    def _boundary_callback(self) -> Callable[[torch.nn.Module, Any], None]:
        """The registered model's forward pre-hook. With a step per forward, a quiet step takes
        the hook's quiet lane (mltrace.capture.quiet) in one call from here; every other step
        goes through _forward_pre_hook, as do the calls of other models and activation
        checkpointing's re-runs, which the lane leaves alone."""
        hook = self.hook
        if hook is None or self.step_boundary != "forward":
            return self._forward_pre_hook
        lane, full, errors, entries = hook.take_quiet_step, self._forward_pre_hook, self.errors, self.entries

        def on_forward_pre(module: torch.nn.Module, inputs: Any) -> None:
            try:
                if (module is entries[0] and not errors.disabled and not self._sharded_saves
                        and not in_backward() and lane()):
                    return
            except Exception as exc:  # noqa: BLE001 - as guarded() does: the hook stops, not training
                errors.failed(exc, "the quiet lane")
                return
            full(module, inputs)

        return on_forward_pre

    @guarded()
    def _forward_pre_hook(self, module: torch.nn.Module, inputs: Any) -> None:
        hook = self.hook
        if hook is None or module is not self.entries[0] or in_backward():
            return  # in backward: activation checkpointing re-running the model
        if self.step_boundary == "trainer" or self._continues_step(hook):
            return
        self._begin_step(hook, raise_stop=True)

    @guarded()
    def begin_batch(self) -> None:
        """With ``step_boundary="trainer"``, a trainer's callback says a batch begins (set the
        mode first). A TRAIN batch before the next optimizer step continues the current step
        (gradient accumulation); EVAL and PREDICT batches each begin one. A rule's stop request
        is left to the callback (``hook.stop_requested``): trainers have their own way to stop."""
        hook = self.hook
        if hook is not None and not self._continues_step(hook):
            self._begin_step(hook)

    def _begin_step(self, hook: Hook, raise_stop: bool = False) -> None:
        """Begin a step and save the registered model's parameters if it saves anything
        (``raise_stop``: a rule's stop request closes the trial and raises, before that)."""
        self._boundary_at = self.optimizer_steps.count
        self._grad_scale = None
        if self._sharded_saves:
            self._save_sharded_reductions()
        hook.begin_step()
        if raise_stop and hook.stop.requested is not None:
            # A rule asked to stop: finish the trial, then end the user's loop at this boundary.
            raise hook.stop_training_error()
        if hook.step_active and self._parameters_watched:
            for model in self.modules:  # every registered model (a GAN's two), before the update
                root = self.names[id(model)]
                for pname, param in model.named_parameters():
                    self.save(f"{root}_{pname}", param)

    def forward_began(self, module: torch.nn.Module, inputs: Any) -> None:
        """The step boundary of a forward of ``module`` that began before it was registered:
        ``mltrace run`` registers a model from inside the model's first call, when its own
        forward pre-hooks have already been collected."""
        self._forward_pre_hook(module, inputs)

    def _continues_step(self, hook: Hook) -> bool:
        """With ``step_boundary="optimizer"`` (or ``"trainer"``), a TRAIN (or GLOBAL: no mode
        set) forward before the next optimizer step is one more micro-batch of the current step
        (gradient accumulation), if that step is of the same mode (not an evaluation run in
        between); EVAL and PREDICT keep a step per forward."""
        return (self.step_boundary != "forward" and hook.clock.started
                and hook.mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL)
                and hook.clock.step_mode is hook.mode
                and self._boundary_at == self.optimizer_steps.count)

    def _after_forward(self, module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
        """Save what the traced hooks recorded inside a compiled forward."""
        if self.traced.buffer:
            self._drain_traced()

    @guarded()
    def _drain_traced(self) -> None:
        for name, suffix, tensors in self.traced.take():
            self.save_io(name, suffix, tensors)

    def _io_hook(self, name: str) -> Callable[[torch.nn.Module, Any, Any], None]:
        """A forward hook saving the module's inputs and outputs as ``name``. Inside a compiled
        region it only records them (see mltrace.pytorch.compiled); eager, it saves them."""
        traced = self.traced
        assert self.hook is not None
        plan = self.hook.plan
        # only the side (inputs, outputs) some collection can match is looked at: a module's
        # inputs are the previous one's outputs, mostly. Decided again when the collections'
        # memberships change (the first time once they are fixed, at the first step)
        decided_at, inputs_too = -1, True
        input_prefix, output_prefix, errors = name + "_input_", name + "_output_", self.errors

        def on_forward(module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
            nonlocal decided_at, inputs_too
            if not traced.active:  # a step that saves nothing (most steps)
                if not self.stepped and not compiling():
                    self._warn_not_stepping()
                return
            if compiling():
                traced.buffer.append((name, "_input_", detached(inputs)))
                traced.buffer.append((name, "_output_", detached(outputs)))
                return
            if decided_at != plan.members_version and plan.prepared:
                decided_at = plan.members_version
                inputs_too = self._may_save_side(input_prefix, len(tensors_in(inputs)))
            keep = self._keep
            if keep is None:
                self._forward_hook(name, inputs if inputs_too else None, outputs)
                return
            # a step that only records (flight recorder): the tensors go straight to it, named
            # as save_io names them; not in backward (a checkpointed segment's re-run)
            if errors.disabled or in_backward():
                return
            try:
                if inputs_too:
                    self._name_io(keep, input_prefix, inputs)
                self._name_io(keep, output_prefix, outputs)
            except Exception as exc:  # noqa: BLE001 - as guarded() does: the hook stops, not training
                errors.failed(exc, "recording a module's outputs")

        return on_forward

    @guarded()
    def _forward_hook(self, name: str, inputs: Any, outputs: Any) -> None:
        """Save a module's inputs (None: none of them can be saved) and outputs."""
        if self.hook is None or not self.hook.step_active or in_backward():
            return  # in backward: a checkpointed segment recomputed; saved on its first run
        if inputs is not None:
            self.save_io(name, "_input_", inputs)
        self.save_io(name, "_output_", outputs)

    def _name_io(self, take: Callable[[str, Any], None], prefix: str, value: Any) -> None:
        """Hand ``take`` each tensor in ``value`` as ``<prefix><i>``, counting on from the
        module's earlier calls this step."""
        index = self._io_index.get(prefix, 0)
        if type(value) is torch.Tensor:  # most modules return one tensor
            take(prefix + str(index), value)
            index += 1
        else:
            for tensor in tensors_in(value):
                take(prefix + str(index), tensor)
                index += 1
        self._io_index[prefix] = index
        if index > self._io_counts.get(prefix, 0):
            self._io_counts[prefix] = index

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

    def save(self, name: str, value: Any) -> None:
        """Save ``value`` as ``name`` if due. A sharded tensor (DTensor) is first turned into
        what the due collections need, on every rank: its reductions, combined from the local
        shards, or the full tensor, gathered to the ranks that write."""
        assert self.hook is not None
        if is_sharded(value):
            value = self._unshard(name, value)
            if value is None:
                return
        self.hook.save_for_tensor(name, value)

    def _unshard(self, name: str, value: Any) -> Any:
        hook = self.hook
        assert hook is not None
        colls = hook.plan.collections_of(name)
        due = hook.plan.due_for(colls) if colls else ()
        if not due:
            return value  # not saved; the NaN watch may still look at it
        if hook.dry_run:
            return None
        save_raw, save_shape, items = what_to_save(list(due))
        histogram = hook.tensorboard is not None and any(c.save_histogram for c in due)
        if save_raw or save_shape or histogram or any(n == "median" for n, _ in items):
            return gather_full(value, None if hook.include_workers == "all" else 0)
        # Reduced now to a few partials on the device; combined with the step's other sharded
        # tensors at the next optimizer step or step boundary (one all-reduce per kind of partial).
        self._sharded.add(value, items)
        self._sharded_saves.append((name, tuple(value.shape), items))
        self.optimizer_steps.install()
        return None

    @guarded()
    def _save_sharded_reductions(self) -> None:
        """Combine the reductions of the sharded tensors saved since the last call and save them.

        Every rank of the job calls this at the same points (optimizer steps, step boundaries,
        close) with the same tensors pending, since the collectives must match. A rank that
        writes nothing (``include_workers="one"``) takes part and discards the results.
        """
        if not self._sharded_saves:
            return
        saves, self._sharded_saves = self._sharded_saves, []
        if not (dist.is_available() and dist.is_initialized()):
            self._sharded.clear()
            self.warn_once("sharded-after-destroy",
                           "not saving reductions of %d sharded tensors: the process group was "
                           "destroyed before the hook combined them; call hook.close() before "
                           "dist.destroy_process_group()", len(saves))
            return
        results = self._sharded.combine()
        hook = self.hook
        if hook is None or hook.writer is None or hook.step_written:
            return
        for (name, shape, items), values in zip(saves, results):
            hook.save_for_tensor(name, Reduced(shape, items, values))

    def save_io(self, module_name: str, suffix: str, value: Any) -> None:
        """Save the tensors in ``value`` as ``<module_name><suffix><i>``, counting on from the
        module's earlier calls this step."""
        assert self.hook is not None
        self._name_io(self.save, module_name + suffix, value)  # detached only if saved

    def on_step_begin(self) -> None:
        """Reset the step's module-call counts and tell the callbacks whether the step saves."""
        assert self.hook is not None
        self.stepped = True
        self._io_index.clear()
        self.traced.buffer.clear()
        self.traced.active = self.hook.step_active
        only = self.hook.recording_only
        self._keep = only.recorder.keep if only is not None else None
        self._gradient_hooks(self.hook.step_active)

    def _warn_not_stepping(self) -> None:
        """A gradient or module output arrived before any step began: the registered model's
        forward ran without the hook's callbacks."""
        if not self.modules or self.step_boundary == "trainer":
            return  # only a loss is registered, or a trainer begins the steps (not a forward)
        self.warn_once(
            "not-stepping",
            "%s ran its forward without mltrace's callbacks, so no step began and nothing is "
            "saved. torch.compile ignores module hooks added after it compiled a model of the "
            "same structure in this process (see torch.compiler_nn_module in the PyTorch docs). "
            "Register what torch.compile returned: hook.register_module(torch.compile(model)); "
            "or register the model before compiling or running any copy of it, or call "
            "torch._dynamo.reset() before compiling it.", self.names[id(self.modules[0])])

    def on_step_end(self) -> None:
        """Save module outputs recorded in a compiled region not yet drained (a compiled loss),
        and the step's reductions of sharded tensors not combined yet."""
        if self.traced.buffer:
            self._drain_traced()
        if self._sharded_saves:
            self._save_sharded_reductions()

    def on_finish(self) -> None:
        """The last step's reductions of sharded tensors, before the hook writes it."""
        self._save_sharded_reductions()

    def on_closed(self) -> None:
        """Take the hook's callbacks out of torch.optim and the GradScaler. A rank that writes
        nothing still takes part in combining the last sharded reductions (see on_finish)."""
        self._save_sharded_reductions()
        self.optimizer_steps.remove()
        if self.scaler is not None:
            self.scaler.remove()


def _stacked_on_one_device(started: list[Any]) -> torch.Tensor | None:
    """The results of ``started`` stacked in their own dtype, or None when some are not
    DeviceReductions or they are on several devices (torch refuses to stack those; asking each
    tensor its device would cost a microsecond per tensor)."""
    if not started or not all(type(s) is DeviceReductions for s in started):
        return None
    try:
        return stack_parts(started, float64=False)
    except RuntimeError:
        return None


def _by_device(pending: list[DeviceReductions]) -> list[list[DeviceReductions]]:
    """``pending`` grouped by device, in order within each group."""
    devices: dict[torch.device, list[DeviceReductions]] = {}
    for s in pending:
        devices.setdefault(s.device, []).append(s)
    return list(devices.values())


def _horovod() -> Any:
    """``horovod.torch`` if the job imported and initialized it, else None. Never imported here:
    a job that uses Horovod has imported it to call ``hvd.init()``, and importing it loads MPI."""
    import sys

    hvd = sys.modules.get("horovod.torch")
    try:
        return hvd if hvd is not None and hvd.is_initialized() else None
    except Exception:  # noqa: BLE001 - an unusable Horovod means a single worker
        return None
