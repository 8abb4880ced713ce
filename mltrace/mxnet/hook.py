"""The MXNet Gluon hook: what it saves, under which names, and when.

Tensor names (as smdebug's MXNet hook): parameters by their Gluon name (``conv0_weight``,
``dense0_bias``), gradients ``gradient/<param name>``, block inputs/outputs
``<block name>_input_<i>`` / ``<block name>_output_<i>`` (``conv0_relu_input_0``), losses
``<loss block name>_output_0`` (``softmaxcrossentropyloss0_output_0``). Block names come from
MXNet's name scope (``dense0``, ``hybridsequential0_dense0`` inside a parent's ``name_scope()``).

When values are taken (smdebug's MXNet lifecycle): a forward call of the registered model starts a
step. Parameters and gradients of step N are saved at the start of step N+1, before it increments
(or at ``close()``), so they are the values *after* step N's optimizer update, and the gradients
that update used. Unlike smdebug, they are written under step N's own mode even when
``set_mode`` changed the mode in between (smdebug wrote or dropped them under the new mode).

Which blocks get a forward hook (smdebug's rule): the model and the loss blocks always; every
child block only when a saved collection other than weights, biases, gradients and losses
names tensors, decided at the first step (so collections added after ``register_block`` count).

Hybridized models: MXNet runs a hybridized block's children as one compiled graph and calls none
of their hooks (its tracing call passes Symbols, which are skipped), so inputs/outputs of blocks
inside a hybridized block are not saved (a warning names the block, once). Steps, parameters,
gradients, losses and the I/O of the hybridized block itself are saved either way. MXNet's own
``hybridize()`` warns about a block that already has hooks; hybridize before ``register_block``
to avoid that message (the hook works the same).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mxnet import gluon

from mltrace.capture.errors import guarded
from mltrace.capture.hook import Hook as CoreHook
from mltrace.capture.hook import get_hook as _current_hook
from mltrace.capture.hook import hook_of_class
from mltrace.capture.json_config import create_hook_from_config
from mltrace.capture.options import HookOptions
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.collections import TORNASOLE_INCLUDE_COLLECTIONS
from mltrace.config import ReductionConfig
from mltrace.mxnet.adapter import GluonAdapter
from mltrace.mxnet.collection import (
    DEFAULT_INCLUDE_COLLECTIONS,
    Collection,
    pending,
)


def get_collection(name: str, create: bool = True) -> Collection:
    """The collection ``name`` of the current hook, or of the hook about to be created."""
    return pending.of(_current_hook(), Hook, name, create)  # type: ignore[return-value]


def get_hook(json_config_path: str | None = None, create_if_not_exists: bool = True) -> Hook | None:
    """The current MXNet hook (smdebug's ``get_hook``): the one created last or given to
    ``set_hook``; else one built from the JSON configuration (``json_config_path``, else
    ``MLTRACE_CONFIG_FILE_PATH`` / ``SMDEBUG_CONFIG_FILE_PATH``), or None if there is none.
    smdebug's MXNet ``get_hook`` always tried to create one; pass ``create_if_not_exists=False``
    to only look."""
    return hook_of_class(Hook, lambda core: core, json_config_path, create_if_not_exists)


def add_to_collection(collection_name: str, args: Any) -> None:
    """Add tensor names (or regexes) to a collection, as smdebug's module-level helper."""
    get_collection(collection_name).include(args)


class Hook(CoreHook):
    """Saves parameters, gradients, losses and block inputs/outputs of a Gluon model.

    Args: smdebug's constructor (each is described in mltrace.capture.options.HookOptions),
    plus ``saveall`` (Tornasole's spelling of ``save_all``).

    When a rule's StopTraining action fires, the next forward call of the registered model
    closes the trial and raises mltrace.exceptions.StopTrainingRequested.
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
    ) -> None:
        options = HookOptions.from_front_door(locals())  # smdebug's arguments, by name
        self.gluon = GluonAdapter()
        super().__init__(options, self.gluon, collection_manager=pending.take(),
                         default_include_collections=self._default_include,
                         default_saved_collections=DEFAULT_INCLUDE_COLLECTIONS)

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None) -> Hook:
        """Build a hook from smdebug's JSON configuration (see mltrace.capture.json_config)."""
        return create_hook_from_config(cls, json_file_path)

    @guarded(user_facing=True)
    def register_block(self, block: gluon.Block) -> None:
        """Attach the hook to a model (step boundaries, parameters, gradients, block I/O) or to a
        loss block (its output is saved in collection ``losses``).

        Raises:
            MltraceTypeError: ``block`` is not a gluon.Block.
        """
        self.gluon.register_block(block)

    register_hook = register_block  # Tornasole's (and smdebug's zero-code-change) name


class TornasoleHook(Hook):
    """Tornasole's hook: saves weights, biases and gradients when no collection is named."""

    _default_include = TORNASOLE_INCLUDE_COLLECTIONS


__all__ = ["Hook", "TornasoleHook", "get_hook", "get_collection", "add_to_collection"]
