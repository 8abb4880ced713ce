"""Keras under ``mltrace run``: ``Model.fit``, ``evaluate`` and ``predict`` get the KerasHook,
and GradientTape loops are wrapped as ``hook.wrap_tape`` wraps them.

Keras has no registry of default callbacks, so the three methods of ``keras.Model`` are wrapped
(framework code, never the script's): each call gets the session's one KerasHook appended to its
callbacks, unless the script passed an mltrace KerasHook itself or created a hook of its own.
The hook sets the modes (TRAIN in fit, EVAL in evaluate and validation, PREDICT in predict) and
counts steps across calls, as one hook passed to every call does. The model's optimizer is
wrapped (``hook.wrap_optimizer``) so that gradients are saved.

A custom training loop (TensorFlow backend) gets the same hook, as the script would attach it
with ``hook.wrap_tape`` and ``hook.wrap_optimizer``: every ``tf.GradientTape`` created outside
fit/evaluate/predict is wrapped (entering it begins a TRAIN step, ``tape.gradient`` saves the
gradients, the weights they are taken of and the loss), except a tape created while a wrapped
one records (the inner tape of a gradient penalty is part of the outer tape's step). Each Keras
optimizer that applies gradients outside fit is wrapped before it applies them (its variables
and the gradients it is given). Values only the script computes (``hook.record_tensor_value``)
cannot be found this way.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Any

from mltrace.launch.callbacks import SessionCallback
from mltrace.launch.session import Session, guarded

FRAMEWORK = "keras"
METHODS = ("fit", "evaluate", "predict")


class KerasAttachment:
    """Adds the session's KerasHook to the callbacks of each fit/evaluate/predict call."""

    def __init__(self, session: Session, keras: Any) -> None:
        self.callback = SessionCallback(session, FRAMEWORK)
        self._inside = threading.local()  # fit runs evaluate for validation: add the hook once
        self._callbacks = guarded(session, FRAMEWORK)(self._with_hook)
        for name in METHODS:
            original = getattr(keras.Model, name)
            setattr(keras.Model, name, self._wrap(original))
        if keras.backend.backend() == "tensorflow":  # GradientTape is TensorFlow's
            import tensorflow as tf

            self._tape = guarded(session, FRAMEWORK)(self._wrap_tape)
            self._optimizer = guarded(session, FRAMEWORK)(self._wrap_optimizer)
            self._tapes: weakref.WeakSet[Any] = weakref.WeakSet()  # the tapes wrapped
            self._open = threading.local()  # how many wrapped tapes this thread is inside
            tape_class = tf.GradientTape
            tape_class.__init__ = self._on_new_tape(tape_class.__init__)
            tape_class.__enter__ = self._on_enter(tape_class.__enter__)
            tape_class.__exit__ = self._on_exit(tape_class.__exit__)
            optimizer_class = keras.optimizers.Optimizer
            optimizer_class.apply_gradients = self._on_apply(optimizer_class.apply_gradients)

    def _wrap(self, original: Any) -> Any:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def method(model: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(self._inside, "active", False):
                return original(model, *args, **kwargs)
            bound = self._callbacks(signature, model, args, kwargs)
            if bound is not None:
                args, kwargs = bound
            self._inside.active = True
            try:
                return original(model, *args, **kwargs)
            finally:
                self._inside.active = False

        return method

    def _with_hook(self, signature: inspect.Signature, model: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The call's arguments with the hook among its callbacks (None: leave them as they are)."""
        import mltrace.tensorflow

        bound = signature.bind(model, *args, **kwargs)
        callbacks = bound.arguments.get("callbacks")
        if callbacks is not None and not isinstance(callbacks, (list, tuple)):
            return None  # a keras CallbackList built by Keras itself
        hook = self.callback.add_to(bound, mltrace.tensorflow.KerasHook)
        if hook is None:
            return None
        if getattr(model, "optimizer", None) is not None and hasattr(model.optimizer, "apply"):
            hook.wrap_optimizer(model.optimizer)
        return bound.args[1:], bound.kwargs

    # -- custom training loops ----------------------------------------------------------------
    def _on_new_tape(self, original: Any) -> Any:
        @functools.wraps(original)
        def __init__(tape: Any, *args: Any, **kwargs: Any) -> None:
            original(tape, *args, **kwargs)
            if not getattr(self._inside, "active", False):
                self._tape(tape)

        return __init__

    def _on_enter(self, original: Any) -> Any:
        @functools.wraps(original)
        def __enter__(tape: Any) -> Any:
            entered = original(tape)
            if tape in self._tapes:
                self._open.depth = getattr(self._open, "depth", 0) + 1
            return entered

        return __enter__

    def _on_exit(self, original: Any) -> Any:
        @functools.wraps(original)
        def __exit__(tape: Any, *exc_info: Any) -> Any:
            if tape in self._tapes:
                self._open.depth = getattr(self._open, "depth", 1) - 1
            return original(tape, *exc_info)

        return __exit__

    def _on_apply(self, original: Any) -> Any:
        @functools.wraps(original)
        def apply_gradients(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if self.callback.hook is not None and not getattr(self._inside, "active", False):
                self._optimizer(optimizer)
            return original(optimizer, *args, **kwargs)

        return apply_gradients

    def _wrap_tape(self, tape: Any) -> None:
        """Wrap a tape of the script's loop with the session's hook (created here, at the
        loop's first tape), unless a wrapped tape is recording (a tape inside a tape)."""
        import mltrace.tensorflow

        hook = self.callback.hook_for(mltrace.tensorflow.KerasHook)
        if hook is None:
            return
        if getattr(self._open, "depth", 0) == 0:
            hook.wrap_tape(tape)
            self._tapes.add(tape)

    def _wrap_optimizer(self, optimizer: Any) -> None:
        if hasattr(optimizer, "apply"):  # a Keras 3 optimizer (wrapping twice does nothing)
            self.callback.hook.wrap_optimizer(optimizer)


def attach(session: Session, keras: Any) -> KerasAttachment:
    """Attach to Keras (called once keras is imported)."""
    return KerasAttachment(session, keras)
