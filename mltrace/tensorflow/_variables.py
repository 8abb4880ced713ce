"""Variables and the gradients applied to them, in Keras' loops and the user's own.

Variables (layer weights, optimizer variables, variables added with ``Collection.add``) are
read eagerly between steps, once the step has updated them. Gradients exist only inside the
step: Keras 3 has no ``get_gradients`` to patch (smdebug patched it in Keras 2), so they are
taken where the optimizer applies them (``optimizer.apply``); under mixed precision a
LossScaleOptimizer's inner optimizer receives them, unscaled by the loss scale factor.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from mltrace.capture.errors import guarded
from mltrace.collections import CollectionKeys
from mltrace.modes import ModeKeys
from mltrace.tensorflow._capture import InStepCapture
from mltrace.tensorflow._tensors import dense, gradient_name, is_keras_variable, variable_name


class VariableCapture(InStepCapture):
    """Reading variables after due steps and capturing the gradients a Keras optimizer applies."""

    def __init__(self) -> None:
        super().__init__()
        self.keras_optimizers: list[Any] = []
        self.wrapped_optimizers: set[int] = set()
        #: (name, variable) of the layer weights read after each due step (Keras loops).
        self.layer_weights: list[tuple[str, Any]] = []

    def read_variables(self) -> None:
        """Save the variables due this step: layer weights, optimizer variables, added ones."""
        hook = self.hook
        for name, var in self.layer_weights:
            hook.save_for_tensor(name, var)
        if hook.mode is ModeKeys.TRAIN:
            for opt in self.keras_optimizers:
                for var in opt.variables:
                    name = variable_name(var)
                    self.register(name, CollectionKeys.OPTIMIZER_VARIABLES)
                    hook.save_for_tensor(name, var)
        for coll in list(hook.collection_manager.get_collections().values()):
            for name, obj in getattr(coll, "tf_objects", {}).items():
                if _readable_now(obj):
                    hook.save_for_tensor(name, obj)

    def read_optimizer_variables(self, optimizer: Any) -> None:
        """Save ``optimizer.variables`` (collection optimizer_variables) at the end of each step."""
        if not any(optimizer is o for o in self.keras_optimizers):
            self.keras_optimizers.append(optimizer)

    def wrap_keras_optimizer(self, optimizer: Any) -> bool:
        """Capture gradients where Keras 3 applies them (``optimizer.apply``); False if done."""
        if id(optimizer) in self.wrapped_optimizers:
            return False
        self.wrapped_optimizers.add(id(optimizer))
        self.read_optimizer_variables(optimizer)
        # LossScaleOptimizer hands its inner optimizer unscaled gradients.
        target = getattr(optimizer, "inner_optimizer", None) or optimizer
        original = target.apply

        @functools.wraps(original)
        def apply(grads: Any, trainable_variables: Any = None) -> Any:
            grads = list(grads)
            if trainable_variables is not None:
                trainable_variables = list(trainable_variables)
            # Keras 3 keeps the variables it was built with only in a private list, which is
            # what apply(grads) without variables updates: no public accessor has it.
            variables = trainable_variables or list(target._trainable_variables)
            self._capture_gradients(grads, variables, getattr(target, "loss_scale_factor", None))
            pred = None if tf.executing_eagerly() else self._trace_pred()
            if pred is None or not target.built:  # (variables made here must not wait on pred)
                return original(grads, trainable_variables)
            # A step begun inside this tf.function reads the previous step's optimizer variables
            # when it begins: that must happen before this step updates them.
            with tf.control_dependencies([pred]):
                return original(grads, trainable_variables)

        self.patch(target, "apply", apply)
        return True

    @guarded()
    def _capture_gradients(
        self, grads: list[Any], variables: list[Any], scale: float | None
    ) -> None:
        pairs: list[tuple[str, Any]] = []
        for grad, var in zip(grads, variables):
            if grad is None:
                continue
            name = gradient_name(var)
            self.register(name, CollectionKeys.GRADIENTS)
            pairs.append((name, (lambda g=grad: dense(g) / scale) if scale else grad))
        self.capture(pairs)

    def unpatch_all(self) -> None:
        """Undo every ``patch``; the optimizers' ``apply`` restored, each may be wrapped again."""
        self.wrapped_optimizers.clear()
        super().unpatch_all()


def _readable_now(obj: Any) -> bool:
    """True for a variable whose value can be read eagerly (not one of a tf.compat.v1 graph,
    which SessionHook reads in the session). ``_in_graph_mode`` is private, but the public test
    (``tf.is_symbolic_tensor(var.handle)``) raises for a distributed variable outside a replica
    context, and every variable type answers this one."""
    if is_keras_variable(obj):
        return True
    # TF internal: a tf.compat.v1 graph variable says so only in a private flag
    return isinstance(obj, tf.Variable) and not getattr(obj, "_in_graph_mode", False)
