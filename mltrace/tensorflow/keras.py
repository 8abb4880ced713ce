"""KerasHook: a Keras 3 callback for ``model.fit`` / ``evaluate`` / ``predict`` (and, with
``wrap_tape``, GradientTape loops). The callback is the front door (a Keras class); the saving
logic is a framework-neutral mltrace.capture.hook.Hook (``hook.core``) with a KerasAdapter
(``hook.adapter``).

Names (smdebug's TF2 Keras hook):
  losses  ``loss``, ``val_loss`` (from Keras logs); GradientTape: ``loss``
  metrics every other log key (``mae``, ``val_mae``, ...), ``batch``, and record_tensor_value names
  weights / biases  ``<layer>/weights/<tf variable name>``
          (``dense/weights/sequential/dense/kernel:0``;
          Keras 3 names its tf.Variables by path), read after the step; GradientTape:
          ``weights/<tf variable name>``, read when the gradient is taken
  gradients  ``gradients/<tf variable name without :0>Grad``
  optimizer_variables  the optimizer's variables by TF name
          (``adam/sequential_dense_kernel_momentum:0``)
  layers  ``<layer>/inputs``, ``<layer>/outputs`` (``_<i>`` when a layer takes or returns several)
  inputs / outputs  ``inputs``, ``labels``, ``predictions`` (``_<i>`` for several)

Values that exist only inside Keras' compiled step (gradients, layer and model inputs/outputs)
reach the hook through ``tf.py_function`` calls in a second version of the step function, which
the hook hands Keras only for the steps that save them (see mltrace.tensorflow._core): the other
steps run the graph Keras built, XLA included. With ``steps_per_execution=N`` Keras calls
callbacks once per N batches: one hook step then spans N batches, and in-step values are those
of its first batch. Under MirroredStrategy in-step values are replica 0's (see
mltrace.tensorflow._distribution.in_first_replica); weights and losses are the synchronised ones.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np
import tensorflow as tf

from mltrace.capture.errors import guarded
from mltrace.collections import CollectionKeys
from mltrace.exceptions import MltraceTypeError
from mltrace.modes import ModeKeys
from mltrace.tensorflow._api import TFHookAPI
from mltrace.tensorflow._core import BY_NAME_ONLY, TFAdapter
from mltrace.tensorflow._tensors import gradient_name, io_names, layer_weight_name

logger = logging.getLogger(__name__)
_LOSS_KEYS = ("loss", "val_loss")
_FUNCTIONS = {
    ModeKeys.TRAIN: "train_function",
    ModeKeys.EVAL: "test_function",
    ModeKeys.PREDICT: "predict_function",
}


class KerasAdapter(TFAdapter):
    """TFAdapter plus what a Keras model needs: layer/model/optimizer capture points, the two
    versions of Keras' step functions, and the callbacks' work."""

    def __init__(self, owner: TFHookAPI | None = None) -> None:
        super().__init__(owner)
        self._model: Any = None
        self._weights_model: Any = None
        self._wrapped_ids: set[Any] = set()
        self._fit_depth = 0
        self._loops = 0  # fit / evaluate / predict loops running (validation nests in fit)
        self._versions: dict[tuple[int, ModeKeys], tuple[Any, Any]] = {}
        self._capture_due: dict[tuple[frozenset[str], int], bool] = {}
        self._capture_recorded: dict[int, bool] = {}  # by len(captured_names)

    # -- model registration -----------------------------------------------------------------
    def register_model(self, model: Any, keras_loop: bool = False) -> bool:
        """Attach to ``model``: capture what the saved collections need and, for fit/evaluate/
        predict (``keras_loop``), name its layers' weights. Returns True if new captures were
        installed (compiled functions must be traced again)."""
        self.hook.prepare()
        if keras_loop and model is not self._weights_model:
            self._name_layer_weights(model)
        self._model = model
        installed = False
        # Keras' recursive walk over nested layers is private; Model.layers lists only the top.
        for layer in model._flatten_layers(include_self=False):
            candidates = [f"{layer.name}/{k}{s}" for k in ("inputs", "outputs") for s in ("", "_0")]
            if id(layer) not in self._wrapped_ids and any(self.wanted(n) for n in candidates):
                self._wrap_call(layer, layer.name)
                installed = True
        if id(model) not in self._wrapped_ids and any(
            self.wanted(n) for n in ("inputs", "inputs_0", "predictions", "predictions_0")
        ):
            self._wrap_call(model, None)
            installed = True
        if ("compute_metrics", id(model)) not in self._wrapped_ids and any(
            self.wanted(n) for n in ("labels", "labels_0")
        ):
            self._wrap_compute_metrics(model)
            installed = True
        optimizer = getattr(model, "optimizer", None)
        wants_grads = CollectionKeys.GRADIENTS in {c.name for c in self.hook.plan.watched} or any(
            self.wanted(gradient_name(v)) for v in model.trainable_variables
        )
        if optimizer is not None and wants_grads and self.wrap_keras_optimizer(optimizer):
            installed = True
        if optimizer is not None:
            self.read_optimizer_variables(optimizer)
        return installed

    def _name_layer_weights(self, model: Any) -> None:
        """``<layer>/weights/<variable>`` for each weight of ``model``'s layers (read after each
        due step; smdebug's Keras names)."""
        self._weights_model = model
        self.layer_weights = []
        seen: set[int] = set()
        for layer in model.layers:
            for var in layer.weights:
                if id(var) not in seen:
                    seen.add(id(var))
                    name = layer_weight_name(layer.name, var)
                    self.register(name, self.classify_variable(var))
                    self.layer_weights.append((name, var))

    def _wrap_call(self, layer: Any, name: str | None) -> None:
        """Capture ``layer``'s inputs and outputs (the model's: ``inputs``, ``predictions``)."""
        self._wrapped_ids.add(id(layer))
        original = layer.call

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            outputs = original(*args, **kwargs)
            inputs = args[0] if args else kwargs.get("inputs")
            if name is None:
                self.capture(io_names("inputs", inputs) + io_names("predictions", outputs))
            else:
                self.capture(
                    io_names(f"{name}/inputs", inputs) + io_names(f"{name}/outputs", outputs)
                )
            return outputs

        self.patch(layer, "call", call)

    def _wrap_compute_metrics(self, model: Any) -> None:
        """Capture the labels, where Keras hands them to the metrics."""
        self._wrapped_ids.add(("compute_metrics", id(model)))
        original = model.compute_metrics

        @functools.wraps(original)
        def compute_metrics(x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> Any:
            self.capture(io_names("labels", y))
            return original(x, y, y_pred, sample_weight)

        self.patch(model, "compute_metrics", compute_metrics)

    def unpatch_all(self) -> None:
        """Restore every patched object, and the model's step functions: traced with the
        captures, they are dropped so that Keras traces them again; during a loop (the hook
        disabled itself) Keras calls them at the next batch, so the plain versions stay."""
        super().unpatch_all()
        model, self._model = self._model, None
        if model is not None:
            for mode, attr in _FUNCTIONS.items():
                versions = self._versions.get((id(model), mode))
                if not self._loops:
                    setattr(model, attr, None)
                elif versions is not None:
                    setattr(model, attr, versions[0])
        self._wrapped_ids.clear()
        self.keras_optimizers.clear()
        self._versions.clear()
        self.tracing_captures = None

    @guarded(user_facing=True)
    def check_recorder_budget(self, model: Any) -> None:
        """Raise if the flight recorder's memory budget cannot hold one step of what it keeps of
        ``model``'s weights and gradients (known before the first batch, so fit fails at once
        rather than the recorder turning itself off later).

        Raises:
            mltrace.exceptions.MltraceValueError: naming the bytes one step needs and the fixes.
        """
        recorder = self.hook.recorder
        if recorder is None or model is None:
            return
        self.hook.prepare()  # the recorded collections are resolved with the saved ones
        keys: dict[str, str] = {}
        sizes: list[tuple[str, int]] = []
        for layer in model.layers:
            for var in layer.weights:
                name = layer_weight_name(layer.name, var)
                keys[name] = self.classify_variable(var)
                sizes.append((name, _nbytes(var)))
        for var in model.trainable_variables:
            name = gradient_name(var)
            keys[name] = CollectionKeys.GRADIENTS
            sizes.append((name, _nbytes(var)))
        recorded = recorder.collections
        names = {c.name for c in recorded}

        def member(name: str) -> bool:
            return keys[name] in names or any(
                c.name not in BY_NAME_ONLY and self.is_member(c, name) for c in recorded)

        recorder.check_budget(sizes, member)

    # -- the callbacks' work ----------------------------------------------------------------
    @guarded()
    def loop_begin(self, mode: ModeKeys, model: Any) -> None:
        """fit / evaluate / predict begins: attach to the model and prepare its step functions."""
        self._loops += 1
        if mode is ModeKeys.TRAIN:
            self._fit_depth += 1
        if model is None:
            return
        if self.register_model(model, keras_loop=True):
            self._versions.clear()  # new captures: every version must be traced again
            for attr in _FUNCTIONS.values():
                setattr(model, attr, None)
        if self._has_captures and not model.run_eagerly and (id(model), mode) not in self._versions:
            self._versions[(id(model), mode)] = self._make_versions(model, mode)
        elif getattr(model, _FUNCTIONS[mode]) is None:  # eager: one function does both
            getattr(model, "make_" + _FUNCTIONS[mode])(force=True)

    def _make_versions(self, model: Any, mode: ModeKeys) -> tuple[Any, Any]:
        """(plain, capturing) step functions of ``mode``: Keras traces each at its first call."""
        attr = _FUNCTIONS[mode]
        make = getattr(model, "make_" + attr)
        make(force=True)
        plain = getattr(model, attr)
        jit = model.jit_compile
        if jit:
            logger.info(
                "mltrace: steps of %s that save in-step tensors run without XLA (jit_compile), "
                "which cannot call back into Python; the other steps keep it",
                model.name,
            )
            model.jit_compile = False
        try:
            make(force=True)
        finally:
            if jit:
                model.jit_compile = jit
        capturing = getattr(model, attr)
        setattr(model, attr, plain)
        return plain, capturing

    @property
    def _has_captures(self) -> bool:
        return bool(self._wrapped_ids) or bool(self.wrapped_optimizers)

    @guarded()
    def batch_begin(self, mode: ModeKeys) -> None:
        """A batch begins a step; hand Keras the step function version this step needs."""
        hook = self.hook
        if mode is not hook.mode:
            hook.end_step()  # the previous step ends in its own mode
            hook.set_mode(mode)
        hook.begin_step()
        model = self._model
        if model is None:
            return
        versions = self._versions.get((id(model), mode))
        if versions is not None:
            capture = self._wants_captures()
            self.tracing_captures = capture  # read by the captures while Keras traces
            if getattr(model, _FUNCTIONS[mode]) is not versions[capture]:
                setattr(model, _FUNCTIONS[mode], versions[capture])
        if hook.stop_requested is not None:
            # A rule's StopTraining action: Keras ends fit after this batch.
            model.stop_training = True

    def _wants_captures(self) -> bool:
        """True if this step saves (or the flight recorder keeps) something only in-step
        captures see."""
        plan = self.hook.plan
        if not self.hook.step_active:
            return False
        if plan.nan_watch or not self.captured_names:  # (known once the version is traced)
            return True
        if self._records_captures():
            return True
        due = plan.due_for(plan.saved)
        key = (frozenset(c.name for c in due), len(self.captured_names))
        wanted = self._capture_due.get(key)
        if wanted is None:
            wanted = any(plan.due_for(plan.collections_of(n)) for n in self.captured_names)
            self._capture_due[key] = wanted
        return wanted

    def _records_captures(self) -> bool:
        """True if the flight recorder keeps an in-step value this step (gradients, layer
        inputs/outputs, model inputs/outputs it records): the capturing version runs."""
        recorder = self.hook.recorder
        if recorder is None or recorder.current is None:
            return False
        key = len(self.captured_names)
        if key not in self._capture_recorded:
            plan = self.hook.plan
            self._capture_recorded = {key: any(
                any(c in recorder.collections for c in plan.collections_of(n))
                for n in self.captured_names)}
        return self._capture_recorded[key]

    @guarded()
    def batch_end(self, batch: int, logs: dict[str, Any] | None) -> None:
        """Save the batch's logs (losses, metrics, ``batch``; PREDICT: the predictions)."""
        hook = self.hook
        if not hook.step_active or not logs:
            return
        if hook.mode is ModeKeys.PREDICT:
            if "outputs" in logs:
                for name, value in io_names("predictions", logs["outputs"]):
                    hook.save_for_tensor(name, value)
            return
        for key, value in logs.items():
            if key == "outputs" or "smdebug_" in key:
                continue
            self.register(key, _log_collection(key))
            hook.save_for_tensor(key, _log_value(value))
        self.register("batch", CollectionKeys.METRICS)
        hook.save_for_tensor("batch", batch)

    @guarded()
    def epoch_end(self, logs: dict[str, Any] | None) -> None:
        """Save the epoch's validation results (``val_loss``, ``val_<metric>``: Keras has them only
        here) at the current step, the last validation step, whatever the save config says, as
        smdebug did; a collection switched off with end_step=0 stays off. smdebug also wrote the
        epoch's training logs there, so that an EVAL step held the training loss as ``loss``: the
        batches' logs already hold those values, in TRAIN steps."""
        hook = self.hook
        if not hook.clock.started or hook.writer is None or hook.step_written or not logs:
            return
        for key, value in logs.items():
            if not key.startswith("val_"):
                continue
            self.register(key, _log_collection(key))
            colls = [
                c
                for c in hook.plan.collections_of(key)
                if c.effective_save_config().get_save_config(hook.mode).end_step != 0
            ]
            if colls:
                hook.outputs.write_tensor(key, _log_value(value), None, colls)

    @guarded()
    def loop_end(self, mode: ModeKeys) -> None:
        """fit / evaluate / predict ended: write its last step and wait until its files are
        stored (the trial is readable right after fit returns; close() also marks it finished)."""
        self._loops = max(0, self._loops - 1)
        if mode is ModeKeys.TRAIN:
            self._fit_depth = max(0, self._fit_depth - 1)
        elif mode is ModeKeys.EVAL and self._fit_depth:
            return  # validation inside fit: the epoch's logs still go into this step
        self.tracing_captures = None
        self.hook.flush()


def _nbytes(var: Any) -> int:
    """A variable's bytes."""
    return int(np.prod(var.shape, dtype=np.int64)) * tf.as_dtype(var.dtype).size


def _log_collection(key: str) -> str:
    """The collection of a Keras log key: ``losses`` for the losses, else ``metrics``."""
    return CollectionKeys.LOSSES if key in _LOSS_KEYS else CollectionKeys.METRICS


def _log_value(value: Any) -> Any:
    """Keras 3 hands callbacks Python floats; smdebug saved Keras' float32 logs as 0-d float32."""
    return np.asarray(value, dtype=np.float32) if isinstance(value, float) else value


class KerasHook(TFHookAPI, tf.keras.callbacks.Callback):
    """Saves a Keras model's tensors in smdebug's format; pass it in ``callbacks=[hook]``.

    The modes are set by the callbacks (TRAIN in fit, EVAL in evaluate and validation, PREDICT
    in predict). ``metrics``, ``losses`` and ``sm_metrics`` are always saved (as smdebug); name
    more with ``include_collections`` (weights, biases, gradients, optimizer_variables, layers,
    inputs, outputs, or your own).

    Args: smdebug's (see TFHookAPI; each is described in mltrace.capture.options.HookOptions).

    When a rule's StopTraining action fires, the hook sets ``model.stop_training``: Keras ends
    fit after the current batch. In an eager GradientTape loop, entering the next wrapped tape
    closes the trial and raises mltrace.exceptions.StopTrainingRequested.

    Example:
        >>> hook = KerasHook(out_dir="/tmp/run", include_collections=["weights", "gradients"])
        >>> model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.Adam()), loss="mse")
        >>> model.fit(x, y, callbacks=[hook])
    """

    _adapter_class = KerasAdapter
    adapter: KerasAdapter

    # -- mltrace/smdebug API specific to TensorFlow -----------------------------------------
    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Capture gradients where Keras 3 applies them; returns ``optimizer`` itself. (fit
        wraps ``model.optimizer`` by itself when gradients are saved; custom loops need this.)"""
        if not hasattr(optimizer, "apply"):
            kind = type(optimizer).__name__
            raise MltraceTypeError(
                f"KerasHook.wrap_optimizer needs a Keras 3 optimizer, got {kind} "
                "(tf.compat.v1.train optimizers go with SessionHook)"
            )
        self.adapter.wrap_keras_optimizer(optimizer)
        return optimizer

    def wrap_tape(self, tape: tf.GradientTape) -> tf.GradientTape:
        """Make a GradientTape loop save like fit does: entering the tape begins a TRAIN step,
        ``tape.gradient`` saves the gradients, the weights they are taken of (``weights/<var>``)
        and the loss (``loss``). Returns ``tape`` itself."""
        return self.adapter.wrap_tape(tape)

    def register_model(self, model: Any) -> None:
        """Capture a model's layers, inputs and outputs in a GradientTape loop (fit does this
        itself)."""
        if not isinstance(model, tf.keras.Model):
            raise MltraceTypeError(
                f"register_model needs a Keras model, got {type(model).__name__}"
            )
        self.adapter.register_model(model)

    # -- Keras callbacks --------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.adapter.check_recorder_budget(self.model)
        self.adapter.loop_begin(ModeKeys.TRAIN, self.model)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.adapter.loop_begin(ModeKeys.EVAL, self.model)

    def on_predict_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.adapter.loop_begin(ModeKeys.PREDICT, self.model)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.adapter.batch_begin(ModeKeys.TRAIN)

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.adapter.batch_begin(ModeKeys.EVAL)

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.adapter.batch_begin(ModeKeys.PREDICT)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.adapter.batch_end(batch, logs)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.adapter.batch_end(batch, logs)

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.adapter.batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.adapter.epoch_end(logs)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.adapter.loop_end(ModeKeys.TRAIN)

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self.adapter.loop_end(ModeKeys.EVAL)

    def on_predict_end(self, logs: dict[str, Any] | None = None) -> None:
        self.adapter.loop_end(ModeKeys.PREDICT)

    def __setstate__(self, state: dict[str, Any]) -> None:
        tf.keras.callbacks.Callback.__init__(self)
