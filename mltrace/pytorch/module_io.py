"""A registered model's module inputs and outputs: which forward hooks are installed, and what
they save or record (eagerly, or traced inside a compiled region and saved after it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mltrace.capture.errors import guarded
from mltrace.collections import GRADIENT_PREFIX
from mltrace.pytorch.adapter_state import TorchAdapterState
from mltrace.pytorch.compiled import compiling, detached, eager_only, in_backward, tensors_in
from mltrace.pytorch.module_hooks import forward_hook


class ModuleIO(TorchAdapterState):
    """The forward hooks on a registered model's modules and what they save."""

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
            self._io_index[prefix] = index + 1
            return
        for tensor in tensors_in(value):
            take(prefix + str(index), tensor)
            index += 1
        self._io_index[prefix] = index

    def save_io(self, module_name: str, suffix: str, value: Any) -> None:
        """Save the tensors in ``value`` as ``<module_name><suffix><i>``, counting on from the
        module's earlier calls this step."""
        assert self.hook is not None
        self._name_io(self.save, module_name + suffix, value)  # detached only if saved

    def _after_forward(self, module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
        """Save what the traced hooks recorded inside a compiled forward."""
        if self.traced.buffer:
            self._drain_traced()

    @guarded()
    def _drain_traced(self) -> None:
        for name, suffix, tensors in self.traced.take():
            self.save_io(name, suffix, tensors)
