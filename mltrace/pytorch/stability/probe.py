"""The PyTorch hook's stability signals: which callbacks compute them, on which steps, and how a
step's signals reach the trial (mltrace.stability.signals lists them).

Nothing is installed unless a saved collection can hold a signal (``stability`` or one of the
signal collections). Then, on the steps those collections are due:

- attention: torch's attention functions tell the probe of each call
  (mltrace.pytorch.stability.interception), named after the registered module that made it;
- logits: a forward hook on each registered model reads its output's logits;
- module-output outliers: a forward hook on each submodule;
- grad norms: when ``torch.nn.utils.clip_grad_norm_`` is about to clip, else torch.optim's
  global step pre-hook; updates and Adam's state: its pre- and post-hooks.

Each computes on the tensors' device and keeps its results there (StepSignals); when the step
ends they are copied to the host at once and saved as the trial's tensors. On other steps each
callback returns at its first test. Inside a region ``torch.compile`` traces, the module
callbacks do nothing (the test is a constant to the tracer: no graph break, no recompilation);
the model's logits and the optimizer's signals are computed outside it all the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from mltrace.capture.errors import ErrorPolicy, guarded
from mltrace.capture.host_arrays import save_host_arrays
from mltrace.pytorch.compiled import compiling, eager_only, in_backward
from mltrace.pytorch.module_hooks import forward_hook
from mltrace.pytorch.stability import interception
from mltrace.pytorch.stability.optimizer_signals import OptimizerSignals
from mltrace.pytorch.stability.statistics import (
    logits_statistics,
    outlier_statistics,
    sdpa_statistics,
    softmax_statistics,
)
from mltrace.pytorch.stability.step_signals import Merge, StepSignals
from mltrace.stability.signals import (
    ACTIVATIONS,
    ATTENTION,
    GRAD_NORMS,
    LOGITS,
    OPTIMIZER_STATE,
    PREFIXES,
    QUANTITIES,
    SIGNAL_COLLECTIONS,
    UPDATES,
    signal_name,
)

if TYPE_CHECKING:
    from mltrace.capture.hook import Hook

_LOGIT_MERGES: tuple[Merge, ...] = ("mean", "max", "max", "mean")  # of QUANTITIES[LOGITS], over a step's calls


#: What each signal collection needs of the model and the training loop, said when it stays empty.
_WHY_EMPTY = {
    ATTENTION: "no torch.nn.functional.scaled_dot_product_attention call, nor softmax over 4-D "
               "attention scores, came from a module of the registered model (a model without "
               "attention, or one that imported those functions before the hook was created: "
               "create the hook before building the model)",
    LOGITS: "the registered model's output holds no logits (see the warning above)",
    ACTIVATIONS: "no submodule of the registered model returned a floating-point tensor",
    GRAD_NORMS: "no optimizer.step() ran with gradients on the registered model's parameters "
                "(grad norms are read when torch.optim steps)",
    UPDATES: "no optimizer.step() ran on the registered model's parameters",
    OPTIMIZER_STATE: "the optimizer keeps no Adam state (exp_avg, exp_avg_sq): it is recorded for "
                     "Adam-family optimizers (Adam, AdamW, NAdam, RAdam); grad_norms and updates "
                     "work with any torch.optim optimizer",
}


#: Signals of the forward pass: a step that saves them and has none says so at once.
_PER_FORWARD = frozenset({ATTENTION, LOGITS, ACTIVATIONS})


def _probe_name(collection: str) -> str:
    """A name every tensor of ``collection`` resembles, to ask the save plan about it."""
    return signal_name(collection, "probe", None if collection == GRAD_NORMS else "probe")


def find_logits(output: Any) -> torch.Tensor | None:
    """The output logits in what a model returned: the tensor itself, a ``logits`` attribute
    (Hugging Face's ModelOutput), or the first tensor of a tuple or list (nanoGPT's
    ``(logits, loss)``); None when there is no floating tensor of at least 2 dimensions."""
    found = getattr(output, "logits", None)
    if not isinstance(found, torch.Tensor):
        found = output
        if isinstance(output, (tuple, list)):
            found = next((t for t in output if isinstance(t, torch.Tensor)), None)
    if isinstance(found, torch.Tensor) and found.is_floating_point() and found.dim() >= 2:
        return found
    return None


class StabilityProbe:
    """Computes a step's stability signals and saves them when the step ends.

    Args:
        names: the adapter's ``id(module) -> name`` of every registered module.
        warn_once: the adapter's one-time warning.
    """

    def __init__(self, names: dict[int, str], warn_once: Callable[..., None]) -> None:
        self.names = names
        self.warn_once = warn_once
        self.hook: Hook | None = None
        self.errors = ErrorPolicy(False, lambda reason: None)
        self.signals = StepSignals()
        self.optimizer = OptimizerSignals(self.signals)
        self.wanted: frozenset[str] = frozenset()  # signal collections a saved collection holds
        self.due: frozenset[str] = frozenset()  # those due this step
        self.models: list[tuple[str, torch.nn.Module]] = []
        self._attached: set[int] = set()
        self._handles: list[Any] = []
        self._optimizer_handles: list[Any] = []
        self._seen: set[str] = set()  # prefixes of the signals saved so far
        self._attention_names: dict[str, list[str]] = {}
        self._model_called = False  # a registered model's forward ran in a step saving logits

    # -- set-up ---------------------------------------------------------------------------------
    def attach(self, hook: Hook) -> None:
        """Use ``hook``'s save plan and error policy."""
        self.hook, self.errors = hook, hook.errors

    def prepared(self, models: list[tuple[str, torch.nn.Module]], everything: bool,
                 named: set[str]) -> None:
        """The saved collections are fixed: install what the wanted signals need on ``models``
        (root name, module), remove what they do not. Wanted: every signal if ``everything``
        (the ``stability`` collection is saved), else the signal collections in ``named`` (a
        hook saving ``all`` tensors computes no signal unless asked to)."""
        self.wanted = frozenset(c for c in SIGNAL_COLLECTIONS if everything or c in named)
        self.models = []
        self._attached.clear()
        self.remove()
        for root, module in models:
            self.add_model(root, module)
        if self.wanted & {GRAD_NORMS, UPDATES, OPTIMIZER_STATE}:
            self._optimizer_handles = [register_optimizer_step_pre_hook(self._before_optimizer),
                                       register_optimizer_step_post_hook(self._after_optimizer)]
        if self.wanted & {ATTENTION, GRAD_NORMS}:
            interception.listen(self)

    def add_model(self, root: str, module: torch.nn.Module) -> None:
        """Install the callbacks on a registered model (after the collections were fixed)."""
        if id(module) in self._attached:
            return
        self._attached.add(id(module))
        self.models.append((root, module))
        if LOGITS in self.wanted:
            self._handles.append(forward_hook(module, eager_only(self._logits_hook(root))))
        if ACTIVATIONS in self.wanted:
            for sub in module.modules():
                if sub is not module:
                    name = self.names[id(sub)]
                    self._handles.append(forward_hook(sub, self._outlier_hook(name, isinstance(sub, torch.nn.Linear))))

    def remove(self) -> None:
        """Take every callback out (the hook closes, or the collections changed)."""
        for handle in self._handles + self._optimizer_handles:
            handle.remove()
        self._handles, self._optimizer_handles = [], []
        interception.unlisten(self)

    # -- steps ----------------------------------------------------------------------------------
    def begin_step(self, step_active: bool) -> None:
        """Decide which signals this step saves."""
        self.signals.clear()
        if not self.wanted or not step_active:
            self.due = frozenset()
        else:
            assert self.hook is not None
            plan = self.hook.plan
            self.due = frozenset(c for c in self.wanted if plan.due_for(plan.collections_of(_probe_name(c))))
        self.optimizer.begin_step(self.models, GRAD_NORMS in self.due, UPDATES in self.due,
                                  OPTIMIZER_STATE in self.due)

    def end_step(self) -> None:
        """Save the step's signals (one host copy per device); say once which asked-for
        signal a step that saved them had none of, and how to get it."""
        if self.hook is None:  # closed before its first step: nothing was computed
            return
        taken = self.signals.take() if len(self.signals) else []
        if self.due:
            found = {name.split("/", 1)[0] + "/" for name, _ in taken}
            self._seen |= found
            stepped = bool(found & {PREFIXES[GRAD_NORMS], PREFIXES[UPDATES]})
            self._warn_empty([c for c in self.due if c in _PER_FORWARD or (stepped and c == OPTIMIZER_STATE)])
        if taken:
            save_host_arrays(self.hook, taken)

    def finish(self) -> None:
        """The last step's signals; then, for the optimizer's side, which asked-for signal the
        whole run had none of (a step without optimizer.step() is not a reason on its own)."""
        asked = bool(self.due)
        self.end_step()
        if asked or self._seen:
            self._warn_empty([c for c in self.wanted if c not in _PER_FORWARD])

    def _warn_empty(self, collections: list[str]) -> None:
        for collection in collections:
            if PREFIXES[collection] not in self._seen and not self.errors.disabled:
                why = _WHY_EMPTY[collection]
                if collection == LOGITS and not self._model_called:
                    why = ("the registered model itself was not called in a step that saves them "
                           "(its logits are read from its forward's output: a loop that calls one "
                           "of its submodules, e.g. self.gpt(x) in a LightningModule registered as "
                           "the model, never runs it); register the module the loop calls")
                self.warn_once(f"stability-{collection}", "the %s collection stays empty: %s", collection, why)

    # -- callbacks (each guarded: an error of mltrace's stops the hook, never the training) ----
    def on_sdpa(self, query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None,
                is_causal: bool, scale: float | None) -> None:
        """An attention call: its logits' maximum and entropy per head, if due."""
        if ATTENTION in self.due and not in_backward():
            self._attention(lambda: sdpa_statistics(query, key, attn_mask, is_causal, scale))

    def on_softmax(self, scores: torch.Tensor, probabilities: torch.Tensor) -> None:
        """A materialised attention softmax (eager attention), if due."""
        if ATTENTION in self.due and not in_backward():
            self._attention(lambda: softmax_statistics(scores, probabilities))

    @guarded()
    def _attention(self, statistics: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> None:
        name = interception.calling_module(self.names, depth=4)
        if name is None:
            return
        names = self._attention_names.get(name)
        if names is None:
            names = self._attention_names[name] = [signal_name(ATTENTION, name, q) for q in QUANTITIES[ATTENTION]]
        best, entropy = statistics()
        self.signals.put(names, torch.stack([best, entropy.to(best.dtype)]), ("max", "mean"))

    @guarded()
    def on_clip(self, parameters: list[torch.Tensor]) -> None:
        """``clip_grad_norm_`` is about to clip: the gradient norms before it, if due."""
        if GRAD_NORMS in self.due:
            self.optimizer.before_clipping(parameters)

    def _logits_hook(self, root: str) -> Callable[[torch.nn.Module, Any, Any], None]:
        names = [signal_name(LOGITS, root, q) for q in QUANTITIES[LOGITS]]

        def on_output(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if LOGITS in self.due and not in_backward():
                self._logits(root, names, output)

        return on_output

    @guarded()
    def _logits(self, root: str, names: list[str], output: Any) -> None:
        self._model_called = True
        logits = find_logits(output)
        if logits is None:
            self.warn_once(f"no-logits-{root}",
                           "the logits collection stays empty: the output of %s (a %s) holds no "
                           "floating tensor of 2 or more dimensions; return the logits from the "
                           "registered model (a tensor, a tuple starting with them, or an object "
                           "with a .logits attribute)", root, type(output).__name__)
            return
        self.signals.put(names, logits_statistics(logits), _LOGIT_MERGES)

    def _outlier_hook(self, module_name: str, linear: bool) -> Callable[[torch.nn.Module, Any, Any], None]:
        quantities = ("abs_max", "abs_median", "max_over_median", "l2") if linear else \
            ("abs_max", "abs_median", "max_over_median")
        names = [signal_name(ACTIVATIONS, module_name, q) for q in quantities]
        merges: tuple[Merge, ...] = ("max", "mean", "max", "l2")[:len(names)]  # type: ignore[assignment]

        def on_output(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if compiling() or ACTIVATIONS not in self.due or in_backward():
                return
            tensor = output if isinstance(output, torch.Tensor) else find_logits(output)
            if tensor is not None and tensor.is_floating_point() and tensor.numel():
                self._outliers(names, tensor, linear, merges)

        return on_output

    @guarded()
    def _outliers(self, names: list[str], tensor: torch.Tensor, linear: bool, merges: tuple[Merge, ...]) -> None:
        self.signals.put(names, outlier_statistics(tensor, linear), merges)

    @guarded()
    def _before_optimizer(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.optimizer.active:
            self.optimizer.before_step(optimizer)

    @guarded()
    def _after_optimizer(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.optimizer.active:
            self.optimizer.after_step(optimizer)


__all__ = ["StabilityProbe", "find_logits"]
