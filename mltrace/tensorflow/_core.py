"""The TensorFlow side of the capture (:class:`TFAdapter`), shared by KerasHook and SessionHook.

The front doors (mltrace.tensorflow.keras.KerasHook, mltrace.tensorflow.session.SessionHook) each
hold a framework-neutral :class:`mltrace.capture.hook.Hook` (``hook.core``) built with a subclass of
:class:`TFAdapter` (``hook.adapter``); the adapter implements the capture core's protocol
(mltrace.capture.adapter) and installs TensorFlow's callbacks itself.

How values are captured (a requested tensor is never dropped silently):

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

Capture points are methods patched on the user's instances (never on their classes), recorded
by :meth:`TFAdapter.patch` and restored when the hook closes; names and per-object state are
kept here, never written onto the user's objects.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import tensorflow as tf

from mltrace.capture.adapter import Adapter, ReductionItems
from mltrace.capture.errors import guarded
from mltrace.capture.hook import Hook, hook_of_class
from mltrace.capture.hook import get_hook as _core_get_hook
from mltrace.collections import Collection as _CoreCollection
from mltrace.collections import CollectionKeys, CollectionManager, PendingCollections
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.tensorflow import _tensors
from mltrace.tensorflow._tensors import dense, gradient_name, is_keras_variable, variable_name
from mltrace.tensorflow.collection import (
    DEFAULT_COLLECTIONS,
    LAYERS_DEFAULT_REGEX,
    TAPE_REGEXES,
    Collection,
    collection_manager,
)

if TYPE_CHECKING:
    from mltrace.tensorflow._api import TFHookAPI

logger = logging.getLogger(__name__)
_LAYER_IO = re.compile(r"^(?P<layer>[^/]+)/(inputs|outputs)(_\d+)?$")
_MODEL_IO = re.compile(r"^(inputs|labels|predictions)(_\d+)?$")

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

#: A patched attribute: (attribute name, whether the instance had its own, its old value).
_Patch = tuple[str, bool, Any]


def _in_first_replica() -> bool:
    """False while tracing the step of a replica other than the first under a distribution
    strategy (MirroredStrategy traces the step once per replica, each on its own thread): only
    replica 0 saves in-step values, so a step holds one replica's values, always the same one."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return True
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    return replica is None or int(replica) == 0


