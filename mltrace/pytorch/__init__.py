"""PyTorch adapter: ``Hook`` for ``nn.Module`` training loops, with smdebug's names and defaults.

Tensor names (as smdebug's PyTorch hook): parameters ``<RootClass>_<param path>`` (saved at the
start of each step, before the update), gradients ``gradient/<RootClass>_<param path>``, module
inputs/outputs ``<module path>_input_<i>`` / ``<module path>_output_<i>`` (the root module by its
class name), losses ``<LossClass>_output_0``; with the ``samples`` collection (saved when
named, kept by a flight recorder with ``samples=True``), each sample's loss ``samples/<LossClass>/loss``
and input fingerprint ``samples/<RootClass>/fingerprint`` (:func:`fingerprint` computes the same
digests of a batch, to find it in a data pipeline).

Distributed jobs (torch.distributed, or Horovod): each process is ``worker_<rank>``. With
``include_workers="all"`` every worker writes its own files and the trial's ``num_workers`` is the
world size; with "one" (the default) only worker_0 writes. Gradients are the worker's own, as the
gradient hook receives them before DistributedDataParallel averages them (smdebug saved the same).
Under FSDP2 they are the reduced gradients FSDP2 hands each rank (mltrace.pytorch.sharded
gathers or reduces the shards).

Modules: ``hook`` (the ``Hook`` front door), ``adapter`` (TorchAdapter: callbacks and names, with
its parts ``boundary``, ``module_io``, ``gradients``, ``saving``, ``values``; ``module_hooks``
keeps its callbacks out of a pickled model), ``compiled`` (staying out of
torch.compile's way), ``sharded`` (DTensor gathers and reductions), ``optim`` (optimizer steps,
GradScaler), ``reductions`` (on-device reductions), ``samples`` (per-sample losses and
fingerprints).

Example:
    >>> import mltrace.pytorch as smd
    >>> hook = smd.Hook(out_dir="/tmp/run", save_config=smd.SaveConfig(save_interval=10),
    ...                 include_collections=["weights", "gradients", "losses"])
    >>> hook.register_module(model); hook.register_loss(loss_fn)
"""

from mltrace import modes
from mltrace.capture.hook import del_hook, set_hook
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.collections import GRADIENT_PREFIX, CollectionKeys
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.pytorch.adapter import TorchAdapter
from mltrace.pytorch.collection import DEFAULT_COLLECTIONS as DEFAULT_COLLECTIONS
from mltrace.pytorch.collection import DEFAULT_INCLUDE_COLLECTIONS as DEFAULT_INCLUDE_COLLECTIONS
from mltrace.pytorch.collection import Collection
from mltrace.pytorch.hook import Hook, TornasoleHook, add_to_collection, get_collection, get_hook
from mltrace.pytorch.reductions import torch_reductions
from mltrace.pytorch.samples import fingerprint
from mltrace.trials import create_trial

__all__ = [
    "Hook", "TornasoleHook", "Collection", "FlightRecorderConfig", "SaveConfig", "SaveConfigMode", "ReductionConfig", "modes",
    "get_collection", "add_to_collection", "get_hook", "set_hook", "del_hook", "create_trial",
    "CollectionKeys", "TorchAdapter", "torch_reductions", "GRADIENT_PREFIX", "fingerprint",
]
