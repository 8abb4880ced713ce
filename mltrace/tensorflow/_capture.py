"""In-step capture: saving values that exist only inside a training step.

Gradients, layer inputs/outputs and the tape's loss are handed to :meth:`InStepCapture.capture`
where TensorFlow produces them. Run eagerly, they are saved at once; traced into a
``tf.function``, they reach Python through a ``tf.py_function``, run only on steps that save
them (the overview in mltrace.tensorflow._core says how each kind of step decides). This module
also holds what every capture point needs: collection membership of the names it saves, the
flag variable that tells traced graphs whether the step is due, and the patch record.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import tensorflow as tf

from mltrace.capture.adapter import Adapter
from mltrace.capture.errors import guarded
from mltrace.capture.hook import Hook
from mltrace.collections import CollectionKeys
from mltrace.tensorflow._distribution import in_first_replica
from mltrace.tensorflow._patching import Patching
from mltrace.tensorflow._tensors import dense, variable_name


def is_symbolic(value: Any) -> bool:
    """True for a graph tensor: it has a value only while its graph runs."""
    return isinstance(value, tf.Tensor) and tf.is_symbolic_tensor(value)


class InStepCapture(Patching, Adapter):
    """Saving (name, value) pairs from inside a step, eagerly or from a traced graph; the base
    that the TensorFlow adapter's variable, gradient and tape capture build on."""

    hook: Hook  # set by attach(), which the hook calls as it is built

    def __init__(self) -> None:
        super().__init__()
        self._flag: tf.Variable | None = None
        self._flag_value = False
        # While Keras traces one of its two versions of a step function (see KerasAdapter): True
        # for the one that captures, False for the plain one; None outside Keras' loops.
        self.tracing_captures: bool | None = None
        #: Names of the in-step values that the traced capture points can save.
        self.captured_names: set[str] = set()
        self._trace_preds: weakref.WeakKeyDictionary[Any, tf.Tensor] = weakref.WeakKeyDictionary()

    # -- collections ----------------------------------------------------------------------------
    def register(self, name: str, collection: str) -> None:
        """Put ``name`` into a default collection (smdebug's by-object membership)."""
        coll = self.hook.collection_manager.get(collection)
        if not coll.has_tensor_name(name):
            coll.add_tensor_name(name)
            self.hook.plan.forget(name)

    def classify_variable(self, var: Any) -> str:
        """``biases`` if the variable's name matches that collection's regex, else ``weights``."""
        biases = self.hook.collection_manager.get(CollectionKeys.BIASES)
        return (
            CollectionKeys.BIASES if biases.matches(variable_name(var)) else CollectionKeys.WEIGHTS
        )

    def wanted(self, name: str) -> bool:
        """True if a saved collection holds (or would hold) the tensor ``name``."""
        plan = self.hook.plan
        return plan.prepared and plan.may_save(name)

    # -- whether the step is due ----------------------------------------------------------------
    @guarded()
    def reopen_if_ended(self) -> None:
        """Begin a new step if the current one's files are written: they cannot take more records
        (they would replace its files), so what the user saves after fit()/evaluate() ended goes
        to a step of its own, begun at once (smdebug's TensorFlow behaviour)."""
        if self.hook.step_written and self.hook.prepared:
            self.hook.begin_step()

    def sync_flag(self) -> None:
        """Set the flag variable to ``hook.step_active`` (only when it changes, only eagerly)."""
        active = self.hook.step_active
        if self._flag is not None and self._flag_value != active and tf.executing_eagerly():
            self._flag.assign(active)
            self._flag_value = active

    def flag(self) -> tf.Variable:
        """The variable that tells traced captures whether the current step is due."""
        if self._flag is None:
            with tf.init_scope():
                active = self.hook.step_active
                self._flag = tf.Variable(active, trainable=False, name="mltrace_step_due")
            self._flag_value = active
        return self._flag

    # -- in-step capture ------------------------------------------------------------------------
    @guarded()
    def capture(self, pairs: Iterable[tuple[str, Any]]) -> None:
        """Save (name, value) pairs produced inside a step; a value may be a zero-argument callable
        that computes it (run only when the step is due)."""
        hook = self.hook
        hook.prepare()
        pairs = [(n, v) for n, v in pairs if v is not None and self.wanted(n)]
        if not pairs:
            return
        if tf.executing_eagerly():
            if hook.step_active:
                for name, value in pairs:
                    hook.save_for_tensor(name, value() if callable(value) else value)
            return
        names = [n for n, _ in pairs]
        values = [v for _, v in pairs]
        receive = functools.partial(self.receive, names)
        first_replica = in_first_replica()

        def save() -> None:
            if first_replica:
                tf.py_function(receive, [dense(v() if callable(v) else v) for v in values], [])

        pred = self._trace_pred()
        if pred is None and self.tracing_captures is not None:
            # Keras runs this version of its step function only on steps that save these.
            self.captured_names.update(names)
            if self.tracing_captures:
                save()
            return
        tf.cond(self.flag() if pred is None else pred, save, lambda: None)

    def receive(self, names: list[str], *values: tf.Tensor) -> list[Any]:
        """The ``tf.py_function`` that traced capture points call: save ``values`` as ``names``."""
        self._save_received(names, values)
        return []

    @guarded()
    def _save_received(self, names: list[str], values: tuple[tf.Tensor, ...]) -> None:
        if self.hook.step_active:
            for name, value in zip(names, values):
                self.hook.save_for_tensor(name, value)

    def _trace_pred(self) -> tf.Tensor | None:
        """The output of the py_function that began the step traced into the current graph."""
        graph = tf.compat.v1.get_default_graph()
        while graph is not None:
            if graph in self._trace_preds:
                return self._trace_preds[graph]
            graph = getattr(graph, "outer_graph", None)
        return None

    # -- the user's values inside a tf.function -------------------------------------------------
    def defer_symbolic(self, save: Callable[[Any], None], value: Any) -> bool:
        """A symbolic tensor (the user's save_scalar / save_tensor inside a tf.function) is saved
        each time the graph runs, by a ``tf.py_function``; at that time a step whose files were
        written is followed by a new one first (see :meth:`reopen_if_ended`)."""
        if not is_symbolic(value):
            return False

        def at_run(array: Any) -> None:
            self.reopen_if_ended()
            save(array)

        self.run_in_graph(at_run, [value])
        return True

    def run_in_graph(self, fn: Callable[..., None], values: list[Any]) -> None:
        """Call ``fn(*eager values)`` each time the traced graph runs (the user's calls of
        save_scalar, save_tensor, record_tensor_value inside a tf.function)."""
        def call(*arrays: Any) -> list[Any]:
            fn(*arrays)
            return []

        tf.py_function(call, [dense(v) for v in values], [])