class TFAdapter(Adapter):
    """TensorFlow conversions and reductions, worker identity (Horovod, TF_CONFIG), smdebug's
    TensorFlow collection membership, in-step capture, optimizer and GradientTape wrapping.

    Built before its hook, which attaches it (its error policy then guards the callbacks
    below). Subclasses: KerasAdapter (Keras models), SessionAdapter (tf.compat.v1
    graphs).
    """

    #: Filled by the hook as it sees the model, so they may be empty when training starts.
    builtin_collections = frozenset(DEFAULT_COLLECTIONS)
    #: Read variables eagerly at the end of each due step (SessionAdapter reads them in the run).
    eager_reads = True
    hook: Hook  # set by attach(), which the hook calls as it is built

    def __init__(self, owner: TFHookAPI | None = None) -> None:
        super().__init__()
        self._owner: Callable[[], TFHookAPI | None] = (
            (lambda: None) if owner is None else weakref.ref(owner)
        )
        self._flag: tf.Variable | None = None
        self._flag_value = False
        # While Keras traces one of its two versions of a step function (see KerasAdapter): True
        # for the one that captures, False for the plain one; None outside Keras' loops.
        self.tracing_captures: bool | None = None
        #: Names of the in-step values that the traced capture points can save.
        self.captured_names: set[str] = set()
        self._trace_preds: weakref.WeakKeyDictionary[Any, tf.Tensor] = weakref.WeakKeyDictionary()
        self._restore: list[tuple[Any, str, bool, Any]] = []
        # Per-step objects (tapes) are patched weakly: a long loop must not keep every tape alive.
        self._weak_restore: weakref.WeakKeyDictionary[Any, list[_Patch]] = (
            weakref.WeakKeyDictionary()
        )
        self._started_tapes: weakref.WeakSet[tf.GradientTape] = weakref.WeakSet()
        self.keras_optimizers: list[Any] = []
        self.wrapped_optimizers: set[int] = set()
        #: (name, variable) of the layer weights read after each due step (Keras loops).
        self.layer_weights: list[tuple[str, Any]] = []
        self._tape_mode = False

    @property
    def owner(self) -> TFHookAPI | None:
        """The KerasHook or SessionHook holding this adapter (``get_hook`` returns it), given
        when the adapter is built; None once it is gone."""
        return self._owner()

    # -- Adapter protocol: identity and values ----------------------------------------------------
    def worker_identity(self) -> tuple[str, int]:
        """``worker_<rank>`` under Horovod (if the job initialized it), else TF_CONFIG's task
        (``<type>_<index>``, counting workers and the chief), else ``worker_0`` alone."""
        hvd = _horovod()
        if hvd is not None:
            return f"worker_{hvd.rank()}", hvd.size()
        cluster = _tf_config()
        if cluster is not None:
            task, workers = cluster
            return f"{task['type']}_{task['index']}", workers
        return "worker_0", 1

    def chief_worker(self) -> str:
        """TF_CONFIG's chief if the cluster has one, else ``worker_0`` (as smdebug)."""
        return "chief_0" if _has_chief() else "worker_0"

    def to_numpy(self, value: Any) -> np.ndarray:
        """A host copy of a tensor or variable (see mltrace.tensorflow._tensors.to_numpy)."""
        return _tensors.to_numpy(value)

    def reduce(self, value: Any, items: ReductionItems) -> list[np.ndarray | None]:
        """Reductions with TF ops where the value lives (numpy for complex and string tensors)."""
        if _tensors.is_tf_value(value):
            result = _tensors.reduce_on_device(value, items)
            if result is not None:
                return result
        return super().reduce(value, items)

    # -- Adapter protocol: the flight recorder (mltrace.capture.flight_recorder) -----------------
    def reduce_on_device(self, value: Any, items: ReductionItems) -> Any:
        """The reductions as one float64 vector left where the value lives (a _Started), or the
        results at once where numpy computes them (host values, complex and string tensors)."""
        if _tensors.is_tf_value(value):
            started = _tensors.start_reductions(value, items)
            if isinstance(started, tf.Tensor):
                return _Started(items, started)
            if started is not None:
                return started
        return super().reduce(value, items)

    def reductions_to_host(self, started: list[Any]) -> list[list[np.ndarray | None]]:
        """A step's reductions left on devices, concatenated and copied to the host together:
        one copy per device (one per step on one device)."""
        pending = [s for s in started if isinstance(s, _Started)]
        host: dict[int, np.ndarray] = {}
        for device in {s.values.device for s in pending}:
            here = [s for s in pending if s.values.device == device]
            values = tf.concat([s.values for s in here], axis=0).numpy()
            offsets = np.cumsum([0] + [len(s.items) for s in here])
            host.update({id(s): values[a:b] for s, a, b in zip(here, offsets, offsets[1:])})
        return [_tensors.host_results(s.items, host[id(s)]) if isinstance(s, _Started) else s
                for s in started]

    def reductions_to_flat(self, started: list[Any]) -> np.ndarray:
        """The flight recorder's step: its reductions all on one device are concatenated there
        and copied once, already flat (counts stay float64: the recorder casts them)."""
        if started and all(isinstance(s, _Started) for s in started):
            if len({s.values.device for s in started}) == 1:
                return np.asarray(tf.concat([s.values for s in started], axis=0).numpy())
        return super().reductions_to_flat(started)

    def recordable(self, value: Any) -> bool:
        """Not empty tensors (no reduction has a value), nor strings."""
        if _tensors.is_tf_value(value):
            shape = tuple(value.shape)  # a keras.Variable's is a tuple, a tensor's a TensorShape
            return tf.as_dtype(value.dtype) != tf.string and all(d != 0 for d in shape)
        return np.asarray(value).dtype.kind in "biufc" and np.size(value) > 0

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        """A TF value's shape and numpy dtype (the recorder writes a loss back with it)."""
        if _tensors.is_tf_value(value):
            dtype = tf.as_dtype(value.dtype)
            return tuple(int(d) for d in value.shape), (
                np.float32 if dtype == tf.bfloat16 else dtype.as_numpy_dtype)
        array = self.to_numpy(value)  # as it is saved: a Python number (``batch``) as shape [1]
        return tuple(array.shape), array.dtype

    def snapshot(self, value: Any) -> Any:
        """A copy where the value lives (a variable's value as it is now); no host transfer
        until a dump."""
        if _tensors.is_tf_value(value):
            return tf.identity(dense(value))
        return super().snapshot(value)

    def nbytes(self, snapshot: Any) -> int:
        """A tensor's bytes."""
        if isinstance(snapshot, tf.Tensor):
            return int(snapshot.shape.num_elements() or 0) * snapshot.dtype.size
        return super().nbytes(snapshot)

    def tensor_phase(self, name: str) -> str:
        """``backward`` for ``gradients/...Grad``, ``forward`` for layer and model inputs and
        outputs (``<layer>/outputs``, ``inputs``, ``labels``, ``predictions``)."""
        if name.startswith("gradients/"):
            return "backward"
        if _LAYER_IO.match(name) or _MODEL_IO.match(name):
            return "forward"
        return "other"

    def recording(self, colls: Iterable[_CoreCollection]) -> bool:
        """True if the flight recorder keeps a tensor of ``colls`` this step: it is fetched on
        every step, due or not."""
        recorder = self.hook.recorder
        return recorder is not None and recorder.records(colls)

    def is_member(self, collection: _CoreCollection, name: str) -> bool:
        """smdebug's TensorFlow membership: weights, biases, gradients and optimizer variables by
        name only (the hook names their members); ``layers`` holds layer inputs/outputs whose
        tensor or layer name matches; any other collection by its names and regexes."""
        if collection.name in BY_NAME_ONLY:
            return collection.has_tensor_name(name)
        if collection.name == CollectionKeys.LAYERS:
            # smdebug matched this collection's regexes against the layer's name, mltrace also
            # against the tensor's.
            io = _LAYER_IO.match(name)
            return io is not None and (collection.matches(name) or collection.matches(io["layer"]))
        return collection.matches(name)

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

    # -- Adapter protocol: events ---------------------------------------------------------------
    def on_prepare(self) -> None:
        """``layers`` saves every layer's inputs and outputs unless the user narrowed it."""
        layers = self.hook.collection_manager.get(CollectionKeys.LAYERS)
        if not layers.include_regex:
            layers.include(LAYERS_DEFAULT_REGEX)

    def on_step_begin(self) -> None:
        """Tell traced capture points whether this step is due (the flag variable)."""
        self.sync_flag()

    def on_step_end(self) -> None:
        """Read the due variables now that the step updated them (eager hooks only)."""
        if self.eager_reads and tf.executing_eagerly():
            self.read_variables()

    def on_finish(self) -> None:
        """Closing: the hook writes the last step without ``on_step_end`` (it has already
        switched ``step_active`` off), so its variables are read here if that step was due."""
        hook, plan = self.hook, self.hook.plan
        if hook.disabled or hook.step_written or not hook.clock.started:
            return
        if plan.due_for(plan.saved) or plan.nan_watch or self.recording(plan.watched):
            self.on_step_end()

    def on_closed(self) -> None:
        """Switch traced captures off and restore every patched object (idempotent)."""
        self.sync_flag()
        self.unpatch_all()

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

    def add_to_collection(self, collection_name: str, variable: Any) -> None:
        """``get_collection(collection_name).add(variable)`` (smdebug's hook method)."""
        cast(Collection, self.hook.get_collection(collection_name)).add(variable)
        self.hook.plan.forget()

    # -- steps ----------------------------------------------------------------------------------
    @guarded()
    def reopen_if_ended(self) -> None:
        """Begin a new step if the current one's files are written: they cannot take more records
        (they would replace its files), so what the user saves after fit()/evaluate() ended goes
        to a step of its own, begun at once (smdebug's TensorFlow behaviour)."""
        if self.hook.step_written and self.hook.prepared:
            self.hook.begin_step()

    def read_variables(self) -> None:
        """Save the variables due this step: layer weights, optimizer variables, added ones."""
        hook = self.hook
        for name, var in self.layer_weights:
            hook.save_for_tensor(name, var)
        if hook.mode is ModeKeys.TRAIN:
            for opt in self.keras_optimizers:
                for var in opt.variables:
                    name = variable_name(var)
                    self.register(name, CollectionKeys.OPTIMIZER_VARIABLES)
                    hook.save_for_tensor(name, var)
        for coll in list(hook.collection_manager.get_collections().values()):
            for name, obj in getattr(coll, "tf_objects", {}).items():
                if _readable_now(obj):
                    hook.save_for_tensor(name, obj)

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

    def run_in_graph(self, fn: Callable[..., None], values: list[Any]) -> None:
        """Call ``fn(*eager values)`` each time the traced graph runs (the user's calls of
        save_scalar, save_tensor, record_tensor_value inside a tf.function)."""
        def call(*arrays: Any) -> list[Any]:
            fn(*arrays)
            return []

        tf.py_function(call, [dense(v) for v in values], [])

    # -- patching helpers -----------------------------------------------------------------------
    def patch(self, obj: Any, attr: str, replacement: Any, weak: bool = False) -> None:
        """Set ``obj.attr`` on the instance (never on its class); ``unpatch_all`` restores it.
        ``weak``: for per-step objects (tapes), which the record must not keep alive."""
        entry = (attr, attr in vars(obj), vars(obj).get(attr))
        if weak:
            self._weak_restore.setdefault(obj, []).append(entry)
        else:
            self._restore.append((obj, *entry))
        setattr(obj, attr, replacement)

    def unpatch_all(self) -> None:
        """Undo every ``patch``, newest first."""
        self.wrapped_optimizers.clear()
        weak = [(obj, *e) for obj, entries in list(self._weak_restore.items()) for e in entries]
        self._weak_restore.clear()
        for obj, attr, had, old in reversed(self._restore + weak):
            try:
                if had:
                    setattr(obj, attr, old)
                else:
                    delattr(obj, attr)
            except (AttributeError, TypeError):  # pragma: no cover - object already gone
                logger.debug("could not restore %s.%s", type(obj).__name__, attr)
        self._restore.clear()

    # -- optimizers -----------------------------------------------------------------------------
    def wrap_keras_optimizer(self, optimizer: Any) -> bool:
        """Capture gradients where Keras 3 applies them (``optimizer.apply``); False if done."""
        if id(optimizer) in self.wrapped_optimizers:
            return False
        self.wrapped_optimizers.add(id(optimizer))
        self.read_optimizer_variables(optimizer)
        # LossScaleOptimizer hands its inner optimizer unscaled gradients.
        target = getattr(optimizer, "inner_optimizer", None) or optimizer
        original = target.apply

        @functools.wraps(original)
        def apply(grads: Any, trainable_variables: Any = None) -> Any:
            grads = list(grads)
            if trainable_variables is not None:
                trainable_variables = list(trainable_variables)
            # Keras 3 keeps the variables it was built with only in a private list, which is
            # what apply(grads) without variables updates: no public accessor has it.
            variables = trainable_variables or list(target._trainable_variables)
            self._capture_gradients(grads, variables, getattr(target, "loss_scale_factor", None))
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
        if not any(optimizer is o for o in self.keras_optimizers):
            self.keras_optimizers.append(optimizer)

    @guarded()
    def _capture_gradients(
        self, grads: list[Any], variables: list[Any], scale: float | None
    ) -> None:
        pairs: list[tuple[str, Any]] = []
        for grad, var in zip(grads, variables):
            if grad is None:
                continue
            name = gradient_name(var)
            self.register(name, CollectionKeys.GRADIENTS)
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

    # -- user values ----------------------------------------------------------------------------
    @guarded(user_facing=True)
    def record_tensor_value(self, tensor_name: str, tensor_value: Any) -> None:
        """Save a metric computed by the user (seed 003) as ``<tensor_name>`` in ``metrics``."""
        if not isinstance(tensor_name, str) or not tensor_name:
            raise MltraceTypeError(
                f"record_tensor_value: tensor_name must be a non-empty string, got {tensor_name!r}"
            )
        if self.defer_symbolic(lambda v: self.record_tensor_value(tensor_name, v), tensor_value):
            return
        self.reopen_if_ended()
        self.register(tensor_name, CollectionKeys.METRICS)
        if self.hook.prepared and self.hook.clock.started:
            self.hook.save_for_tensor(tensor_name, tensor_value)


