"""GradientTape loops: the tape marks the step boundary and hands over gradients and the loss.

A wrapped tape begins a TRAIN step when it starts recording, so an eager loop needs no other
call to the hook; inside a user's ``tf.function`` the step begins in a ``tf.py_function`` whose
output (whether the step is due) the captures traced into that graph run under. The tape's
``gradient`` call saves the gradients, the variables they are taken of and the loss.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import tensorflow as tf

from mltrace.capture.errors import guarded
from mltrace.collections import CollectionKeys
from mltrace.exceptions import MltraceTypeError
from mltrace.modes import ModeKeys
from mltrace.tensorflow._capture import InStepCapture
from mltrace.tensorflow._tensors import gradient_name, is_keras_variable, variable_name
from mltrace.tensorflow.collection import TAPE_REGEXES


class TapeCapture(InStepCapture):
    """Wrapping a tf.GradientTape on the instance: a step per tape, its gradients, weights and
    loss saved."""

    def __init__(self) -> None:
        super().__init__()
        self._started_tapes: weakref.WeakSet[tf.GradientTape] = weakref.WeakSet()
        self._tape_mode = False

    def wrap_tape(self, tape: tf.GradientTape) -> tf.GradientTape:
        """Make ``tape`` begin a TRAIN step when entered and save gradients, the weights they are
        taken of (``weights/<var>``) and the loss (``loss``) in ``tape.gradient``.
        Returns ``tape`` itself (wrapped on the instance, never on its class)."""
        if not isinstance(tape, tf.GradientTape):
            raise MltraceTypeError(f"wrap_tape needs a tf.GradientTape, got {type(tape).__name__}")
        if not self._tape_mode:
            for key, regex in TAPE_REGEXES.items():
                self.hook.collection_manager.get(key).include(regex)
            self.hook.plan.forget()
            self._tape_mode = True
        self.hook.prepare()  # a step traced into a tf.function must know now what it saves
        # ``with tape:`` looks __enter__ up on the class; the instance method it calls to start
        # recording (also on stop_recording() and reset()) is private, and the only place where
        # a step can begin before the tape records anything.
        push, gradient = tape._push_tape, tape.gradient

        @functools.wraps(push)
        def _push_tape(*args: Any, **kwargs: Any) -> Any:
            if tape not in self._started_tapes:
                self._started_tapes.add(tape)
                self._tape_step()  # before recording starts: a stop request leaves no tape behind
            return push(*args, **kwargs)

        @functools.wraps(gradient)
        def _gradient(target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
            grads = gradient(target, sources, *args, **kwargs)
            self._after_gradient(target, sources, grads)
            return grads

        self.patch(tape, "_push_tape", _push_tape, weak=True)
        self.patch(tape, "gradient", _gradient, weak=True)
        return tape

    @guarded()
    def _tape_step(self) -> None:
        if tf.executing_eagerly():
            self._tape_step_eager()
            if self.hook.stop_requested is not None:
                # A rule asked to stop: finish the trial, then end the user's loop here.
                raise self.hook.stop_training_error()
            return
        pred = tf.py_function(self._tape_step_runtime, [], tf.bool)
        pred.set_shape([])
        self._trace_preds[tf.compat.v1.get_default_graph()] = pred

    def _tape_step_eager(self) -> None:
        self.hook.end_step()  # in the previous step's mode
        self.hook.set_mode(ModeKeys.TRAIN)  # smdebug: a wrapped tape trains
        self.hook.begin_step()

    def _tape_step_runtime(self) -> tf.Tensor:
        self._run_guarded_tape_step()
        return tf.constant(bool(self.hook.step_active and not self.hook.disabled))

    @guarded()
    def _run_guarded_tape_step(self) -> None:
        self._tape_step_eager()

    @guarded()
    def _after_gradient(self, target: Any, sources: Any, grads: Any) -> None:
        pairs: list[tuple[str, Any]] = []
        for var, grad in zip(tf.nest.flatten(sources), tf.nest.flatten(grads)):
            if not (isinstance(var, tf.Variable) or is_keras_variable(var)):
                continue
            if grad is not None:
                name = gradient_name(var)
                self.register(name, CollectionKeys.GRADIENTS)
                pairs.append((name, grad))
            wname = "weights/" + variable_name(var)
            self.register(wname, self.classify_variable(var))
            pairs.append((wname, lambda v=var: tf.convert_to_tensor(v)))
        if isinstance(target, tf.Tensor):
            self.register("loss", CollectionKeys.LOSSES)
            pairs.append(("loss", target))
        self.capture(pairs)
