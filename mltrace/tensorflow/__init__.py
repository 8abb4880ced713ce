"""TensorFlow 2.21 / Keras 3 adapter with smdebug.tensorflow's names.

``import smdebug.tensorflow as smd`` becomes ``import mltrace.tensorflow as smd``.

* ``KerasHook``: a Keras callback for fit / evaluate / predict, and GradientTape loops
  (``hook.wrap_tape``); gradients come from ``optimizer.apply`` (``hook.wrap_optimizer``).
* ``SessionHook``: a ``tf.compat.v1.train.SessionRunHook`` for graph-mode training.
  ``EstimatorHook`` is its smdebug alias (tf.estimator is gone from TensorFlow 2.21).
* ``TornasoleHook``: Tornasole's TensorFlow hook (a SessionHook saving weights, biases, gradients).

Example:
    >>> import mltrace.tensorflow as smd
    >>> hook = smd.KerasHook(out_dir="/tmp/run", include_collections=["weights", "gradients"])
    >>> model.fit(x, y, callbacks=[hook])
    >>> smd.create_trial("/tmp/run").tensor_names(collection="gradients")
"""

from mltrace import modes
from mltrace.capture.hook import del_hook, set_hook
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.collections import CollectionKeys
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.tensorflow._core import add_to_collection, get_collection
from mltrace.tensorflow.collection import Collection
from mltrace.tensorflow.current import get_hook
from mltrace.tensorflow.keras import KerasHook
from mltrace.tensorflow.session import EstimatorHook, SessionHook, TornasoleHook
from mltrace.trials import create_trial

Hook = KerasHook

__all__ = [
    "Collection",
    "CollectionKeys",
    "EstimatorHook",
    "FlightRecorderConfig",
    "Hook",
    "KerasHook",
    "ReductionConfig",
    "SaveConfig",
    "SaveConfigMode",
    "SessionHook",
    "TornasoleHook",
    "add_to_collection",
    "create_trial",
    "get_collection",
    "get_hook",
    "set_hook",
    "del_hook",
    "modes",
]