class _Started:
    """Reductions started on a device: ``values`` (float64, one per item) not yet copied."""

    __slots__ = ("items", "values")

    def __init__(self, items: ReductionItems, values: tf.Tensor) -> None:
        self.items = items
        self.values = values


def is_symbolic(value: Any) -> bool:
    """True for a graph tensor: it has a value only while its graph runs."""
    return isinstance(value, tf.Tensor) and tf.is_symbolic_tensor(value)


def _readable_now(obj: Any) -> bool:
    """True for a variable whose value can be read eagerly (not one of a tf.compat.v1 graph,
    which SessionHook reads in the session). ``_in_graph_mode`` is private, but the public test
    (``tf.is_symbolic_tensor(var.handle)``) raises for a distributed variable outside a replica
    context, and every variable type answers this one."""
    if is_keras_variable(obj):
        return True
    # TF internal: a tf.compat.v1 graph variable says so only in a private flag
    return isinstance(obj, tf.Variable) and not getattr(obj, "_in_graph_mode", False)


def _horovod() -> Any:
    """``horovod.tensorflow`` if the job imported and initialized it, else None (never imported
    here: importing it loads MPI)."""
    import sys

    module = sys.modules.get("horovod.tensorflow")
    try:
        return module if module is not None and module.is_initialized() else None
    except Exception:  # noqa: BLE001 - horovod not usable: single worker
        return None


