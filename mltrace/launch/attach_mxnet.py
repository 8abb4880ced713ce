"""MXNet Gluon under ``mltrace run``: the outermost Block called in training is registered.

Gluon has no global block hooks, so ``gluon.Block.__call__`` (framework code) is wrapped to
know which call is the outermost one. A loss block (``gluon.loss.Loss``) called at the top level
is registered as a loss; any other block called at the top level while autograd records in
training mode is a model and is registered (the first one drives the step). Each top-level call
of the first model sets the mode: TRAIN inside ``autograd.record()`` in training mode, else EVAL.
Blocks are registered before their call runs, so their own hooks see that first call.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from mltrace.launch.session import Session, guarded
from mltrace.modes import ModeKeys

FRAMEWORK = "mxnet"


class MXNetAttachment:
    """Registers the script's outermost blocks and losses with a hook of the session."""

    def __init__(self, session: Session, mxnet: Any) -> None:
        from mxnet import autograd, gluon

        self.session = session
        self.autograd = autograd
        self.loss_class = gluon.loss.Loss
        self.hook: Any = None
        self.blocks: list[Any] = []
        self.driver: Any = None
        self._depth = threading.local()
        self._on_top_level = guarded(session, FRAMEWORK)(self._top_level)
        gluon.Block.__call__ = self._wrap(gluon.Block.__call__)

    def _wrap(self, original: Any) -> Any:
        @functools.wraps(original)
        def call(block: Any, *args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "value", 0)
            if depth == 0:
                self._on_top_level(block)
            self._depth.value = depth + 1
            try:
                return original(block, *args, **kwargs)
            finally:
                self._depth.value = depth

        return call

    def _top_level(self, block: Any) -> None:
        training = self.autograd.is_training()
        if block is self.driver:
            mode = ModeKeys.TRAIN if training else ModeKeys.EVAL
            if mode is not self.hook.mode:
                self.hook.set_mode(mode)
            return
        if any(block is b for b in self.blocks):
            return
        is_loss = isinstance(block, self.loss_class)
        if not (is_loss or training) or not self._ensure_hook():
            return
        self.hook.register_block(block)
        self.blocks.append(block)
        if not is_loss and self.driver is None:
            self.driver = block
            self.hook.set_mode(ModeKeys.TRAIN)

    def _ensure_hook(self) -> bool:
        if self.hook is None:
            import mltrace.mxnet

            self.hook = self.session.create_hook(mltrace.mxnet.Hook, FRAMEWORK)
        return self.hook is not None


def attach(session: Session, mxnet: Any) -> MXNetAttachment:
    """Attach to MXNet Gluon (called once mxnet is imported)."""
    return MXNetAttachment(session, mxnet)
