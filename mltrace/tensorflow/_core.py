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
kept in the adapter, never written onto the user's objects.

:class:`TFAdapter` is put together from one part per concern, each in a module of its own:

* mltrace.tensorflow._patching: the record of patched instance attributes;
* mltrace.tensorflow._capture: in-step capture, collection membership of captured names, the
  flag that tells traced graphs whether the step is due;
* mltrace.tensorflow._variables: variables read between steps, gradients where Keras 3's
  optimizer applies them (mixed precision's loss scale undone);
* mltrace.tensorflow._tape: GradientTape loops (the step boundary, gradients, loss);
* mltrace.tensorflow._flight_recorder: what only the flight recorder asks (on-device
  reductions, snapshots);
* mltrace.tensorflow._distribution: Horovod and TF_CONFIG workers, MirroredStrategy replicas.

This module holds the adapter's protocol events and identity, and the module-level functions
the front doors share (``get_collection``, ``add_to_collection``); ``get_hook``, which returns the
front doors, is in mltrace.tensorflow.current, above them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import tensorflow as tf

from mltrace.capture.adapter import ReductionItems
from mltrace.capture.errors import guarded
from mltrace.capture.hook import Hook
from mltrace.capture.hook import get_hook as _core_get_hook
from mltrace.collections import Collection as _CoreCollection
from mltrace.collections import CollectionKeys, CollectionManager, PendingCollections
from mltrace.exceptions import MltraceTypeError
from mltrace.tensorflow import _tensors
from mltrace.tensorflow._capture import is_symbolic as is_symbolic  # _api imports it from here
from mltrace.tensorflow._distribution import has_chief, horovod, tf_config
from mltrace.tensorflow._flight_recorder import RecorderFastPath
from mltrace.tensorflow._tape import TapeCapture
from mltrace.tensorflow._tensors import LAYER_IO
from mltrace.tensorflow._variables import VariableCapture
from mltrace.tensorflow.collection import (
    DEFAULT_COLLECTIONS,
    LAYERS_DEFAULT_REGEX,
    Collection,
    collection_manager,
)

if TYPE_CHECKING:
    from mltrace.tensorflow._api import TFHookAPI


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


class TFAdapter(RecorderFastPath, TapeCapture, VariableCapture):
    """TensorFlow conversions and reductions, worker identity (Horovod, TF_CONFIG), smdebug's
    TensorFlow collection membership, and the hook's events; in-step capture, optimizer and
    GradientTape wrapping come from its parts (see the module's docstring).

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

    @property
    def owner(self) -> TFHookAPI | None:
        """The KerasHook or SessionHook holding this adapter (``get_hook`` returns it), given
        when the adapter is built; None once it is gone."""
        return self._owner()

    # -- Adapter protocol: identity and values ----------------------------------------------------
    def worker_identity(self) -> tuple[str, int]:
        """``worker_<rank>`` under Horovod (if the job initialized it), else TF_CONFIG's task
        (``<type>_<index>``, counting workers and the chief), else ``worker_0`` alone."""
        hvd = horovod()
        if hvd is not None:
            return f"worker_{hvd.rank()}", hvd.size()
        cluster = tf_config()
        if cluster is not None:
            task, workers = cluster
            return f"{task['type']}_{task['index']}", workers
        return "worker_0", 1

    def chief_worker(self) -> str:
        """TF_CONFIG's chief if the cluster has one, else ``worker_0`` (as smdebug)."""
        return "chief_0" if has_chief() else "worker_0"

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

    def is_member(self, collection: _CoreCollection, name: str) -> bool:
        """smdebug's TensorFlow membership: weights, biases, gradients and optimizer variables by
        name only (the hook names their members); ``layers`` holds layer inputs/outputs whose
        tensor or layer name matches; any other collection by its names and regexes."""
        if collection.name in BY_NAME_ONLY:
            return collection.has_tensor_name(name)
        if collection.name == CollectionKeys.LAYERS:
            # smdebug matched this collection's regexes against the layer's name, mltrace also
            # against the tensor's.
            io = LAYER_IO.match(name)
            return io is not None and (collection.matches(name) or collection.matches(io["layer"]))
        return collection.matches(name)

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

    # -- collections and the user's values -----------------------------------------------------
    def add_to_collection(self, collection_name: str, variable: Any) -> None:
        """``get_collection(collection_name).add(variable)`` (smdebug's hook method)."""
        cast(Collection, self.hook.get_collection(collection_name)).add(variable)
        self.hook.plan.forget()

    @guarded(user_facing=True)
    def record_tensor_value(self, tensor_name: str, tensor_value: Any) -> None:
        """Save a metric computed by the user (smdebug's README) as ``<tensor_name>`` in ``metrics``."""
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


# -- module-level helpers shared by the front doors ---------------------------------------------
# Collections made with get_collection(...) before a hook exists land here and are handed to the
# next hook created (Tornasole's PyTorch README configures them that way).
_pending = PendingCollections(collection_manager)


def take_pending() -> CollectionManager:
    """The collections configured so far; a fresh manager takes their place."""
    return _pending.take()


def _tf_core_hook() -> Hook | None:
    """The core hook created last, if a TensorFlow hook holds it."""
    hook = _core_get_hook()
    return hook if hook is not None and isinstance(hook.adapter, TFAdapter) else None


def get_collection(name: str, create: bool = True) -> Collection:
    """The collection ``name`` of the current hook, or of the hook about to be created."""
    return cast(Collection, _pending.of(_tf_core_hook(), Hook, name, create))


def add_to_collection(collection_name: str, args: Any) -> None:
    """``get_collection(collection_name).add(args)`` for variables and graph tensors."""
    get_collection(collection_name).add(args)
