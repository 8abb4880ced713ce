"""The step boundary of a PyTorch training: a step per forward of the registered model
(smdebug's), per optimizer step, or where a trainer's callback says a batch begins."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from mltrace.capture.errors import guarded
from mltrace.modes import ModeKeys
from mltrace.pytorch.adapter_state import TorchAdapterState
from mltrace.pytorch.compiled import eager_only, in_backward
from mltrace.pytorch.module_hooks import forward_pre_hook, replace_attribute

if TYPE_CHECKING:
    from mltrace.capture.hook import Hook


class StepBoundary(TorchAdapterState):
    """Where steps begin: the registered model's forward pre-hook, or a trainer's callback."""

    def _attach_boundary(self, entry: torch.nn.Module, inner: torch.nn.Module) -> None:
        """Run the step boundary where the script calls the model, outside any compiled region.

        On a plain model it is a forward pre-hook kept out of TorchDynamo's trace (the model may
        be compiled later). What torch.compile returned keeps its compiled call in the instance
        attribute ``forward``, which torch itself sets (and sets afresh on a copy); the boundary
        wraps that call instead of being a hook, so the wrapper's own call keeps
        ``Module.__call__``'s hook-less fast path (a hook on the wrapper costs about 1% of a
        1-ms compiled step)."""
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
