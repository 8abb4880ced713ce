"""What mltrace's trainer callbacks share (mltrace.transformers, mltrace.lightning): a PyTorch
hook whose steps a trainer's callback begins, and the trainer's losses and logged metrics.

- Steps: the hook is built with ``step_boundary="trainer"``: the callback sets the mode and calls
  :meth:`TrainerCapture.begin_batch` where the trainer says a batch begins. A TRAIN step is one
  optimizer step (micro-batches of gradient accumulation continue it), and its gradients are the
  accumulated ones the optimizer used; each EVAL and PREDICT batch is a step.
- Losses: each micro-batch's loss is ``loss_output_<i>`` (collection ``losses``), i counting the
  micro-batches of the step, as the PyTorch hook names losses under gradient accumulation.
- Logged metrics (collection ``metrics``, always saved): what the trainer logs, under its own names,
  at the step it is logged in.
- MLflow: attached once the trainer's own MLflow logger has opened its run, so both log into one
  run; names that logger sends are not sent a second time by mltrace.
- Training end: the current step is written and every queued file is on storage, so the trial
  is complete up to there while the process goes on (evaluation after training still records).
  The end marker comes with ``close()`` (or at interpreter exit).
"""

from __future__ import annotations

import inspect
import logging
import numbers
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mltrace.collections import CollectionKeys
from mltrace.config import name_list
from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys

logger = logging.getLogger(__name__)

#: Hook options the callbacks set themselves.
_RESERVED = ("out_dir", "step_boundary")
LOSS_NAME = "loss"


