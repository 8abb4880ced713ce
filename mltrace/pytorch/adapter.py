"""The PyTorch side of the capture: module and parameter callbacks, the worker's rank, host
copies and on-device reductions of torch tensors (see mltrace.capture.adapter for the protocol)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from mltrace.capture.hook import check_tensor_name
from mltrace.collections import GRADIENT_PREFIX, CollectionKeys
from mltrace.config import ReductionConfig
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.pytorch.adapter_state import STEP_BOUNDARIES
from mltrace.pytorch.boundary import StepBoundary
from mltrace.pytorch.collection import DEFAULT_COLLECTIONS
from mltrace.pytorch.compiled import class_name, unwrap
from mltrace.pytorch.gradients import Gradients
from mltrace.pytorch.module_hooks import forward_hook
from mltrace.pytorch.module_io import ModuleIO
from mltrace.pytorch.saving import ShardedSaves
from mltrace.pytorch.values import Reduced
from mltrace.stability.samples import SAMPLES
from mltrace.stability.signals import COLLECTIONS as STABILITY_COLLECTIONS
from mltrace.stability.signals import STABILITY, collection_regexes, without_signals

if TYPE_CHECKING:
    from mltrace.capture.hook import Hook

__all__ = ["STEP_BOUNDARIES", "Reduced", "TorchAdapter"]


class TorchAdapter(StepBoundary, ModuleIO, Gradients, ShardedSaves):
    """The PyTorch side of the capture: module and parameter callbacks, host copies and
    on-device reductions of torch tensors, the worker's rank. Names are kept here, never
    written onto the user's modules. Its parts: StepBoundary (mltrace.pytorch.boundary),
    ModuleIO (module_io), Gradients (gradients), ShardedSaves (saving), over
    TorchAdapterState (adapter_state) and TorchValues (values)."""

    def attach(self, hook: Hook) -> None:
        """Bind to ``hook``, and the samples' probe with it (it watches models as they are
        registered, before the first step)."""
        super().attach(hook)
        self.samples.attach(hook)

    def worker_identity(self) -> tuple[str, int]:
        """``worker_<rank>`` and the world size, asked when the first step starts, from (as
        smdebug) torch.distributed if initialized, else Horovod if the job initialized it."""
        if dist.is_available() and dist.is_initialized():
            return f"worker_{dist.get_rank()}", dist.get_world_size()
        hvd = _horovod()
        if hvd is not None:
            return f"worker_{hvd.rank()}", hvd.size()
        return "worker_0", 1

    def on_prepare(self) -> None:
        """Turn modules added with Collection.add_module_tensors into regexes of their names;
        give the stability collections named (mltrace.stability.signals) their regexes."""
        assert self.hook is not None
        self._stability_collections()
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

    def _stability_collections(self) -> None:
        """The stability collections exist once named (include_collections, a JSON
        configuration, ``hook.get_collection``; ``stability`` brings every signal collection),
        so a trial that does not save them lists none; ``samples`` exists when named, or for a
        flight recorder that keeps samples, once a model and a loss are registered.
        When saved, smdebug's weights and biases regexes leave their tensors out."""
        assert self.hook is not None
        plan, manager, recorder = self.hook.plan, self.hook.collection_manager, self.hook.recorder
        plan.suggestions = frozenset(STABILITY_COLLECTIONS)  # for a misspelt name's warning
        every = STABILITY in plan.include_collections or STABILITY in manager.collections
        recorded = (recorder is not None and recorder.config.samples and bool(self.modules)
                    and bool(self.samples.losses))
        named = [(name, regexes) for name, regexes in collection_regexes(DEFAULT_COLLECTIONS["losses"][0]).items()
                 if (every and name != SAMPLES) or name in plan.include_collections or name in manager.collections
                 or (recorded and name == SAMPLES)]
        for name, regexes in named:
            coll = self.hook.get_collection(name)
            coll.include(regexes)
            if coll.reduction_config is None:  # small values: saved whole, whatever the hook's
                coll.reduction_config = ReductionConfig(save_raw_tensor=True)
            coll.save_histogram = False
        if recorded or any(name in plan.include_collections for name, _ in named):
            for key in (CollectionKeys.WEIGHTS, CollectionKeys.BIASES):
                coll = manager.collections.get(key)
                if coll is not None:
                    coll.include_regex = [without_signals(r) for r in coll.include_regex]

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
        saved = {c.name for c in plan.saved}
        self.stability.attach(self.hook)
        self.stability.prepared([(self.names[id(m)], m) for m in self.modules],
                                everything=STABILITY in saved, named=saved)
        recorder = self.hook.recorder
        self.samples.prepared(bool({STABILITY, SAMPLES} & saved) or (
            recorder is not None and recorder.config.samples
            and any(c.name == SAMPLES for c in recorder.collections)))

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
        self.samples.add_model(root, inner)  # the first model's input (after the boundary)
        self._install_tensor_hooks(inner, module)
        assert self.hook is not None
        if self.hook.plan.prepared:
            self.stability.add_model(root, inner)
        recording = self.hook.recording
        if recording is not None:  # a flight recorder's budget too small for one step raises
            sizes = [(n, p.numel() * p.element_size()) for n, p in inner.named_parameters()]
            recording.check_budget([(f"{root}_{n}", b) for n, b in sizes]
                                   + [(f"{GRADIENT_PREFIX}{root}_{n}", b) for n, b in sizes], self)

    def register_loss(self, loss_module: torch.nn.Module) -> None:
        """Save the output of a loss module as ``<LossClass>_output_0`` (and its per-sample
        losses, when the ``samples`` collection is wanted)."""
        if not isinstance(loss_module, torch.nn.Module):
            raise MltraceTypeError(f"register_loss needs a loss module, got {type(loss_module).__name__}")
        inner = unwrap(loss_module)
        name = class_name(inner)
        self._name(inner, name)
        forward_hook(inner, self._io_hook(name))
        self.samples.add_loss(name, inner)
        for listener in list(self.loss_listeners):
            listener(name, inner)

    def _name(self, module: torch.nn.Module, name: str) -> None:
        if id(module) not in self.names:
            self._owned.append(module)
        self.names[id(module)] = name

    def on_step_begin(self) -> None:
        """Reset the step's module-call counts and tell the callbacks whether the step saves."""
        assert self.hook is not None
        self.stepped = True
        counts = self._io_counts  # the last step's module-call counts, kept at their most
        for prefix, count in self._io_index.items():
            if count > counts.get(prefix, 0):
                counts[prefix] = count
        self._io_index.clear()
        self.traced.buffer.clear()
        self.traced.active = self.hook.step_active
        only = self.hook.recording_only
        self._keep = only.recorder.keep if only is not None else None
        self._gradient_hooks(self.hook.step_active)
        self.stability.begin_step(self.hook.step_active)
        self.samples.begin_step(self.hook.step_active)

    def on_step_end(self) -> None:
        """Save module outputs recorded in a compiled region not yet drained (a compiled loss),
        and the step's reductions of sharded tensors not combined yet."""
        if self.traced.buffer:
            self._drain_traced()
        if self._sharded_saves:
            self._save_sharded_reductions()
        self.stability.end_step()
        self.samples.end_step()

    def on_finish(self) -> None:
        """The last step's reductions of sharded tensors and stability signals, before the
        hook writes it."""
        self._save_sharded_reductions()
        self.stability.finish()
        self.samples.end_step()

    def on_closed(self) -> None:
        """Take the hook's callbacks out of torch.optim and the GradScaler. A rank that writes
        nothing still takes part in combining the last sharded reductions (see on_finish)."""
        self._save_sharded_reductions()
        self.stability.remove()
        self.samples.remove()
        self.optimizer_steps.remove()
        if self.scaler is not None:
            self.scaler.remove()


def _horovod() -> Any:
    """``horovod.torch`` if the job imported and initialized it, else None. Never imported here:
    a job that uses Horovod has imported it to call ``hvd.init()``, and importing it loads MPI."""
    import sys

    hvd = sys.modules.get("horovod.torch")
    try:
        return hvd if hvd is not None and hvd.is_initialized() else None
    except Exception:  # noqa: BLE001 - an unusable Horovod means a single worker
        return None
