"""The PyTorch hook's ``samples`` collection: which callbacks compute each step's per-sample
losses and input fingerprints (mltrace.pytorch.samples), on which steps, and how they reach the
trial or the flight recorder (mltrace.stability.samples names the tensors).

Callbacks are installed only where the collection is wanted: saved (``samples`` named) or kept by a
flight recorder (``FlightRecorderConfig(samples=True)``, once a model and a loss are
registered). Each step then decides, per tensor, whether
it is due (a saved collection holding it is due) or recorded (the recorder keeps it this step);
on other steps each callback returns at its first test.

- Fingerprints: a forward pre-hook on the first registered model takes its first tensor
  argument (positional, else keyword) and copies the bytes to hash (at most 64 KiB a sample).
  It is installed when the model is registered, after the step boundary's pre-hook, so it runs
  once the step has begun: installed when the first step begins, it would miss that step.
- Per-sample losses: a forward hook on each registered loss module recomputes the loss per
  sample from the call's inputs, and keeps the loss module's own output for the check.

When the step ends, both go to the host in one copy each, the per-sample losses are checked
against the loss (their mean must be it), the fingerprints are hashed, and both are saved as
the trial's tensors. A loss whose per-sample losses cannot be computed, or whose mean is not
the loss (a sum, a weighted mean, padding left out of the mean), is said once and left out for
the rest of the run; the fingerprints and everything else are saved as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mltrace.capture.errors import ErrorPolicy, guarded
from mltrace.capture.host_arrays import save_host_arrays
from mltrace.pytorch.compiled import compiling, eager_only, in_backward, tensors_in
from mltrace.pytorch.module_hooks import forward_hook, forward_pre_hook
from mltrace.pytorch.samples import (
    NoPerSampleLoss,
    digests,
    fingerprint_rows,
    is_mean_of,
    per_sample_losses,
)
from mltrace.stability.samples import MEAN_RTOL, fingerprint_name, loss_name

if TYPE_CHECKING:
    from mltrace.capture.hook import Hook


class SampleProbe:
    """Computes a step's per-sample losses and fingerprints and saves them when it ends.

    Args:
        warn_once: the adapter's one-time warning.
    """

    def __init__(self, warn_once: Callable[..., None]) -> None:
        self.warn_once = warn_once
        self.hook: Hook | None = None
        self.errors = ErrorPolicy(False, lambda reason: None)
        self.wanted = False  # a saved or recorded collection holds the samples' tensors
        self.model: tuple[str, torch.nn.Module] | None = None  # the first registered model
        self.losses: list[tuple[str, torch.nn.Module]] = []  # registered loss modules
        self.fingerprints_due = False
        self.losses_due: frozenset[str] = frozenset()  # loss names due this step
        self._model_handle: Any = None
        self._loss_handles: list[Any] = []
        self._failed: set[str] = set()  # losses whose per-sample losses are left out
        self._methods: dict[str, str] = {}  # loss name -> the method that worked last
        self._inputs: list[tuple[torch.Tensor, bytes]] = []  # the step's rows to hash
        self._pending: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    # -- set-up ---------------------------------------------------------------------------------
    def attach(self, hook: Hook) -> None:
        """Use ``hook``'s save plan, flight recorder and error policy."""
        self.hook, self.errors = hook, hook.errors

    def add_model(self, root: str, module: torch.nn.Module) -> None:
        """The first registered model (``root``: its name): its input is fingerprinted. The
        pre-hook goes on now, unless the collections are fixed and want no samples."""
        if self.model is not None:
            return
        self.model = (root, module)
        if self.hook is None or not self.hook.plan.prepared or self.wanted:
            self._model_handle = forward_pre_hook(module, eager_only(self._on_model_input),
                                                  with_kwargs=True)

    def add_loss(self, name: str, module: torch.nn.Module) -> None:
        """A registered loss module, named ``name``: its per-sample losses are computed."""
        self.losses.append((name, module))
        if self.wanted:
            self._loss_handles.append(forward_hook(module, self._loss_hook(name), with_kwargs=True))

    def prepared(self, wanted: bool) -> None:
        """The saved and recorded collections are fixed: keep the callbacks if ``wanted``."""
        self.wanted = wanted
        for handle in self._loss_handles:
            handle.remove()
        self._loss_handles = []
        if not wanted:
            self.remove()
            return
        if self.model is not None and self._model_handle is None:
            root, module = self.model
            self.model = None
            self.add_model(root, module)
        losses, self.losses = self.losses, []
        for name, module in losses:
            self.add_loss(name, module)

    def remove(self) -> None:
        """Take every callback out (the hook closes, or no samples are wanted)."""
        if self._model_handle is not None:
            self._model_handle.remove()
            self._model_handle = None
        for handle in self._loss_handles:
            handle.remove()
        self._loss_handles = []

    # -- steps ----------------------------------------------------------------------------------
    def begin_step(self, step_active: bool) -> None:
        """Decide which of the samples' tensors this step saves or records."""
        self._inputs.clear()
        self._pending.clear()
        if not self.wanted or not step_active or self.hook is None:
            self.fingerprints_due, self.losses_due = False, frozenset()
            return
        due = self._due
        self.fingerprints_due = self.model is not None and due(fingerprint_name(self.model[0]))
        self.losses_due = frozenset(name for name, _ in self.losses
                                    if name not in self._failed and due(loss_name(name)))

    def _due(self, name: str) -> bool:
        """True if a saved collection holding ``name`` is due, or the recorder keeps it now."""
        assert self.hook is not None
        plan, recorder = self.hook.plan, self.hook.recorder
        colls = plan.collections_of(name)
        if not colls:
            return False
        return bool(plan.due_for(colls)) or (recorder is not None and recorder.keeps(name))

    @guarded()
    def end_step(self) -> None:
        """Hash the step's fingerprints, check its per-sample losses, and save both."""
        inputs, self._inputs = self._inputs, []
        pending, self._pending = self._pending, {}
        if self.hook is None or not (inputs or pending):
            return
        records: list[tuple[str, np.ndarray]] = []
        if inputs and self.model is not None:
            values = [digests(rows.cpu().numpy(), header) for rows, header in inputs]
            records.append((fingerprint_name(self.model[0]), np.concatenate(values)))
        for name, calls in pending.items():
            losses = self._checked(name, calls)
            if losses is not None:
                records.append((loss_name(name), losses))
        save_host_arrays(self.hook, records)

    def _checked(self, name: str, calls: list[tuple[torch.Tensor, torch.Tensor]]) -> np.ndarray | None:
        """The per-sample losses of the step's calls of loss ``name``, on the host, if the mean
        of each call's is its loss; else None, said once, and the loss left out from now on."""
        sizes = [len(losses) for losses, _ in calls]
        host = torch.cat([losses for losses, _ in calls] + [out for _, out in calls]).cpu().numpy()
        per_sample, outputs = host[:sum(sizes)], host[sum(sizes):]
        start = 0
        for size, loss in zip(sizes, outputs.tolist()):
            if not is_mean_of(per_sample[start:start + size], loss):
                mean = float(np.mean(per_sample[start:start + size], dtype=np.float64))
                self._give_up(name, f"the mean of the per-sample losses ({mean:.7g}) is not the "
                              f"loss ({loss:.7g}) to a relative {MEAN_RTOL:g}: the loss is not a "
                              "plain mean over the samples (a sum, a weighted mean, or a mean "
                              "that leaves some elements out, such as ignore_index)")
                return None
            start += size
        return per_sample.astype(np.float32, copy=False)

    def _give_up(self, name: str, why: str) -> None:
        self._failed.add(name)
        self.losses_due = self.losses_due - {name}
        self.warn_once(f"samples-loss-{name}", "the samples collection saves no per-sample losses "
                       "of %s: %s. Its loss, and the samples' fingerprints, are saved as before.",
                       name, why)

    # -- callbacks (each guarded: an error of mltrace's stops the hook, never the training) ----
    def _on_model_input(self, module: torch.nn.Module, args: Any, kwargs: Any = None) -> None:
        # kwargs may be missing: torch calls a pre-hook removed during the call (the first
        # step's, when no samples are wanted) without them
        if self.fingerprints_due and not in_backward():
            self._take_input(args, kwargs)

    @guarded()
    def _take_input(self, args: Any, kwargs: Any) -> None:
        found = [t for t in tensors_in(list(args) + list((kwargs or {}).values())) if t.dim() > 0]
        if not found:
            assert self.model is not None
            self.warn_once("samples-no-input", "the samples collection saves no fingerprints: "
                           "%s was called with no tensor argument that has a batch dimension",
                           self.model[0])
            return
        self._inputs.append(fingerprint_rows(found[0]))

    def _loss_hook(self, name: str) -> Callable[[torch.nn.Module, Any, Any, Any], None]:
        def on_loss(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if name in self.losses_due and not compiling() and not in_backward():
                self._per_sample(name, module, args, kwargs, output)

        return on_loss

    @guarded()
    def _per_sample(self, name: str, module: torch.nn.Module, args: Any, kwargs: Any,
                    output: Any) -> None:
        if not isinstance(output, torch.Tensor) or output.numel() != 1:
            self._give_up(name, "its output is not one number (per-sample losses are checked "
                          "against the loss, a mean over the samples)")
            return
        try:
            losses, method = per_sample_losses(module, tuple(args), dict(kwargs or {}),
                                               self._methods.get(name))
        except NoPerSampleLoss as exc:
            self._give_up(name, f"they could not be computed; tried {exc}")
            return
        self._methods[name] = method
        self._pending.setdefault(name, []).append((losses, output.detach().reshape(1).float()))


__all__ = ["SampleProbe"]
