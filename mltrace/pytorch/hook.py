"""``Hook``, smdebug's PyTorch hook (``mltrace.pytorch.Hook``; smdebug's scripts also import it
from ``mltrace.pytorch.hook``), ``TornasoleHook``, and the module-level helpers that find the
current hook or its collections."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from mltrace.capture.errors import guarded
from mltrace.capture.hook import Hook as CoreHook
from mltrace.capture.hook import check_tensor_name, hook_of_class, set_hook
from mltrace.capture.hook import get_hook as _current_hook
from mltrace.capture.json_config import create_hook_from_config
from mltrace.capture.options import HookOptions
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.collections import TORNASOLE_INCLUDE_COLLECTIONS, CollectionKeys, CollectionManager
from mltrace.config import ReductionConfig
from mltrace.exceptions import MltraceTypeError
from mltrace.pytorch.adapter import TorchAdapter
from mltrace.pytorch.collection import DEFAULT_COLLECTIONS as DEFAULT_COLLECTIONS
from mltrace.pytorch.collection import DEFAULT_INCLUDE_COLLECTIONS, Collection, pending


def get_collection(name: str, create: bool = True) -> Collection:
    """The collection ``name`` of the current hook, or of the hook about to be created."""
    return pending.of(_current_hook(), Hook, name, create)  # type: ignore[return-value]


def add_to_collection(collection_name: str, args: Any) -> None:
    """Add tensor names (or regexes) to a collection, as smdebug's module-level helper."""
    get_collection(collection_name).include(args)

class Hook(CoreHook):
    """Saves weights, biases, gradients, losses and module inputs/outputs of a PyTorch model.

    Args: smdebug's constructor (each is described in mltrace.capture.options.HookOptions),
    plus ``saveall`` (Tornasole's spelling of ``save_all``) and ``step_boundary``: "forward"
    (default, smdebug's: a step per forward pass of the registered model) or "optimizer" (a TRAIN
    step per optimizer step, saving the accumulated gradients: for gradient accumulation).

    The model may be compiled (register the model or what ``torch.compile`` returned) or sharded
    with FSDP2 (``fully_shard`` before registering); see docs/guide/pytorch.md.

    When a rule's StopTraining action fires, the next forward pass of the registered model
    closes the trial and raises mltrace.exceptions.StopTrainingRequested: catch it around your
    loop to end training cleanly (``hook.stop_requested`` says the same without raising).
    """

    _default_include = DEFAULT_INCLUDE_COLLECTIONS

    def __init__(
        self,
        out_dir: str | None = None,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config: ReductionConfig | None = None,
        save_config: Any = None,
        include_regex: str | Iterable[str] | None = None,
        include_collections: Iterable[str] | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        strict: bool = False,
        saveall: bool | None = None,
        mlflow: bool | dict[str, Any] | None = None,
        stop_check_interval: float | None = None,
        flight_recorder: FlightRecorderConfig | dict[str, Any] | bool | None = None,
        step_boundary: str = "forward",
    ) -> None:
        options = HookOptions.from_front_door(locals())  # smdebug's arguments, by name
        self.torch = TorchAdapter(step_boundary)
        super().__init__(options, self.torch, collection_manager=pending.take(),
                         default_include_collections=self._default_include,
                         default_saved_collections=DEFAULT_INCLUDE_COLLECTIONS)

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None) -> Hook:
        """Build a hook from smdebug's JSON configuration (see mltrace.capture.json_config)."""
        return create_hook_from_config(cls, json_file_path)

    @guarded(user_facing=True)
    def register_module(self, module: torch.nn.Module) -> None:
        """Attach the hook to a model: step boundaries, parameters, gradients, module I/O."""
        self.torch.register_module(module)

    register_hook = register_module  # Tornasole's name

    @guarded(user_facing=True)
    def register_loss(self, loss_module: torch.nn.Module) -> None:
        """Save the output of a loss module as ``<LossClass>_output_0`` (collection losses)."""
        self.torch.register_loss(loss_module)

    @guarded(user_facing=True)
    def register_grad_scaler(self, scaler: Any) -> None:
        """Save gradients unscaled: the hook divides them by ``scaler``'s loss scale, records
        the scale (``GradScaler_scale``) and marks optimizer steps the scaler skipped because of
        inf or NaN gradients (``GradScaler_step_skipped``), in collection ``grad_scaler``."""
        self.torch.register_grad_scaler(scaler)

    @guarded(user_facing=True)
    def record_tensor_value(self, tensor_name: str, tensor_value: torch.Tensor) -> None:
        """Save a value computed outside a module (a functional loss) as ``<name>_output_0``."""
        check_tensor_name(tensor_name, "record_tensor_value name")
        if not isinstance(tensor_value, torch.Tensor):
            raise MltraceTypeError(f"record_tensor_value({tensor_name!r}) needs a torch.Tensor")
        if self.step_active:
            self.torch.save_io(tensor_name, "_output_", tensor_value)

def get_hook(json_config_path: str | None = None, create_if_not_exists: bool = False) -> Hook | None:
    """The current PyTorch hook (smdebug's ``get_hook``): the one created last or given to
    ``set_hook``; else, with ``create_if_not_exists``, one built from the JSON configuration
    (``json_config_path``, else ``MLTRACE_CONFIG_FILE_PATH`` / ``SMDEBUG_CONFIG_FILE_PATH``),
    or None if there is none."""
    return hook_of_class(Hook, lambda core: core, json_config_path, create_if_not_exists)


class TornasoleHook(Hook):
    """Tornasole's hook (its PyTorch README): saves weights, biases and gradients when no collection is named."""

    _default_include = TORNASOLE_INCLUDE_COLLECTIONS


__all__ = ["Hook", "TornasoleHook", "CollectionKeys", "CollectionManager", "DEFAULT_INCLUDE_COLLECTIONS",
           "add_to_collection", "get_collection", "get_hook", "set_hook"]
