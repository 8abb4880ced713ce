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

import logging
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np
from mxnet import autograd, gluon
from mxnet.ndarray import NDArray

from mltrace.collections import CollectionKeys
from mltrace.config import ReductionConfig
from mltrace.exceptions import MltraceTypeError
from mltrace.hook import BaseHook, as_numpy, get_hook, guarded
from mltrace.json_config import create_hook_from_config
from mltrace.mxnet import collection as _collection
from mltrace.mxnet._reductions import reduce_on_device
from mltrace.mxnet.collection import (
    DEFAULT_INCLUDE_COLLECTIONS,
    GRADIENT_PREFIX,
    TORNASOLE_INCLUDE_COLLECTIONS,
    Collection,
)

logger = logging.getLogger(__name__)

# Collections that the model's parameters and the loss block serve: child hooks are not needed.
_PARAM_COLLECTIONS = frozenset(TORNASOLE_INCLUDE_COLLECTIONS + [CollectionKeys.LOSSES])


def get_collection(name: str, create: bool = True) -> Collection:
    """The collection ``name`` of the current hook, or of the hook about to be created."""
    return _collection.pending_collection(get_hook(), Hook, name, create)


def add_to_collection(collection_name: str, args: Any) -> None:
    """Add tensor names (or regexes) to a collection, as smdebug's module-level helper."""
    get_collection(collection_name).include(args)


