"""XGBoost under ``mltrace run``: ``xgboost.train`` and the scikit-learn estimators get the hook.

The estimators' ``fit`` calls ``train`` through ``xgboost.sklearn``'s module namespace, so
wrapping ``train`` where it is defined and where it is looked up (``xgboost.train``,
``xgboost.training.train``, ``xgboost.sklearn.train``) reaches both APIs. Each training gets the
session's one XGBoost hook as a callback (steps continue across trainings, as with one hook
passed to each), unless the script passed an mltrace hook itself or created its own.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

from mltrace.launch.callbacks import SessionCallback
from mltrace.launch.session import Session, guarded

FRAMEWORK = "xgboost"
NAMESPACES = ("xgboost", "xgboost.training", "xgboost.sklearn")


class XGBoostAttachment:
    """Adds the session's XGBoost hook to the callbacks of each training."""

    def __init__(self, session: Session, xgboost: Any) -> None:
        self.callback = SessionCallback(session, FRAMEWORK)
        original = xgboost.training.train
        self._signature = inspect.signature(original)
        self._callbacks = guarded(session, FRAMEWORK)(self._with_hook)
        wrapped = self._wrap(original)
        for name in NAMESPACES:
            namespace: Any = importlib.import_module(name)
            if getattr(namespace, "train", None) is original:
                namespace.train = wrapped

    def _wrap(self, original: Any) -> Any:
        @functools.wraps(original)
        def train(*args: Any, **kwargs: Any) -> Any:
            bound = self._callbacks(args, kwargs)
            if bound is not None:
                args, kwargs = bound
            return original(*args, **kwargs)

        return train

    def _with_hook(self, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        import mltrace.xgboost
        from mltrace.xgboost.collection import DEFAULT_SAVE_INTERVAL

        bound = self._signature.bind(*args, **kwargs)
        save_defaults = {"save_interval": DEFAULT_SAVE_INTERVAL}
        if self.callback.add_to(bound, mltrace.xgboost.Hook, save_defaults) is None:
            return None
        return bound.args, bound.kwargs


def attach(session: Session, xgboost: Any) -> XGBoostAttachment:
    """Attach to XGBoost (called once xgboost is imported)."""
    return XGBoostAttachment(session, xgboost)