def check_hook_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``mltrace.pytorch.Hook`` given to a callback, checked at its construction.

    Raises:
        MltraceValueError: an option the hook does not take, or one the callback sets itself.
    """
    from mltrace.pytorch import Hook

    valid = [p for p in inspect.signature(Hook.__init__).parameters if p not in ("self", *_RESERVED)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise MltraceValueError(f"unknown hook option(s) {unknown} for the mltrace callback; valid: "
                                f"{', '.join(valid)} (steps follow the trainer: no step_boundary)")
    return dict(options)


class TrainerCapture:
    """One trainer's hook, built when the trainer hands over its model.

    Args:
        out_dir: the trial's location (None: the trainer's folder + ``/mltrace``, see attach).
        options: other ``mltrace.pytorch.Hook`` options (checked with check_hook_options);
            ``mlflow``: None follows the trainer (MLflow on when the trainer logs to MLflow),
            False never, True or a dict of the MLflow sink's options always.
    """

    def __init__(self, out_dir: str | None, options: Mapping[str, Any]) -> None:
        self.out_dir = out_dir
        self.options = check_hook_options(options)
        self.mlflow = self.options.pop("mlflow", None)
        self.hook: Any = None
        self._mlflow_attached = False
        self._metrics_saved = False

    def attach(self, model: torch.nn.Module, default_dir: str) -> Any:
        """Build the hook and register ``model``; returns the hook. Once steps are recorded,
        the hook stays; a trainer that replaces its model before that (Transformers'
        ``model_init`` builds a new one when training begins) gets a new hook for the new one."""
        if self.hook is not None:
            if any(m is model for m in self.hook.torch.modules):
                return self.hook
            if self.hook.clock.started:
                logger.warning("the trainer trains another model than the one mltrace records "
                               "(%s): its tensors are not saved", type(model).__name__)
                return self.hook
            self.hook.close()  # it wrote nothing yet: no file is left behind
            self.hook, self._metrics_saved = None, False
        from mltrace.pytorch import Hook

        out_dir = self.out_dir or os.path.join(default_dir, "mltrace")
        options = dict(self.options)
        if options.get("include_collections") is not None:
            # metrics is saved anyway, once the trainer logs something (a collection still
            # empty when the first step begins would be refused as matching nothing)
            options["include_collections"] = [
                c for c in name_list("include_collections", options["include_collections"],
                                     "collection name", "weights") if c != CollectionKeys.METRICS]
        hook = Hook(out_dir=out_dir, step_boundary="trainer", **options)
        hook.register_module(model)
        self.hook = hook
        return hook

    def attach_mlflow(self, trainer_options: dict[str, Any] | None) -> None:
        """Log to MLflow from now on if asked (once). ``trainer_options``: the sink options that
        join the run of the trainer's MLflow logger (``{}``: the active run), or None when the
        trainer does not log to MLflow. A failure is logged, never raised into training."""
        if self.hook is None or self._mlflow_attached:
            return
        self._mlflow_attached = True
        wanted = self.mlflow if self.mlflow is not None else trainer_options is not None
        if not wanted:
            return
        options = {**(trainer_options or {}), **(self.mlflow if isinstance(self.mlflow, dict) else {})}
        try:
            self.hook.add_sink("mlflow", options)
        except Exception as exc:
            if self.hook.strict:
                raise
            logger.error("mltrace does not log to MLflow (the trial is still saved): %s: %s",
                         type(exc).__name__, exc)

    @property
    def saving(self) -> bool:
        """True when the current step saves something (cheap: for per-batch callbacks)."""
        hook = self.hook
        return hook is not None and hook.step_active

    @property
    def active(self) -> bool:
        """True while the hook exists and saves (not closed, not disabled)."""
        hook = self.hook
        return hook is not None and not hook.closed and not hook.disabled

    def begin_batch(self, mode: ModeKeys) -> None:
        """A batch of ``mode`` begins (a TRAIN batch may continue the current step)."""
        if self.active:
            self.hook.set_mode(mode)
            self.hook.torch.begin_batch()

    def save_loss(self, loss: Any) -> None:
        """Save one micro-batch's loss (a scalar tensor) as ``loss_output_<i>``."""
        if self.active and self.hook.step_active and isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.hook.record_tensor_value(LOSS_NAME, loss)

    def save_logged(self, logs: Mapping[str, Any], always: bool, to_sinks: bool) -> None:
        """Save the trainer's logged scalars in the current step (collection ``metrics``).

        Args:
            logs: name -> number or one-element tensor (other values are left out).
            always: write them whatever the save config says (a trainer's periodic logs, few and
                rarely on a save step); else only when the metrics collection is due. A metrics
                collection switched off for the mode (end_step=0) stays off.
            to_sinks: also send them to MLflow (False when the trainer's own MLflow logger does).
        """
        hook = self.hook
        if not always and self._metrics_saved and not self.saving:
            return  # the per-batch fast path: nothing is due this step
        if not self.active or hook.writer is None or not hook.clock.started:
            return
        if hook.step_written:  # between steps: the values go to the next one
            for name, value in logs.items():
                number = _scalar(value)
                if number is not None:
                    hook.save_tensor(str(name), number, CollectionKeys.METRICS)
            return
        metrics = hook.get_collection(CollectionKeys.METRICS)
        if not self._metrics_saved and hook.plan.add_saved(metrics):
            hook.plan.forget()
            hook.decide_due()  # metrics may be due this very step (as Hook.save_tensor does)
        self._metrics_saved = True
        if not always and not hook.step_active:
            return  # nothing is due this step: no value is even copied to the host
        for key, value in logs.items():
            name = str(key)
            if name not in metrics.tensor_names:
                metrics.add_tensor_name(name)
                hook.plan.forget(name)
            colls = [c for c in hook.plan.collections_of(name)
                     if c.effective_save_config().get_save_config(hook.mode).end_step != 0]
            if not always:
                colls = hook.plan.due_for(colls)
            number = _scalar(value) if colls else None
            if number is not None:
                hook.outputs.write_tensor(name, number, None, colls, to_sinks=to_sinks)

    @property
    def stop_requested(self) -> bool:
        """True when a rule's StopTraining action asked this run to stop."""
        return self.active and self.hook.stop_requested is not None

    def end_training(self) -> None:
        """Training ended: write the current step and wait until every queued file is stored
        (the trial is readable up to here); stop MLflow's system metrics of the run."""
        hook = self.hook
        if hook is None or hook.closed:
            return
        if not hook.disabled:
            hook.flush()
        for sink in hook.sinks:
            stop = getattr(sink, "stop_system_metrics", None)
            if stop is not None:
                try:
                    stop()
                except Exception as exc:  # MLflow's sampler: never a reason to fail training
                    logger.warning("stopping MLflow's system metrics failed: %s", exc)

    def close(self) -> None:
        """Close the hook: the last step, the collections, the end marker; MLflow artifacts."""
        if self.hook is not None:
            self.hook.close()


def _scalar(value: Any) -> np.ndarray | None:
    """A logged value as a 0-d float64 array, or None for what is not one number."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            return None
        return np.asarray(value.detach().float().cpu().item(), dtype=np.float64)
    if isinstance(value, (bool, np.bool_)):
        return np.asarray(float(value), dtype=np.float64)
    if isinstance(value, numbers.Real):
        return np.asarray(float(value), dtype=np.float64)
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "biuf":
        return np.asarray(value.reshape(()), dtype=np.float64)
    return None