def _tf_config() -> tuple[dict[str, Any], int] | None:
    """(this task, the number of workers and chiefs) from TF_CONFIG, or None without one."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "null")
        task, cluster = config["task"], config["cluster"]
        return task, len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    except (ValueError, TypeError, KeyError):
        return None


def _has_chief() -> bool:
    """True if TF_CONFIG's cluster names a chief."""
    try:
        return "chief" in json.loads(os.environ["TF_CONFIG"])["cluster"]
    except (KeyError, ValueError, TypeError):
        return False


# -- module-level helpers shared by the front doors ---------------------------------------------
# Collections made with get_collection(...) before a hook exists land here and are handed to the
# next hook created (seed 000 configures them that way).
_pending = PendingCollections(collection_manager)


def take_pending() -> CollectionManager:
    """The collections configured so far; a fresh manager takes their place."""
    return _pending.take()


def _tf_core_hook() -> Hook | None:
    """The core hook created last, if a TensorFlow hook holds it."""
    hook = _core_get_hook()
    return hook if hook is not None and isinstance(hook.adapter, TFAdapter) else None


def get_hook(hook_type: str | None = None, json_config_path: str | None = None,
             create_if_not_exists: bool = False) -> TFHookAPI | None:
    """The current TensorFlow hook (smdebug's ``get_hook``): the KerasHook or SessionHook
    created last or given to ``set_hook``, if it is of ``hook_type`` ("keras", "session",
    "estimator"; None: any). Else, with ``create_if_not_exists``, a ``hook_type`` hook built from
    the JSON configuration (``json_config_path``, else ``MLTRACE_CONFIG_FILE_PATH`` /
    ``SMDEBUG_CONFIG_FILE_PATH``), or None if there is none.

    Raises:
        MltraceValueError: an unknown ``hook_type``, or ``create_if_not_exists`` without one.
    """
    from mltrace.tensorflow._api import TFHookAPI  # the front doors import this module
    from mltrace.tensorflow.keras import KerasHook
    from mltrace.tensorflow.session import SessionHook

    hook_types: dict[str, type[TFHookAPI]] = {"keras": KerasHook, "session": SessionHook,
                                              "estimator": SessionHook}
    if hook_type is not None and hook_type not in hook_types:
        raise MltraceValueError(f"get_hook(hook_type={hook_type!r}): use one of {sorted(hook_types)} or None")
    if hook_type is None and create_if_not_exists:
        raise MltraceValueError("get_hook(create_if_not_exists=True) needs the hook_type to create: "
                                "'keras', 'session' or 'estimator'")
    hook_class = hook_types[hook_type] if hook_type is not None else TFHookAPI

    def front(core: Hook) -> Any:
        return core.adapter.owner if isinstance(core.adapter, TFAdapter) else None

    return cast("TFHookAPI | None", hook_of_class(hook_class, front, json_config_path, create_if_not_exists))


def get_collection(name: str, create: bool = True) -> Collection:
    """The collection ``name`` of the current hook, or of the hook about to be created."""
    return cast(Collection, _pending.of(_tf_core_hook(), Hook, name, create))


def add_to_collection(collection_name: str, args: Any) -> None:
    """``get_collection(collection_name).add(args)`` for variables and graph tensors."""
    get_collection(collection_name).add(args)
