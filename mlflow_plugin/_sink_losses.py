"""Registered losses in MLflow at every step, whatever the save interval.

The hook hands its sinks a loss only at the steps it saves: ``log_scalar`` is called when the
``losses`` collection is written (mltrace.capture.outputs), so a hook saving every 5 steps gave
MLflow 30 loss points for 150 steps. On the other steps no part of the hook even looks at the
loss: the PyTorch adapter's callback on a loss module returns at once on a step that saves
nothing (the quiet lane). So this part of the sink adds a forward callback of its own to each
loss module registered with the hook (``hook.register_loss``), which runs at every step:

- on the training thread it only keeps the loss: a float when the value lives on the CPU (where
  reading it costs nothing), else a detached reference to the device tensor: no copy to the
  host, no synchronisation of the training loop;
- the sink's background thread makes floats of the kept device tensors when it sends a batch,
  one scalar copy each; that copy waits, on the background thread only, for the device to get
  there, and the training thread goes on queueing work meanwhile;
- the hook's own ``log_scalar`` of those names is skipped, so each step has one point.

Cost: on a CPU, a few microseconds of the training thread per loss call (a Python callback,
``item()`` and a deque append; 2-4 µs measured). On a GPU, a reference per step held until the
next flush (``flush_interval``: a few bytes of device memory per step) and one device-to-host
copy per step made by the background thread. ``mlflow={"loss_every_step": False}`` turns it
off: losses then reach MLflow at saved steps only, as before.

Which losses: the modules given to ``hook.register_loss`` of the PyTorch hook, found through its
adapter: those registered so far (``adapter.samples.losses``, where the adapter keeps them) and,
through the adapter's ``loss_listeners`` (removed at close), those registered later. The names are
the hook's own (``MSELoss_output_0``, then ``_output_1`` for a second call in the same step). A loss
saved with ``record_tensor_value`` has no module to watch and reaches MLflow at saved steps only.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from mltrace.collections import METRIC_COLLECTIONS
from mltrace.config import parse_flag

#: The sink's logger, whichever of its parts logs.
logger = logging.getLogger("mltrace_mlflow.sink")


def wanted(options: dict[str, Any]) -> bool:
    """True unless the sink options say ``loss_every_step`` false (a bool, or "false").

    Raises:
        MltraceValueError: a value that is not a boolean.
    """
    return parse_flag("mlflow option loss_every_step", options.get("loss_every_step", True))


class EveryStepLosses:
    """MlflowSink's part that logs the registered losses at every step (see the module doc)."""

    hook: Any
    options: dict[str, Any]
    #: queue one point: (name, mode, value, time, global step, mode step); MetricBatching's
    _queue: Callable[[str, Any, Any, float, int, int], None]

    def _prepare_losses(self) -> None:
        """Watch the loss modules registered so far and those registered later, unless
        ``loss_every_step`` is false or the hook's adapter keeps no loss modules."""
        #: prefixes (``MSELoss_output_``) of the names logged here at every step
        self.loss_prefixes: tuple[str, ...] = ()
        self._loss_handles: list[Any] = []
        self._loss_step = -1
        self._loss_calls: dict[str, int] = {}
        self._loss_wanted: dict[str, bool] = {}
        self._adapter: Any = None
        if not wanted(self.options):
            return
        adapter: Any = getattr(self.hook, "adapter", None)
        registered = getattr(getattr(adapter, "samples", None), "losses", None)
        listeners = getattr(adapter, "loss_listeners", None)
        if not isinstance(registered, list) or not isinstance(listeners, list):
            logger.debug("%s keeps no loss modules: losses reach MLflow at saved steps",
                         type(adapter).__name__)
            return
        for name, module in list(registered):
            self._watch_loss(name, module)
        listeners.append(self._watch_loss)  # the modules registered from now on
        self._adapter = adapter

    def _watch_loss(self, name: str, module: Any) -> None:
        prefix = f"{name}_output_"
        try:
            handle = module.register_forward_hook(self._loss_callback(prefix))
        except Exception as exc:  # not a module we can watch: saved steps only
            logger.warning("loss %s is logged to MLflow at saved steps only: %s", name, exc)
            return
        self._loss_handles.append(handle)
        if prefix not in self.loss_prefixes:
            self.loss_prefixes += (prefix,)

    def _loss_callback(self, prefix: str) -> Callable[[Any, Any, Any], None]:
        torch = sys.modules.get("torch")
        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

        def on_loss(module: Any, inputs: Any, outputs: Any) -> None:
            if compiling():
                return  # inside a compiled region: the hook's saved steps still log it
            try:
                self._keep_loss(prefix, outputs)
            except Exception as exc:  # never a failed training step: back to saved steps
                logger.warning("losses are logged to MLflow at saved steps only from now on: "
                               "%s: %s", type(exc).__name__, exc)
                self._stop_watching_losses()

        return on_loss

    def _keep_loss(self, prefix: str, outputs: Any) -> None:
        """Queue each tensor of ``outputs`` as ``<prefix><i>`` (counting this step's calls)."""
        clock = self.hook.clock  # the hook's step and mode (its properties read the same)
        step = clock.step
        if step < 0:
            return
        if step != self._loss_step:
            self._loss_step = step
            self._loss_calls.clear()
        if hasattr(outputs, "detach"):
            tensors = [outputs]
        elif isinstance(outputs, (tuple, list)):
            tensors = [t for t in outputs if hasattr(t, "detach")]
        else:
            return
        for tensor in tensors:
            index = self._loss_calls.get(prefix, 0)
            self._loss_calls[prefix] = index + 1
            name = prefix + str(index)
            wanted = self._loss_wanted.get(name)
            if wanted is None:
                wanted = self._loss_wanted[name] = self._sent_to_sinks(name)
            if wanted:
                mode = clock.mode
                self._queue(name, mode, _kept(tensor), time.time(), step,
                            clock.mode_steps.get(mode, step))

    def _sent_to_sinks(self, name: str) -> bool:
        """True where the hook sends ``name`` to its sinks when it saves it: a member of a saved
        losses or metrics collection (mltrace.capture.outputs)."""
        plan = self.hook.plan
        if not plan.prepared:
            return False
        saved = {c.name for c in plan.saved}
        return any(c.name in METRIC_COLLECTIONS and c.name in saved
                   for c in plan.collections_of(name))

    def _stop_watching_losses(self) -> None:
        """Remove the callbacks (at close, or after a failure); the hook's saved steps log the
        losses again."""
        self.loss_prefixes = ()
        handles, self._loss_handles = self._loss_handles, []
        for handle in handles:
            try:
                handle.remove()
            except Exception:  # a module already gone
                pass
        adapter, self._adapter = self._adapter, None
        if adapter is not None and self._watch_loss in adapter.loss_listeners:
            adapter.loss_listeners.remove(self._watch_loss)


def _kept(tensor: Any) -> Any:
    """What the training thread keeps of a loss: a float on the CPU, else the detached device
    tensor (its mean when it has several elements, as the hook logs them), read later."""
    if tensor.numel() != 1:
        tensor = tensor.detach().float().mean()
    elif not tensor.is_cpu:
        return tensor.detach()  # no graph kept alive: only the value's storage
    return tensor.item() if tensor.is_cpu else tensor


def as_float(value: Any) -> float | None:
    """A queued value as a float (a device tensor is copied to the host here, on the sink's
    thread); None when it cannot be read."""
    if isinstance(value, float):
        return value
    try:
        return float(value)
    except Exception as exc:  # a failed device: the point is left out, the others are logged
        logger.debug("a loss value could not be read: %s", exc)
        return None
