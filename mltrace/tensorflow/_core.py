"""The TensorFlow side of the hook, shared by KerasHook and SessionHook (which hold one).

How values are captured (DESIGN: never silently drop a requested tensor):

* Between steps (Keras callbacks, tape boundaries) the hook reads values eagerly: logs,
  variables (weights, biases, optimizer variables, variables added with ``Collection.add``).
* Inside a step, values that exist only there (gradients, layer inputs/outputs, model
  inputs/labels/predictions, the tape's loss) are taken where TensorFlow hands them over:
  Keras 3's ``optimizer.apply`` (Keras 3 has no ``get_gradients`` to patch, as smdebug did in
  Keras 2), each layer's ``call``, ``GradientTape.gradient``. When that code runs eagerly
  (``run_eagerly=True``, eager tape loops) the values are saved at once. When it is traced into
  a ``tf.function``, the values reach Python through ``tf.py_function(save, values)``: one call
  back into Python per capture point on a step that saves them, with a device-to-host copy that
  saving needs anyway. Where that call goes:

  - Keras' compiled step functions (fit / evaluate / predict): KerasHook has Keras build each of
    them twice, a version with the captures and a plain one, and hands Keras the capturing
    version only for steps that save what it captures. Other steps run exactly the graph they
    would run without mltrace (XLA included: only the capturing version is built without
    ``jit_compile``, since XLA cannot compile ``py_function``). Cost: one more trace per mode.
  - A GradientTape step that begins inside a user's ``tf.function``: the ``py_function`` that
    begins the step returns whether it is due, and captures run under ``tf.cond`` on it.
  - Anything else traced (say a model called in a tf.function inside an eager tape loop):
    ``tf.cond`` on a tf.Variable that the hook sets between steps.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from mltrace.collections import CollectionKeys, CollectionManager, PendingCollections
from mltrace.exceptions import MltraceTypeError
from mltrace.hook import BaseHook, guarded
from mltrace.hook import get_hook as _core_get_hook
from mltrace.modes import ModeKeys
from mltrace.tensorflow import _tensors
from mltrace.tensorflow._tensors import dense, gradient_name, is_keras_variable, variable_name
from mltrace.tensorflow.collection import (
    DEFAULT_COLLECTIONS,
    LAYERS_DEFAULT_REGEX,
    TAPE_REGEXES,
    collection_manager,
)

logger = logging.getLogger(__name__)
_LAYER_IO = re.compile(r"^(?P<layer>[^/]+)/(inputs|outputs)(_\d+)?$")

#: Collections whose members are named by the hook (smdebug tracks them by object and never
#: matches their regexes against other tensors; the biases regex only sorts variables).
BY_NAME_ONLY = frozenset(
    {
        CollectionKeys.WEIGHTS,
        CollectionKeys.BIASES,
        CollectionKeys.GRADIENTS,
        CollectionKeys.OPTIMIZER_VARIABLES,
    }
)


def _in_first_replica() -> bool:
    """False while tracing the step of a replica other than the first under a distribution
    strategy (MirroredStrategy traces the step once per replica, each on its own thread): only
    replica 0 saves in-step values, so a step holds one replica's values, always the same one."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return True
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    return replica is None or int(replica) == 0