class Hook(BaseHook):
    """Saves parameters, gradients, losses and block inputs/outputs of a Gluon model.

    Args: as mltrace.hook.BaseHook (smdebug's constructor), plus ``saveall`` (Tornasole's
    spelling of ``save_all``).
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
    ) -> None:
        manager = _collection.take_pending()
        super().__init__(
            out_dir,  # type: ignore[arg-type]
            export_tensorboard, tensorboard_dir, dry_run, reduction_config, save_config,
            include_regex, include_collections, bool(save_all or saveall), include_workers, strict,
            mlflow, stop_check_interval,
            collection_manager=manager,
            default_include_collections=self._default_include,
            default_saved_collections=DEFAULT_INCLUDE_COLLECTIONS,
        )
        self._models: list[gluon.Block] = []  # the first one's forward calls mark steps
        self._hooked: weakref.WeakSet[gluon.Block] = weakref.WeakSet()  # have our forward hook
        self._io_index: dict[str, int] = {}
        self._step_mode = self.mode
        self._warned: set[str] = set()

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None) -> Hook:
        """Build a hook from smdebug's JSON configuration (see mltrace.json_config)."""
        return create_hook_from_config(cls, json_file_path)

    def _worker_identity(self) -> tuple[str, int]:
        try:  # smdebug's MXNet hook knows Horovod only
            import horovod.mxnet as hvd  # type: ignore[import-not-found]

            if hvd.size():
                return f"worker_{hvd.rank()}", hvd.size()
        except (ImportError, ValueError):
            pass
        return "worker_0", 1

    # -- registration -----------------------------------------------------------------------------
    def register_block(self, block: gluon.Block) -> None:
        """Attach the hook to a model (step boundaries, parameters, gradients, block I/O) or to a
        loss block (its output is saved in collection ``losses``).

        Raises:
            MltraceTypeError: ``block`` is not a gluon.Block.
        """
        if not isinstance(block, gluon.Block):
            raise MltraceTypeError(
                f"register_block needs a gluon.Block, got {type(block).__name__}")
        self._register(block)

    register_hook = register_block  # Tornasole's (and smdebug's zero-code-change) name

    @guarded()
    def _register(self, block: gluon.Block) -> None:
        if block in self._hooked:
            logger.warning("block %s is already registered with the hook; ignoring", block.name)
            return
        if not isinstance(block, gluon.loss.Loss):
            self._models.append(block)
            if len(self._models) == 1:
                block.register_forward_pre_hook(self._forward_pre_hook)
            if self._prepared:
                self._hook_children()
        self._hook_block(block)

    def _hook_block(self, block: gluon.Block) -> None:
        if block not in self._hooked:
            block.register_forward_hook(self._forward_hook)
            self._hooked.add(block)

    def _needs_children(self) -> bool:
        """Whether a saved collection may hold tensors of child blocks (smdebug's rule)."""
        return any(c.name not in _PARAM_COLLECTIONS and (c.include_regex or c.tensor_names)
                   for c in self._collections_to_save)

    def _hook_children(self) -> None:
        # Done at the first step, so that collections added after register_block count, and
        # MXNet's hybridize() does not warn about hooks it will not call.
        if self._needs_children():
            for model in self._models:
                model.apply(self._hook_block)

    def _prepare_collections(self) -> None:
        super()._prepare_collections()
        self._hook_children()

    # -- callbacks from Gluon ---------------------------------------------------------------------
    @guarded()
    def _forward_pre_hook(self, block: gluon.Block, inputs: Any) -> None:
        if self.step_active:
            self._save_params()  # of the step that just ended, after its update
        self._begin_step()
        if self.stop_requested is not None:
            self.close()
            raise self._stop_training_error()
        self._step_mode = self.mode
        self._io_index.clear()
        if self.step_active and "hybridized" not in self._warned and self._needs_children():
            hidden = [b.name for m in self._models for b in _hybridized_parents(m)]
            if hidden:
                self._warn_once(
                    "hybridized", "hybridized blocks %s: MXNet calls no hook of the blocks inside "
                    "them, so their inputs/outputs are not saved (hybridize after the steps you "
                    "want to inspect)", ", ".join(hidden))

    def _forward_hook(self, block: gluon.Block, inputs: Any, outputs: Any) -> None:
        if self.step_active:  # tested before the guard: most steps save nothing
            self._save_block_io(block, inputs, outputs)

    @guarded()
    def _save_block_io(self, block: gluon.Block, inputs: Any, outputs: Any) -> None:
        self._save_io(block.name + "_input_", inputs)
        self._save_io(block.name + "_output_", outputs)

    def _save_io(self, prefix: str, value: Any) -> None:
        index = self._io_index.get(prefix, 0)
        for array in _flatten_arrays(value):  # Symbols (hybridize's tracing call) are skipped
            self._save_for_tensor(f"{prefix}{index}", array)
            index += 1
        self._io_index[prefix] = index

    def _save_params(self) -> None:
        """Save every parameter and gradient of the registered models under the ending step."""
        mode, self.mode = self.mode, self._step_mode
        try:
            seen: set[str] = set()
            for model in self._models:
                for param in model.collect_params().values():
                    if param.name not in seen:
                        seen.add(param.name)
                        self._save_param(param)
        finally:
            self.mode = mode

    def _save_param(self, param: gluon.Parameter) -> None:
        try:
            ctx = param.list_ctx()[0]
            self._save_for_tensor(param.name, param.data(ctx))
            if param.grad_req != "null":
                self._save_for_tensor(GRADIENT_PREFIX + param.name, param.grad(ctx))
        except RuntimeError as exc:  # not initialized yet, or no gradient buffer
            self._warn_once(param.name, "cannot save parameter %s: %s", param.name, exc)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    @guarded()
    def _save_last_params(self) -> None:
        if self.step_active:
            self._save_params()

    def _finish(self, write_end_marker: bool) -> None:
        if write_end_marker and not self._disabled and self.writer is not None:
            self._save_last_params()  # the last step's, as smdebug at close (disables on error)
        super()._finish(write_end_marker)

    # -- tensor conversion ------------------------------------------------------------------------
    def _to_numpy(self, value: Any) -> np.ndarray:
        if not isinstance(value, NDArray):
            return as_numpy(value)
        if value.stype != "default":
            with autograd.pause():
                value = value.tostype("default")
        return value.asnumpy()

    def _reduce(self, value: Any, items: list[tuple[str, bool]]) -> list[np.ndarray | None]:
        if (not isinstance(value, NDArray) or value.stype != "default"
                or np.dtype(value.dtype).kind not in "biuf"):
            return super()._reduce(value, items)
        if value.size == 0:
            return [None] * len(items)
        return reduce_on_device(value, items)  # type: ignore[return-value]


def _hybridized_parents(block: gluon.Block) -> list[gluon.Block]:
    """The outermost hybridized blocks with children in ``block`` (their insides call no hook)."""
    if getattr(block, "_active", False) and block._children:
        return [block]
    return [b for child in block._children.values() for b in _hybridized_parents(child)]


def _flatten_arrays(value: Any) -> list[NDArray]:
    """NDArrays in (nested) tuples and lists, in order; anything else is skipped (as smdebug)."""
    if isinstance(value, NDArray):
        return [value]
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _flatten_arrays(v)]
    return []


class TornasoleHook(Hook):
    """Tornasole's hook: saves weights, biases and gradients when no collection is named."""

    _default_include = TORNASOLE_INCLUDE_COLLECTIONS
