"""Lightning: ``MltraceCallback`` for ``lightning.Trainer`` (``lightning.pytorch``).

    from mltrace.lightning import MltraceCallback
    trainer = L.Trainer(callbacks=[MltraceCallback(out_dir="/tmp/run", include_collections=[
        "weights", "gradients", "losses", "metrics"])], accumulate_grad_batches=2)

The LightningModule is the registered model (tensor names ``<ModuleClass>_<param path>``). Steps
are optimizer steps: with ``accumulate_grad_batches=n`` a TRAIN step spans n batches, whose losses
(what ``training_step`` returned) are ``loss_output_0..n-1``, and its gradients are the
accumulated ones the optimizer used. The training, validation, test and predict loops record
TRAIN, EVAL, EVAL and PREDICT steps, a step per batch (the sanity check's batches are not
recorded: Lightning discards their results too). What the module ``self.log``s (and
``log_dict``) is saved in collection ``metrics`` under its name, in the step it is logged in,
when the collection is due (its save config, as every collection).

MLflow: with an ``MLFlowLogger`` among the Trainer's loggers the hook logs into that logger's run
(its metrics stay the logger's; mltrace adds its losses, tags and artifacts); ``mlflow=False``
keeps mltrace out, ``mlflow={...}`` sets the sink's options (``{"system_metrics": True}``).

At the end of ``fit`` the last step is written and every file is on storage; the end marker
follows at ``callback.close()`` or interpreter exit, so ``validate``/``test``/``predict`` after
``fit`` go into the same trial. A rule's StopTraining action sets ``trainer.should_stop``.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch

from mltrace.capture.errors import ErrorPolicy, guarded
from mltrace.modes import ModeKeys
from mltrace.trainers.capture import TrainerCapture

logger = logging.getLogger(__name__)


class MltraceCallback(pl.Callback):
    """Saves a ``lightning.Trainer``'s tensors in smdebug's format (see the module doc).

    Args:
        out_dir: where the trial goes (default ``<trainer.default_root_dir>/mltrace``).
        **hook_options: ``mltrace.pytorch.Hook``'s options (``save_config``,
            ``include_collections``, ``reduction_config``, ``mlflow``, ...); ``step_boundary`` is
            the Trainer's. ``mlflow`` None (default) follows the Trainer's loggers.

    Raises:
        mltrace.exceptions.MltraceValueError: an unknown hook option.
    """

    def __init__(self, out_dir: str | None = None, **hook_options: Any) -> None:
        self.capture = TrainerCapture(out_dir, hook_options)
        self.errors = ErrorPolicy(bool(hook_options.get("strict")), lambda reason: None)
        self._module: pl.LightningModule | None = None
        self._mlflow_logger = False  # the Trainer has an MLFlowLogger (looked up at setup)

    @property
    def hook(self) -> Any:
        """The mltrace.pytorch.Hook (None until the Trainer sets up)."""
        return self.capture.hook

    def close(self) -> None:
        """Close the trial (end marker, MLflow artifacts); also happens at interpreter exit."""
        self.capture.close()

    # -- set-up -----------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """fit/validate/test/predict begins: build the hook and register the module (once), log
        into the MLflowLogger's run if there is one, and see what the module logs."""
        if self.capture.hook is None:
            self.errors = self.capture.attach(pl_module, trainer.default_root_dir).errors
        self._attach_mlflow(trainer)
        if self._module is not pl_module:
            self._watch_log(pl_module)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Give the module its own ``log`` back."""
        if self._module is not None and "log" in vars(self._module):
            del self._module.log
        self._module = None

    @guarded()
    def _attach_mlflow(self, trainer: pl.Trainer) -> None:
        from lightning.pytorch.loggers import MLFlowLogger

        found = next((lg for lg in trainer.loggers if isinstance(lg, MLFlowLogger)), None)
        self._mlflow_logger = found is not None
        if found is None:
            self.capture.attach_mlflow(None)
            return
        # The logger's run: created by its first use (run_id), in its tracking store (Lightning
        # internal: MLFlowLogger keeps the URI it was given only in a private attribute).
        self.capture.attach_mlflow({"run_id": found.run_id, "tracking_uri": found._tracking_uri})

    def _watch_log(self, pl_module: pl.LightningModule) -> None:
        """Wrap this module's ``log`` (an instance attribute; the class is untouched), so that
        every ``self.log``/``log_dict`` value also reaches the hook."""
        original = pl_module.log

        def log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
            original(name, value, *args, **kwargs)
            # logger=None (Lightning's default) and True both send the value to the loggers
            self._logged(name, value, to_loggers=kwargs.get("logger") is not False)

        pl_module.log = log  # type: ignore[method-assign]
        self._module = pl_module

    @guarded()
    def _logged(self, name: str, value: Any, to_loggers: bool) -> None:
        trainer = self._module.trainer if self._module is not None else None
        if trainer is None or trainer.sanity_checking:
            return
        to_sinks = not (to_loggers and self._mlflow_logger)
        self.capture.save_logged({name: value}, always=False, to_sinks=to_sinks)

    # -- batches ----------------------------------------------------------------------------------
    @guarded()
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        """A training batch: a new TRAIN step after each optimizer step."""
        self.capture.begin_batch(ModeKeys.TRAIN)
        if self.capture.stop_requested:
            trainer.should_stop = True

    @guarded()
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        """The batch's loss; Lightning divided it by accumulate_grad_batches for backward."""
        if not self.capture.saving:
            return
        loss = _loss_of(outputs)
        if loss is not None and pl_module.automatic_optimization:
            loss = loss.detach() * trainer.accumulate_grad_batches
        self.capture.save_loss(loss)

    @guarded()
    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                  batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """A validation batch: an EVAL step (not during the sanity check)."""
        self._loop_batch_began(trainer, ModeKeys.EVAL)

    @guarded()
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """What validation_step returned, if it is a loss."""
        self._loop_batch_ended(trainer, outputs)

    @guarded()
    def on_test_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                            batch_idx: int, dataloader_idx: int = 0) -> None:
        """A test batch: an EVAL step."""
        self._loop_batch_began(trainer, ModeKeys.EVAL)

    @guarded()
    def on_test_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """What test_step returned, if it is a loss."""
        self._loop_batch_ended(trainer, outputs)

    @guarded()
    def on_predict_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                               batch_idx: int, dataloader_idx: int = 0) -> None:
        """A predict batch: a PREDICT step."""
        self._loop_batch_began(trainer, ModeKeys.PREDICT)

    def _loop_batch_began(self, trainer: pl.Trainer, mode: ModeKeys) -> None:
        """A batch of the validation, test or predict loop begins a step of ``mode``, except in
        the sanity check (only fit's validation loop has one; Lightning discards its results)."""
        if not trainer.sanity_checking:
            self.capture.begin_batch(mode)

    def _loop_batch_ended(self, trainer: pl.Trainer, outputs: Any) -> None:
        """What a validation or test step returned, saved if it is a loss (not in the sanity
        check)."""
        if not trainer.sanity_checking:
            self.capture.save_loss(_loss_of(outputs))

    @guarded()
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Write the last step and wait for its files (see the module doc)."""
        self.capture.end_training()

    @guarded()
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A validation loop ended outside fit (``trainer.validate``): its files are written."""
        if trainer.state.fn == "validate":
            self.capture.end_training()

    @guarded()
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``trainer.test`` ended: its files are written."""
        self.capture.end_training()

    @guarded()
    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``trainer.predict`` ended: its files are written."""
        self.capture.end_training()


def _loss_of(outputs: Any) -> torch.Tensor | None:
    """A step's loss: the tensor it returned, or its ``"loss"`` entry."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    return outputs if isinstance(outputs, torch.Tensor) and outputs.numel() == 1 else None


__all__ = ["MltraceCallback"]