class TFHook(BaseHook):
    """BaseHook with TensorFlow conversions, reductions, in-step capture, optimizer and tape
    wrapping. ``owner`` is the KerasHook or SessionHook that holds it (``get_hook`` returns it)."""

    def __init__(
        self,
        owner: Any,
        manager: CollectionManager,
        default_include: list[str],
        default_saved: list[str],
        **kwargs: Any,
    ) -> None:
        super().__init__(
            collection_manager=manager,
            default_include_collections=default_include,
            default_saved_collections=default_saved,
            **kwargs,
        )
        self._owner = weakref.ref(owner)
        self._flag: tf.Variable | None = None
        self._flag_value = False
        # While Keras traces one of its two versions of a step function (see KerasHook): True
        # for the one that captures, False for the plain one; None outside Keras' loops.
        self.tracing_captures: bool | None = None
        self.captured_names: set[str] = set()
        self._trace_preds: weakref.WeakKeyDictionary[Any, tf.Tensor] = weakref.WeakKeyDictionary()
        self._restore: list[tuple[Any, str, bool, Any]] = []
        self._keras_optimizers: list[Any] = []
        self._wrapped_optimizers: set[int] = set()
        self._layer_weights: list[tuple[str, Any]] = []
        self._eager_reads = True
        self._step_ended = False
        self._tape_mode = False

    @property
    def owner(self) -> Any:
        return self._owner()

    # -- conversions (BaseHook's adapter methods) -----------------------------------------------
    def _to_numpy(self, value: Any) -> np.ndarray:
        return _tensors.to_numpy(value)

    def _reduce(self, value: Any, items: list[tuple[str, bool]]) -> list[np.ndarray | None]:
        if _tensors.is_tf_value(value):
            result = _tensors.reduce_on_device(value, items)
            if result is not None:
                return result
        return super()._reduce(value, items)

    def _worker_identity(self) -> tuple[str, int]:
        hvd = _horovod()
        if hvd is not None:
            return f"worker_{hvd.rank()}", hvd.size()
        cluster = _tf_config()
        if cluster is not None:
            task, workers = cluster
            return f"{task['type']}_{task['index']}", workers
        return "worker_0", 1

    def _chief_worker(self) -> str:
        return "chief_0" if _has_chief() else "worker_0"

    # -- collections ----------------------------------------------------------------------------
    def _prepare_collections(self) -> None:
        layers = self.collection_manager.get(CollectionKeys.LAYERS)
        if not layers.include_regex:
            layers.include(LAYERS_DEFAULT_REGEX)
        super()._prepare_collections()

    def _builtin_collection_names(self) -> set[str]:
        return set(DEFAULT_COLLECTIONS)  # filled by the hook, so they may be empty at first

    @staticmethod
    def _member(coll: Any, name: str) -> bool:
        if coll.name in BY_NAME_ONLY:
            return coll.has_tensor_name(name)
        if coll.name == CollectionKeys.LAYERS:
            # Layer inputs/outputs only; smdebug matched this collection's regexes against the
            # layer's name, mltrace also against the tensor's.
            io = _LAYER_IO.match(name)
            return io is not None and (coll.matches(name) or coll.matches(io["layer"]))
        return coll.matches(name)

    def _collections_of(self, name: str) -> tuple[Any, ...]:
        found = self._tensor_collections.get(name)
        if found is None:
            found = tuple(c for c in self._collections_to_save if self._member(c, name))
            for c in found:
                c.add_tensor_name(name)
            self._tensor_collections[name] = found
        return found

    def _register(self, name: str, collection: str) -> None:
        """Put ``name`` into a default collection (smdebug's by-object membership)."""
        coll = self.collection_manager.get(collection)
        if not coll.has_tensor_name(name):
            coll.add_tensor_name(name)
            self._tensor_collections.pop(name, None)

    def _classify_variable(self, var: Any) -> str:
        biases = self.collection_manager.get(CollectionKeys.BIASES)
        return (
            CollectionKeys.BIASES if biases.matches(variable_name(var)) else CollectionKeys.WEIGHTS
        )

    def wanted(self, name: str) -> bool:
        """True if a saved collection holds (or would hold) the tensor ``name``."""
        return self._prepared and (
            name in self._nan_watch or any(self._member(c, name) for c in self._collections_to_save)
        )

    def prepare(self) -> None:
        """Fix the saved collections and open the writer now (Keras: before tracing)."""
        if not self._prepared:
            self._prepare_collections()
            self._open_writer()

    def add_to_collection(self, collection_name: str, variable: Any) -> None:
        """``get_collection(collection_name).add(variable)`` (smdebug's hook method)."""
        self.get_collection(collection_name).add(variable)
        self._tensor_collections.clear()

    # -- steps ----------------------------------------------------------------------------------
    def _begin_step(self) -> None:
        super()._begin_step()
        self._step_ended = False
        self._sync_flag()

    def _end_step(self) -> None:
        if self.step_active and self._eager_reads and tf.executing_eagerly():
            self._read_variables()
        super()._end_step()
        self._step_ended = self.step >= 0

    def _reopen_if_ended(self) -> None:
        # A step whose files are written cannot take more records (they would replace its files):
        # what the user saves after fit()/evaluate() ended goes to a step of its own.
        if self._step_ended and self._prepared:
            self._begin_step()

    def _read_variables(self) -> None:
        """Save the variables due this step: layer weights, optimizer variables, added ones."""
        for name, var in self._layer_weights:
            self._save_for_tensor(name, var)
        if self.mode is ModeKeys.TRAIN:
            for opt in self._keras_optimizers:
                for var in opt.variables:
                    name = variable_name(var)
                    self._register(name, CollectionKeys.OPTIMIZER_VARIABLES)
                    self._save_for_tensor(name, var)
        for coll in list(self.collection_manager.get_collections().values()):
            for name, obj in getattr(coll, "tf_objects", {}).items():
                if (
                    isinstance(obj, tf.Variable) and not getattr(obj, "_in_graph_mode", False)
                ) or is_keras_variable(obj):
                    self._save_for_tensor(name, obj)

    def _sync_flag(self) -> None:
        if (
            self._flag is not None
            and self._flag_value != self.step_active
            and tf.executing_eagerly()
        ):
            self._flag.assign(self.step_active)
            self._flag_value = self.step_active

    def _disable(self, reason: str) -> None:
        super()._disable(reason)
        self._sync_flag()

    # -- in-step capture ------------------------------------------------------------------------
    @guarded()
    def capture(self, pairs: Iterable[tuple[str, Any]]) -> None:
        """Save (name, value) pairs produced inside a step; a value may be a zero-argument callable
        that computes it (run only when the step is due)."""
        self.prepare()
        pairs = [(n, v) for n, v in pairs if v is not None and self.wanted(n)]
        if not pairs:
            return
        if tf.executing_eagerly():
            if self.step_active:
                for name, value in pairs:
                    self._save_for_tensor(name, value() if callable(value) else value)
            return
        names = [n for n, _ in pairs]
        values = [v for _, v in pairs]
        receive = functools.partial(self._receive, names)
        first_replica = _in_first_replica()

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

    def _receive(self, names: list[str], *values: tf.Tensor) -> list[Any]:
        self._save_received(names, values)
        return []

    @guarded()
    def _save_received(self, names: list[str], values: tuple[tf.Tensor, ...]) -> None:
        if self.step_active:
            for name, value in zip(names, values):
                self._save_for_tensor(name, value)

    def _trace_pred(self) -> tf.Tensor | None:
        """The output of the py_function that began the step traced into the current graph."""
        graph = tf.compat.v1.get_default_graph()
        while graph is not None:
            if graph in self._trace_preds:
                return self._trace_preds[graph]
            graph = getattr(graph, "outer_graph", None)
        return None

    def flag(self) -> tf.Variable:
        """The variable that tells traced captures whether the current step is due."""
        if self._flag is None:
            with tf.init_scope():
                self._flag = tf.Variable(self.step_active, trainable=False, name="mltrace_step_due")
            self._flag_value = self.step_active
        return self._flag

    def run_in_graph(self, fn: Callable[..., None], values: list[Any]) -> None:
        """Call ``fn(*eager values)`` each time the traced graph runs (the user's calls of
        save_scalar, save_tensor, record_tensor_value inside a tf.function)."""
        tf.py_function(lambda *v: fn(*v) or [], [dense(v) for v in values], [])

    # -- patching helpers -----------------------------------------------------------------------
    def patch(self, obj: Any, attr: str, replacement: Any) -> None:
        """Set ``obj.attr`` on the instance (never on its class); ``unpatch_all`` restores it."""
        had = attr in vars(obj)
        self._restore.append((obj, attr, had, vars(obj).get(attr)))
        setattr(obj, attr, replacement)

    def unpatch_all(self) -> None:
        """Undo every ``patch``, newest first."""
        self._wrapped_optimizers.clear()
        while self._restore:
            obj, attr, had, old = self._restore.pop()
            try:
                if had:
                    setattr(obj, attr, old)
                else:
                    delattr(obj, attr)
            except (AttributeError, TypeError):  # pragma: no cover - object already gone
                logger.debug("could not restore %s.%s", type(obj).__name__, attr)

    # -- optimizers -----------------------------------------------------------------------------
    def wrap_keras_optimizer(self, optimizer: Any) -> bool:
        """Capture gradients where Keras 3 applies them (``optimizer.apply``); False if done."""
        if id(optimizer) in self._wrapped_optimizers:
            return False
        self._wrapped_optimizers.add(id(optimizer))
        self.read_optimizer_variables(optimizer)
        # LossScaleOptimizer hands its inner optimizer unscaled gradients.
        target = getattr(optimizer, "inner_optimizer", None) or optimizer
        original = target.apply

        @functools.wraps(original)
        def apply(grads: Any, trainable_variables: Any = None) -> Any:
            grads = list(grads)
            if trainable_variables is not None:
                trainable_variables = list(trainable_variables)
            self._capture_gradients(
                grads,
                trainable_variables or list(target._trainable_variables),
                getattr(target, "loss_scale_factor", None),
            )
            pred = None if tf.executing_eagerly() else self._trace_pred()
            if pred is None or not target.built:  # (variables made here must not wait on pred)
                return original(grads, trainable_variables)
            # A step begun inside this tf.function reads the previous step's optimizer variables
            # when it begins: that must happen before this step updates them.
            with tf.control_dependencies([pred]):
                return original(grads, trainable_variables)

        self.patch(target, "apply", apply)
        return True

    def read_optimizer_variables(self, optimizer: Any) -> None:
        """Save ``optimizer.variables`` (collection optimizer_variables) at the end of each step."""
        if not any(optimizer is o for o in self._keras_optimizers):
            self._keras_optimizers.append(optimizer)

    @guarded()
    def _capture_gradients(
        self, grads: list[Any], variables: list[Any], scale: float | None
    ) -> None:
        pairs = []
        for grad, var in zip(grads, variables):
            if grad is None:
                continue
            name = gradient_name(var)
            self._register(name, CollectionKeys.GRADIENTS)
            pairs.append((name, (lambda g=grad: dense(g) / scale) if scale else grad))
        self.capture(pairs)

    # -- GradientTape ---------------------------------------------------------------------------
    def wrap_tape(self, tape: tf.GradientTape) -> tf.GradientTape:
        """Make ``tape`` begin a TRAIN step when entered and save gradients, the weights they are
        taken of (``weights/<var>``) and the loss (``loss``) in ``tape.gradient``.
        Returns ``tape`` itself (wrapped on the instance, never on its class)."""
        if not isinstance(tape, tf.GradientTape):
            raise MltraceTypeError(f"wrap_tape needs a tf.GradientTape, got {type(tape).__name__}")
        if not self._tape_mode:
            for key, regex in TAPE_REGEXES.items():
                self.collection_manager.get(key).include(regex)
            self._tensor_collections.clear()
            self._tape_mode = True
        self.prepare()  # a step traced into a tf.function must know now what it saves
        push, gradient = tape._push_tape, tape.gradient

        @functools.wraps(push)
        def _push_tape(*args: Any, **kwargs: Any) -> Any:
            if not getattr(tape, "_mltrace_started", False):
                tape._mltrace_started = True
                self._tape_step()  # before recording starts: a stop request leaves no tape behind
            return push(*args, **kwargs)

        @functools.wraps(gradient)
        def _gradient(target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
            grads = gradient(target, sources, *args, **kwargs)
            self._after_gradient(target, sources, grads)
            return grads

        tape._push_tape = _push_tape
        tape.gradient = _gradient
        return tape

    @guarded()
    def _tape_step(self) -> None:
        if tf.executing_eagerly():
            self._tape_step_eager()
            if self.stop_requested is not None:
                self.close()  # a rule asked to stop: finish the trial, end the loop here
                raise self._stop_training_error()
            return
        pred = tf.py_function(self._tape_step_runtime, [], tf.bool)
        pred.set_shape([])
        self._trace_preds[tf.compat.v1.get_default_graph()] = pred

    def _tape_step_eager(self) -> None:
        self._end_step()  # in the previous step's mode
        self.mode = ModeKeys.TRAIN  # smdebug: a wrapped tape trains
        self._begin_step()

    def _tape_step_runtime(self) -> tf.Tensor:
        self._run_guarded_tape_step()
        return tf.constant(bool(self.step_active and not self._disabled))

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
                self._register(name, CollectionKeys.GRADIENTS)
                pairs.append((name, grad))
            wname = "weights/" + variable_name(var)
            self._register(wname, self._classify_variable(var))
            pairs.append((wname, lambda v=var: tf.convert_to_tensor(v)))
        if isinstance(target, tf.Tensor):
            self._register("loss", CollectionKeys.LOSSES)
            pairs.append(("loss", target))
        self.capture(pairs)

    # -- user values ----------------------------------------------------------------------------
    @guarded()
    def save_scalar(
        self, name: str, value: Any, sm_metric: bool = False, timestamp: float | None = None
    ) -> None:
        if _symbolic(value):
            self.run_in_graph(lambda v: self.save_scalar(name, v, sm_metric, timestamp), [value])
            return
        self._reopen_if_ended()
        super().save_scalar(name, value, sm_metric, timestamp)

    @guarded()
    def save_tensor(
        self,
        tensor_name: str,
        tensor_value: Any,
        collections_to_write: str | Iterable[str] = "default",
    ) -> None:
        if _symbolic(tensor_value):
            self.run_in_graph(
                lambda v: self.save_tensor(tensor_name, v, collections_to_write), [tensor_value]
            )
            return
        self._reopen_if_ended()
        super().save_tensor(tensor_name, tensor_value, collections_to_write)

    @guarded()
    def record_tensor_value(self, tensor_name: str, tensor_value: Any) -> None:
        """Save a metric computed by the user (seed 003) as ``<tensor_name>`` in ``metrics``."""
        if not isinstance(tensor_name, str) or not tensor_name:
            raise MltraceTypeError(
                f"record_tensor_value: tensor_name must be a non-empty string, got {tensor_name!r}"
            )
        if _symbolic(tensor_value):
            self.run_in_graph(lambda v: self.record_tensor_value(tensor_name, v), [tensor_value])
            return
        self._reopen_if_ended()
        self._register(tensor_name, CollectionKeys.METRICS)
        if self._prepared and self.step >= 0:
            self._save_for_tensor(tensor_name, tensor_value)

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Write the last step, restore every patched object and write the end marker."""
        try:
            super().close()
        finally:
            self.unpatch_all()


def _symbolic(value: Any) -> bool:
    return isinstance(value, tf.Tensor) and tf.is_symbolic_tensor(value)


def _horovod() -> Any:
    import sys

    module = sys.modules.get("horovod.tensorflow")
    try:
        return module if module is not None and module.is_initialized() else None
    except Exception:  # noqa: BLE001 - horovod not usable: single worker
        return None


def _tf_config() -> tuple[dict[str, Any], int] | None:
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "null")
        task, cluster = config["task"], config["cluster"]
        return task, len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    except (ValueError, TypeError, KeyError):
        return None


def _has_chief() -> bool:
    try:
        return "chief" in json.loads(os.environ["TF_CONFIG"])["cluster"]
    except (KeyError, ValueError, TypeError):
        return False


# -- module-level helpers shared by the facades -----------------------------------------------
# Collections made with get_collection(...) before a hook exists land here and are handed to the
# next hook created (seed 000 configures them that way).
_pending = PendingCollections(collection_manager)


def take_pending() -> CollectionManager:
    """The collections configured so far; a fresh manager takes their place."""
    return _pending.take()


def get_hook() -> Any:
    """The TensorFlow hook (KerasHook or SessionHook) created last, or None."""
    hook = _core_get_hook()
    return hook.owner if isinstance(hook, TFHook) else None


def get_collection(name: str, create: bool = True) -> Any:
    """The collection ``name`` of the current hook, or of the hook about to be created."""
    return _pending.of(_core_get_hook(), TFHook, name, create)


def add_to_collection(collection_name: str, args: Any) -> None:
    """``get_collection(collection_name).add(args)`` for variables and graph tensors."""
    get_collection(collection_name).add(args)
