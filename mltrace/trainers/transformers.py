"""Hugging Face Transformers: ``MltraceCallback`` for ``transformers.Trainer``.

    from mltrace.transformers import MltraceCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[MltraceCallback(out_dir="/tmp/run", include_collections=[
                          "weights", "gradients", "losses", "metrics"])])

Steps are optimizer steps: with ``gradient_accumulation_steps=n`` a TRAIN step spans n
micro-batches (their losses ``loss_output_0..n-1``, the model's own loss of each), and its gradients
are the accumulated ones the optimizer used. ``trainer.train()`` records TRAIN steps,
``evaluate()`` EVAL steps and ``predict()`` PREDICT steps, a step per batch. What the Trainer
logs (``loss``, ``grad_norm``, ``learning_rate``, ``eval_loss``, ...; ``test_*`` of predict) is
saved in collection ``metrics`` at the step it is logged in, under the Trainer's names.

MLflow: with ``report_to="mlflow"`` the hook logs into the run Transformers' MLflowCallback
opened (the Trainer's metrics stay that callback's; mltrace adds its losses, tags and
artifacts); ``mlflow=False`` keeps mltrace out of it, ``mlflow={...}`` sets the sink's options
(``{"system_metrics": True}``: MLflow's CPU, memory and GPU utilization, see docs/guide/mlflow.md).

``report_to="mltrace"`` is not possible: Transformers 5.23 looks ``report_to`` names up in a
fixed dict of its own integrations (``INTEGRATION_TO_CALLBACK``) with no registration API or entry
point, so a third-party callback is passed in ``callbacks=[...]``.

At the end of ``train()`` the last step is written and every file is on storage; the end marker
follows at ``callback.close()`` or interpreter exit, so that ``evaluate()``/``predict()`` after
training are recorded in the same trial. A rule's StopTraining action ends training at the next
optimizer step (``control.should_training_stop``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from mltrace.capture.errors import ErrorPolicy, guarded
from mltrace.modes import ModeKeys
from mltrace.pytorch.module_hooks import forward_hook, forward_pre_hook
from mltrace.trainers.capture import TrainerCapture

#: report_to names whose callback logs the Trainer's metrics into the active MLflow run.
_MLFLOW_INTEGRATIONS = ("mlflow", "dagshub")


class MltraceCallback(TrainerCallback):
    """Saves a ``transformers.Trainer``'s tensors in smdebug's format (see the module doc).

    Args:
        out_dir: where the trial goes (default ``<args.output_dir>/mltrace``).
        **hook_options: ``mltrace.pytorch.Hook``'s options (``save_config``,
            ``include_collections``, ``reduction_config``, ``mlflow``, ...); ``step_boundary`` is
            the Trainer's. ``mlflow`` None (default) follows ``report_to``.

    Raises:
        mltrace.exceptions.MltraceValueError: an unknown hook option.
    """

    def __init__(self, out_dir: str | None = None, **hook_options: Any) -> None:
        self.capture = TrainerCapture(out_dir, hook_options)
        self.errors = ErrorPolicy(bool(hook_options.get("strict")), lambda reason: None)
        self._loop_mode: ModeKeys | None = None

    @property
    def hook(self) -> Any:
        """The mltrace.pytorch.Hook (None until the Trainer is built)."""
        return self.capture.hook

    def close(self) -> None:
        """Close the trial (end marker, MLflow artifacts); also happens at interpreter exit."""
        self.capture.close()

    # -- Trainer events ---------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """The Trainer is built: build the hook and register the model (user errors raise here)."""
        self._attach(args, model)

    def _attach(self, args: Any, model: Any) -> None:
        if model is None:
            return
        before = self.capture.hook
        hook = self.capture.attach(model, args.output_dir)
        if hook is not before:
            self.errors = hook.errors
            forward_pre_hook(model, self._before_forward, prepend=True)
            forward_hook(model, self._after_forward)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """After the MLflowCallback opened its run (it comes first in the Trainer's list). A
        Trainer built with ``model_init`` has its model only now."""
        self._attach(args, model)
        self._join_mlflow(args)

    @guarded()
    def _join_mlflow(self, args: Any) -> None:
        self.capture.attach_mlflow(_mlflow_options(args))

    @guarded()
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An optimizer step begins (before its first micro-batch)."""
        self._loop_mode = None
        self.capture.begin_batch(ModeKeys.TRAIN)
        if self.capture.stop_requested:
            control.should_training_stop = True

    @guarded()
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """The Trainer's logs, saved in collection ``metrics``."""
        self.capture.attach_mlflow(_mlflow_options(args))
        if logs:
            self.capture.save_logged(logs, always=True, to_sinks=_mlflow_options(args) is None)

    @guarded()
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An evaluation ended (its metrics come with on_log)."""
        self._loop_mode = None

    @guarded()
    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        """A prediction ended: its metrics (``test_*``), which the Trainer does not log."""
        self._loop_mode = None
        self.capture.attach_mlflow(_mlflow_options(args))
        if metrics:
            self.capture.save_logged(metrics, always=True, to_sinks=True)

    @guarded()
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Write the last step and wait for its files (see the module doc)."""
        self.capture.end_training()

    # -- model callbacks --------------------------------------------------------------------------
    @guarded()
    def _before_forward(self, module: torch.nn.Module, inputs: Any) -> None:
        """Each evaluation or prediction batch is a step (the Trainer has no event before one).
        Eval-mode forwards outside ``evaluate``/``predict`` (the script's own inference) are not."""
        if module.training:
            return
        if self._loop_mode is None:
            self._loop_mode = _loop_mode()
            if self._loop_mode is None:
                return
        self.capture.begin_batch(self._loop_mode)

    @guarded()
    def _after_forward(self, module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
        """The model's own loss of the batch (present when the batch has labels)."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else None
        if loss is not None:
            self.capture.save_loss(loss)


def _mlflow_options(args: Any) -> dict[str, Any] | None:
    """The sink options that join the Trainer's MLflow run ({}: the active run), or None when
    the Trainer does not report to MLflow."""
    report_to = getattr(args, "report_to", None) or []
    if isinstance(report_to, str):
        report_to = [report_to]
    return {} if any(name in report_to for name in _MLFLOW_INTEGRATIONS) else None


def _loop_mode() -> ModeKeys | None:
    """PREDICT inside ``Trainer.predict``, EVAL inside ``Trainer.evaluate``, else None: the
    Trainer runs both through one loop and tells callbacks which it was only afterwards, so the
    calling frames say (looked up once per loop, not per batch)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name in ("predict", "evaluate") and isinstance(frame.f_locals.get("self"), Trainer):
            return ModeKeys.PREDICT if frame.f_code.co_name == "predict" else ModeKeys.EVAL
        frame = frame.f_back  # type: ignore[assignment]
    return None


__all__ = ["MltraceCallback"]
