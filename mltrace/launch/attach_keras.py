"""Keras under ``mltrace run``: ``Model.fit``, ``evaluate`` and ``predict`` get the KerasHook.

Keras has no registry of default callbacks, so the three methods of ``keras.Model`` are wrapped
(framework code, never the script's): each call gets the session's one KerasHook appended to its
callbacks, unless the script passed an mltrace KerasHook itself or created a hook of its own.
The hook sets the modes (TRAIN in fit, EVAL in evaluate and validation, PREDICT in predict) and
counts steps across calls, as one hook passed to every call does. The model's optimizer is
wrapped (``hook.wrap_optimizer``) so that gradients are saved.
"""

from __future__ import annotations

import functools
import inspect
import threading
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


def attach(session: Session, keras: Any) -> KerasAttachment:
    """Attach to Keras (called once keras is imported)."""
    return KerasAttachment(session, keras)
