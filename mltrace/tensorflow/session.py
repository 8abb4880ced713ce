"""SessionHook: a ``tf.compat.v1.train.SessionRunHook`` for graph-mode training
(``MonitoredTrainingSession(hooks=[hook])``). The hook is the front door; the saving logic is a
framework-neutral mltrace.capture.hook.Hook (``hook.core``) with a SessionAdapter (``hook.adapter``).

TensorFlow 2.21 still ships ``tf.compat.v1.train.SessionRunHook`` and ``MonitoredTrainingSession``;
``tf.estimator`` is gone, so ``EstimatorHook`` (smdebug's alias of SessionHook) remains only so
that smdebug scripts import: use SessionHook with a MonitoredTrainingSession.

Names are TF graph names (``dense/kernel:0``, ``mean_squared_error/value:0``), as smdebug's
SessionHook wrote them. One ``session.run`` is one step. Variables (weights, biases, optimizer
variables, variables added with ``Collection.add``) are read just before the step's run, so they
hold the values the step starts from; other tensors (losses, gradients from a wrapped
optimizer, regex matches) are fetched with the run itself, if everything they depend on is fed.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from mltrace.capture.errors import guarded
from mltrace.collections import CollectionKeys
from mltrace.exceptions import MltraceTypeError
from mltrace.tensorflow._api import TFHookAPI
from mltrace.tensorflow._core import BY_NAME_ONLY, TFAdapter
from mltrace.tensorflow.collection import DEFAULT_COLLECTIONS, TORNASOLE_INCLUDE_COLLECTIONS

_SKIP_DTYPES = (tf.resource, tf.variant, tf.string)
_PLACEHOLDERS = ("Placeholder", "PlaceholderV2")


class SessionAdapter(TFAdapter):
    """TFAdapter plus the graph: which tensors to fetch at each run."""

    eager_reads = False  # variables are read in the session, before each run

    def __init__(self, owner: TFHookAPI | None = None) -> None:
        super().__init__(owner)
        self._graph: tf.Graph | None = None
        self._variables: dict[str, Any] = {}
        self._tensors: dict[str, tf.Tensor] = {}
        self._v1_optimizers: list[Any] = []
        self._v1_gradients: dict[str, tf.Tensor] = {}
        self._placeholder_deps: dict[str, frozenset[str]] = {}

    def wrap_v1_optimizer(self, optimizer: Any) -> None:
        """Record the gradients the optimizer applies (its ``apply_gradients``, on the instance)."""
        original = optimizer.apply_gradients

        def apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            grads_and_vars = list(grads_and_vars)
            for grad, _ in grads_and_vars:
                if isinstance(grad, tf.Tensor):
                    self._v1_gradients[grad.name] = grad
            return original(grads_and_vars, *args, **kwargs)

        self.patch(optimizer, "apply_gradients", apply_gradients)
        self._v1_optimizers.append(optimizer)

    def on_prepare(self) -> None:
        """As smdebug's SessionHook, ``gradients`` holds the gradients a wrapped optimizer
        applies, by name: its default regex (``^gradient``, for Keras and tape names) would also
        take every backprop tensor of the graph's ``gradients/`` scope, in the collections file
        that readers match names against (with save_all, dozens on a one-layer model)."""
        super().on_prepare()
        grads = self.hook.collection_manager.get(CollectionKeys.GRADIENTS)
        if grads.include_regex == DEFAULT_COLLECTIONS[CollectionKeys.GRADIENTS]:
            grads.include_regex = []

    @guarded()
    def begin(self) -> None:
        """Find the tensors of the default graph that the saved collections hold."""
        graph = tf.compat.v1.get_default_graph()
        self.hook.prepare()
        self._graph, self._variables, self._tensors = graph, {}, {}
        self._placeholder_deps.clear()
        for var in tf.compat.v1.trainable_variables():
            self._add_variable(var.name, var, self.classify_variable(var))
        for opt in self._v1_optimizers:
            for var in opt.variables():
                self._add_variable(var.name, var, CollectionKeys.OPTIMIZER_VARIABLES)
        for loss in tf.compat.v1.losses.get_losses():
            self._add_tensor(loss, CollectionKeys.LOSSES)
        for grad in self._v1_gradients.values():
            if grad.graph is graph:
                self._add_tensor(grad, CollectionKeys.GRADIENTS)
        for coll in self.hook.collection_manager.get_collections().values():
            for name, obj in getattr(coll, "tf_objects", {}).items():
                if getattr(obj, "graph", None) is graph:
                    (self._variables if isinstance(obj, tf.Variable) else self._tensors)[name] = obj
        self._find_regex_matches(graph)
        self.hook.plan.forget()

    def _find_regex_matches(self, graph: tf.Graph) -> None:
        """Fetch the graph's tensors that a saved (or recorded) collection's regexes match."""
        regex_colls = [c for c in self.hook.plan.watched if c.name not in BY_NAME_ONLY]
        for op in graph.get_operations():
            # Tensors inside tf.compat.v1 while loops and conds cannot be fetched; only the op's
            # private control flow context tells (graph.is_fetchable accepts them).
            if not graph.is_fetchable(op) or op._control_flow_context is not None:
                continue
            for tensor in op.outputs:
                if tensor.dtype.base_dtype in _SKIP_DTYPES or tensor.name in self._variables:
                    continue
                if any(c.matches(tensor.name) for c in regex_colls):
                    self._tensors.setdefault(tensor.name, tensor)

    def _add_variable(self, name: str, var: Any, collection: str) -> None:
        self.register(name, collection)
        self._variables[name] = var

    def _add_tensor(self, tensor: tf.Tensor, collection: str) -> None:
        self.register(tensor.name, collection)
        self._tensors[tensor.name] = tensor

    def _is_due(self, name: str) -> bool:
        """True if ``name`` is saved this step, watched for NaN or kept by the flight recorder."""
        plan = self.hook.plan
        colls = plan.collections_of(name)
        return bool(colls) and (bool(plan.nan_watch) or bool(plan.due_for(colls))
                                or self.recording(colls))

    @guarded()
    def before_run(self, run_context: Any) -> Any:
        """Begin a step: read the due variables, and ask the run for the due tensors."""
        hook = self.hook
        hook.begin_step()
        if hook.stop_requested is not None:
            # A rule's StopTraining action: MonitoredSession stops after this run.
            run_context.request_stop()
        if not hook.step_active or self._graph is None:
            return None
        variables = {n: v for n, v in self._variables.items() if self._is_due(n)}
        if variables:  # read before the step changes them
            for name, value in run_context.session.run(variables).items():
                hook.save_for_tensor(name, value)
        fed = _fed_ops(run_context.original_args.feed_dict)
        fetches = {
            n: t
            for n, t in self._tensors.items()
            if self._is_due(n) and self._placeholders_of(t) <= fed
        }
        return tf.compat.v1.train.SessionRunArgs(fetches) if fetches else None

    @guarded()
    def after_run(self, run_values: Any) -> None:
        """Save what the run fetched. The step's files are written when the next run begins
        (or at end/close), so that what the user saves between runs still goes into this step."""
        results = run_values.results
        if isinstance(results, dict):
            for name, value in results.items():
                self.hook.save_for_tensor(name, value)

    @guarded()
    def session_end(self) -> None:
        """The session ends: write its last step and wait until its files are stored (the trial
        is readable right after the session closes; close() also marks it finished)."""
        self.hook.flush()

    def _placeholders_of(self, tensor: tf.Tensor) -> frozenset[str]:
        """Names of the placeholder ops ``tensor`` depends on (it can be fetched only if fed)."""
        start = tensor.op
        if start.name in self._placeholder_deps:
            return self._placeholder_deps[start.name]
        found: set[str] = set()
        stack, seen = [start], {start.name}
        while stack:
            op = stack.pop()
            if op.type in _PLACEHOLDERS:
                found.add(op.name)
            for inp in op.inputs:
                if inp.op.name not in seen:
                    seen.add(inp.op.name)
                    stack.append(inp.op)
        result = frozenset(found)
        self._placeholder_deps[start.name] = result
        return result


def _fed_ops(feed_dict: Any) -> frozenset[str]:
    """Names of the ops whose outputs ``feed_dict`` feeds."""
    names = set()
    for key in feed_dict or {}:
        name = key if isinstance(key, str) else getattr(key, "name", "")
        names.add(name.split(":")[0])
    return frozenset(names)


class SessionHook(TFHookAPI, tf.compat.v1.train.SessionRunHook):
    """Saves a graph-mode (tf.compat.v1) training job's tensors; pass it in
    ``MonitoredTrainingSession(hooks=[hook])``. Set modes with ``hook.set_mode``.

    Args: smdebug's (see TFHookAPI; each is described in mltrace.capture.options.HookOptions).
    A rule's StopTraining action makes the hook call ``run_context.request_stop()``.

    Example:
        >>> hook = SessionHook(out_dir="/tmp/run", include_collections=["weights", "gradients"])
        >>> opt = hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        >>> train_op = opt.minimize(loss)
        >>> with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess: ...
    """

    _adapter_class = SessionAdapter
    adapter: SessionAdapter

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Save the gradients (and optimizer variables) of a ``tf.compat.v1.train.Optimizer``;
        returns ``optimizer`` itself. Call it before ``minimize``/``apply_gradients``."""
        if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
            raise MltraceTypeError(
                f"SessionHook.wrap_optimizer needs a tf.compat.v1.train.Optimizer, got "
                f"{type(optimizer).__name__} (Keras optimizers go with KerasHook)"
            )
        self.adapter.wrap_v1_optimizer(optimizer)
        return optimizer

    # -- SessionRunHook ---------------------------------------------------------------------
    def begin(self) -> None:
        self.adapter.begin()

    def before_run(self, run_context: Any) -> Any:
        return self.adapter.before_run(run_context)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.adapter.after_run(run_values)

    def end(self, session: Any) -> None:
        self.adapter.session_end()


EstimatorHook = SessionHook  # smdebug's name; tf.estimator itself is gone from TensorFlow 2.21


class TornasoleHook(SessionHook):
    """Tornasole's TensorFlow hook was a SessionRunHook: this is SessionHook saving
    weights, biases and gradients when no collection is named."""

    _default_include = tuple(TORNASOLE_INCLUDE_COLLECTIONS)
