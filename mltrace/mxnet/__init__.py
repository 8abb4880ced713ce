"""MXNet Gluon adapter: ``Hook`` for Gluon blocks, with smdebug's names, defaults and semantics.

Porting from smdebug is the import: ``import mltrace.mxnet as smd``. mltrace.mxnet.hook says what
is saved, under which names and when (parameters and gradients of a step are its post-update
values, as smdebug's MXNet hook saved them), and how it differs from smdebug 1.0.34.

Example:
    >>> import mltrace.mxnet as smd
    >>> hook = smd.Hook(out_dir="/tmp/run", save_config=smd.SaveConfig(save_interval=10),
    ...                 include_collections=["weights", "gradients", "losses"])
    >>> hook.register_block(net)
    >>> hook.register_block(loss_fn)
    >>> hook.get_collection("relu").add_block_tensors(net[0].act, inputs=True, outputs=True)
"""

from mltrace import modes
from mltrace.capture.hook import del_hook, set_hook
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.collections import CollectionKeys
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.mxnet.collection import DEFAULT_COLLECTIONS, DEFAULT_INCLUDE_COLLECTIONS, Collection
from mltrace.mxnet.hook import Hook, TornasoleHook, add_to_collection, get_collection, get_hook
from mltrace.trials import create_trial

__all__ = [
    "Hook", "TornasoleHook", "Collection", "FlightRecorderConfig", "CollectionKeys", "SaveConfig", "SaveConfigMode",
    "ReductionConfig", "modes", "get_collection", "add_to_collection", "get_hook", "set_hook", "del_hook", "create_trial",
    "DEFAULT_COLLECTIONS", "DEFAULT_INCLUDE_COLLECTIONS",
]
