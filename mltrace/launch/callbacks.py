"""The session's one hook for a framework whose training calls take a ``callbacks`` list (Keras's
``fit``/``evaluate``/``predict``, ``xgboost.train``): created at the first call that trains and
appended to that call's callbacks and every later one's, so that steps go on across calls as
with one hook passed to each.

A call keeps its arguments when it already holds an mltrace hook of that framework (the script
passes its own) or when the session makes none (the script created a hook of its own).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from mltrace.launch.session import Session


class SessionCallback:
    """Adds the session's hook of one framework to the ``callbacks`` argument of calls.

    Args:
        session: the process's session, which creates the hook from the run's configuration.
        framework: the attachment's name (``"keras"``, ``"xgboost"``), for its log lines.
        argument: the calls' argument that takes the hook (``tf.compat.v1``'s monitored
            sessions take ``hooks``).
    """

    def __init__(self, session: Session, framework: str, argument: str = "callbacks") -> None:
        self.session = session
        self.framework = framework
        self.argument = argument
        self.hook: Any = None

    def hook_for(self, hook_class: type, save_defaults: Mapping[str, Any] | None = None) -> Any | None:
        """The session's hook of this framework, created of ``hook_class`` at the first call
        (also by training that takes no callbacks: a GradientTape loop, an optimizer built into a
        graph); None where the session makes none (the script has its own hook)."""
        if self.hook is None:
            self.hook = self.session.create_hook(hook_class, self.framework, save_defaults)
        return self.hook

    def add_to(self, bound: inspect.BoundArguments, hook_class: type,
               save_defaults: Mapping[str, Any] | None = None) -> Any | None:
        """Append the hook to ``bound``'s callbacks, in place; returns it, or None where the call
        keeps its arguments. The hook is created at the first call, of ``hook_class`` (passed
        per call: the framework's mltrace module is imported only once the script trains), with
        the framework's own ``save_defaults`` (XGBoost: every 10 rounds)."""
        callbacks = list(bound.arguments.get(self.argument) or ())
        if any(isinstance(c, hook_class) for c in callbacks):
            return None  # the script passes its own hook
        hook = self.hook_for(hook_class, save_defaults)
        if hook is None:
            return None
        bound.arguments[self.argument] = [*callbacks, hook]
        return hook
