"""Graph-mode TensorFlow (``tf.compat.v1``) under ``mltrace run``: monitored sessions get the
SessionHook, and ``tf.compat.v1.train`` optimizers are wrapped.

What a script would write, the attachment does:
- ``hook.wrap_optimizer(optimizer)``: each ``tf.compat.v1.train.Optimizer`` is wrapped when it
  first applies gradients (``minimize`` does), before they are applied, so that the hook knows
  the gradient tensors. The hook is created then, from the run's configuration: it must exist
  before the session starts, when it looks up the graph's tensors.
- ``MonitoredSession(hooks=[hook])`` (also what ``MonitoredTrainingSession`` builds, and
  ``SingularMonitoredSession``): the hook is added to the session's hooks.
- ``hook.set_mode(...)``: a run that fetches an operation a wrapped optimizer returned (the
  training op) is a TRAIN step, any other run an EVAL step (``sess.run(loss)`` after training).

A script that passes an mltrace hook to its session, or created a hook of its own, keeps it.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any

from mltrace.launch.callbacks import SessionCallback
from mltrace.launch.session import Session, guarded

FRAMEWORK = "tensorflow"
SESSIONS = ("MonitoredSession", "SingularMonitoredSession")


class SessionAttachment:
    """Wraps ``tf.compat.v1.train``'s optimizers and monitored sessions (see module docstring)."""

    def __init__(self, session: Session, tf: Any) -> None:
        self.callback = SessionCallback(session, FRAMEWORK, argument="hooks")
        self._train_ops: list[Any] = []  # what wrapped optimizers built (compared by identity:
        # graph tensors may be unhashable)
        self._wrapped: weakref.WeakSet[Any] = weakref.WeakSet()
        self._optimizer = guarded(session, FRAMEWORK)(self._wrap_optimizer)
        self._hooks = guarded(session, FRAMEWORK)(self._with_hook)
        self.mode_of_run = guarded(session, FRAMEWORK)(self.mode_of)  # None after an error
        train = tf.compat.v1.train
        train.Optimizer.apply_gradients = self._on_apply(train.Optimizer.apply_gradients)
        for name in SESSIONS:
            cls = getattr(train, name)
            cls.__init__ = self._on_session(cls.__init__)
        self._tf = tf

    # -- optimizers -----------------------------------------------------------------------------
    def _on_apply(self, original: Any) -> Any:
        @functools.wraps(original)
        def apply_gradients(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if optimizer not in self._wrapped and self._optimizer(optimizer):
                # the hook wrapped the instance's apply_gradients, which ends up here again
                return optimizer.apply_gradients(*args, **kwargs)
            op = original(optimizer, *args, **kwargs)
            if optimizer in self._wrapped:
                self._train_ops.append(op)
            return op

        return apply_gradients

    def _wrap_optimizer(self, optimizer: Any) -> bool:
        """Wrap ``optimizer`` with the session's hook (created here); True if it was wrapped."""
        hook = self.callback.hook_for(self.hook_class)
        if hook is None:
            return False
        self._wrapped.add(optimizer)
        hook.wrap_optimizer(optimizer)
        return True

    @functools.cached_property
    def hook_class(self) -> type:
        """The session's SessionHook class (made at the first hook: it imports mltrace.tensorflow)."""
        return _hook_class(self)

    # -- sessions -------------------------------------------------------------------------------
    def _on_session(self, original: Any) -> Any:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def __init__(monitored: Any, *args: Any, **kwargs: Any) -> None:
            bound = self._hooks(signature, monitored, args, kwargs)
            if bound is not None:
                args, kwargs = bound
            original(monitored, *args, **kwargs)

        return __init__

    def _with_hook(self, signature: inspect.Signature, monitored: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The session's arguments with the SessionHook added to its hooks (None: leave them as
        they are: the script passes or made a hook of its own)."""
        import mltrace.tensorflow

        bound = signature.bind(monitored, *args, **kwargs)
        if self.callback.hook_for(self.hook_class) is None:
            return None
        if self.callback.add_to(bound, mltrace.tensorflow.SessionHook) is None:
            return None
        return bound.args[1:], bound.kwargs

    def mode_of(self, fetches: Any) -> Any:
        """TRAIN for a run that fetches a training op of a wrapped optimizer, else EVAL."""
        from mltrace.modes import ModeKeys

        for fetched in self._tf.nest.flatten(fetches):
            op = getattr(fetched, "op", fetched)  # a tensor's op, or the operation itself
            if any(op is train_op for train_op in self._train_ops):
                return ModeKeys.TRAIN
        return ModeKeys.EVAL


def _hook_class(attachment: SessionAttachment) -> type:
    """The SessionHook that sets its mode from each run's fetches before the run's step."""
    import mltrace.tensorflow

    class RunSessionHook(mltrace.tensorflow.SessionHook):
        def before_run(self, run_context: Any) -> Any:
            mode = attachment.mode_of_run(run_context.original_args.fetches)
            if mode is not None:
                self.set_mode(mode)
            return super().before_run(run_context)

    return RunSessionHook


def attach(session: Session, tf: Any) -> SessionAttachment:
    """Attach to TensorFlow's graph-mode training (called once tensorflow is imported)."""
    return SessionAttachment(session, tf)
