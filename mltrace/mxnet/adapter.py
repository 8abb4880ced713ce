"""The MXNet Gluon side of the capture: forward hooks on the registered blocks, parameters and
gradients read at step boundaries, host copies and on-device reductions of NDArrays, the worker's
Horovod rank.

mltrace.mxnet.hook.Hook is the front door (smdebug's constructor, ``register_block``) and hands
the blocks to :class:`GluonAdapter`. Nothing is written onto the user's blocks: the blocks this
adapter hooked are kept here, by id (MXNet's own ``block.name`` names their tensors).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.ndarray import NDArray

from mltrace.capture.adapter import ReductionItems, as_numpy
from mltrace.capture.errors import guarded
from mltrace.capture.recording_adapter import RecordingAdapter
from mltrace.collections import GRADIENT_PREFIX, TORNASOLE_INCLUDE_COLLECTIONS, CollectionKeys
from mltrace.exceptions import MltraceTypeError
from mltrace.mxnet._reductions import NAN_SAFE, host_results, reduce_on_device, start_reductions
from mltrace.reductions import canonical_name

logger = logging.getLogger(__name__)

# Collections that the model's parameters and the loss block serve: child hooks are not needed.
_PARAM_COLLECTIONS = frozenset(TORNASOLE_INCLUDE_COLLECTIONS + [CollectionKeys.LOSSES])


class GluonAdapter(RecordingAdapter):
    """Gluon's side of the capture (see the module docstring and mltrace.mxnet.hook for what is
    saved when)."""

    def __init__(self) -> None:
        super().__init__()
        #: The registered models (not loss blocks); the first one's forward calls mark steps.
        self.models: list[gluon.Block] = []
        # id(block) -> block, for the blocks that have our forward hook (held, so ids stay unique).
        self._hooked: dict[int, gluon.Block] = {}
        self._io_index: dict[str, int] = {}

    # -- Adapter protocol -------------------------------------------------------------------------
    def worker_identity(self) -> tuple[str, int]:
        """``worker_<rank>`` and the size of a Horovod job (smdebug's MXNet hook knows no other)."""
        try:
            import horovod.mxnet as hvd  # type: ignore[import-not-found]

            if hvd.size():
                return f"worker_{hvd.rank()}", hvd.size()
        except (ImportError, ValueError):
            pass
        return "worker_0", 1

    def to_numpy(self, value: Any) -> np.ndarray:
        """A host copy of an NDArray (sparse ones made dense first); other values as numpy."""
        if not isinstance(value, NDArray):
            return as_numpy(value)
        if value.stype != "default":
            with autograd.pause():  # forward hooks run inside autograd.record()
                value = value.tostype("default")
        return value.asnumpy()

    def reduce(self, value: Any, items: ReductionItems) -> list[np.ndarray | None]:
        """Reductions with MXNet ops on the array's context (one host copy per tensor); sparse
        and non-numeric arrays take numpy's path."""
        if (not isinstance(value, NDArray) or value.stype != "default"
                or np.dtype(value.dtype).kind not in "biuf"):
            return super().reduce(value, items)
        if value.size == 0:
            return [None] * len(items)
        return list(reduce_on_device(value, items))

    # -- the flight recorder (mltrace.capture.flight_recorder) ------------------------------------
    def reduce_on_device(self, value: Any, items: ReductionItems) -> Any:
        """The reductions as one float64 vector left on the array's context (a _Started), or the
        results at once where numpy computes them (sparse, non-numeric, host values)."""
        if (not isinstance(value, NDArray) or value.stype != "default"
                or np.dtype(value.dtype).kind not in "biuf" or value.size == 0):
            return self.reduce(value, items)
        return _Started(items, start_reductions(value, items))

    def reductions_to_host(self, started: list[Any]) -> list[list[np.ndarray | None]]:
        """A step's reductions left on contexts, concatenated and copied to the host together:
        one copy per context (MXNet's engine orders the copy after the reductions, and the
        reductions before any later in-place update of the arrays they read)."""
        pending = [s for s in started if isinstance(s, _Started)]
        host: dict[int, np.ndarray] = {}
        with autograd.pause():
            for ctx in {s.values.context for s in pending}:
                here = [s for s in pending if s.values.context == ctx]
                values = mx.nd.concat(*[s.values for s in here], dim=0).asnumpy()
                offsets = np.cumsum([0] + [s.values.size for s in here])
                host.update({id(s): values[a:b] for s, a, b in zip(here, offsets, offsets[1:])})
        return [list(host_results(s.items, host[id(s)])) if isinstance(s, _Started) else s
                for s in started]

    def reductions_to_flat(self, started: list[Any]) -> np.ndarray:
        """The flight recorder's step: its reductions all on one context are concatenated there
        and copied once; each tensor's NaN count then gives numpy's NaN propagation."""
        if not started or not all(isinstance(s, _Started) for s in started) or len(
                {s.values.context for s in started}) != 1:
            return super().reductions_to_flat(started)
        with autograd.pause():
            host = mx.nd.concat(*[s.values for s in started], dim=0).asnumpy()
        parts, offset = [], 0
        for s in started:
            n = len(s.items)
            part = host[offset:offset + n]
            if host[offset + n] > 0:  # a NaN: every reduction but the counts is NaN, as numpy's
                part = np.where(_nan_safe_mask(s.items), part, np.nan)
            parts.append(part)
            offset += n + 1
        return np.concatenate(parts).astype(np.float64, copy=False)

    def recordable(self, value: Any) -> bool:
        """Numeric, non-empty arrays (no reduction of an empty one has a value)."""
        if isinstance(value, NDArray):
            return value.size > 0 and np.dtype(value.dtype).kind in "biuf"
        return np.asarray(value).dtype.kind in "biuf" and np.size(value) > 0

    def snapshot(self, value: Any) -> Any:
        """A copy on the array's context (no host transfer until a dump)."""
        if isinstance(value, NDArray):
            with autograd.pause():
                return value.copy()
        return super().snapshot(value)

    def nbytes(self, snapshot: Any) -> int:
        """An array's bytes."""
        if isinstance(snapshot, NDArray):
            return int(snapshot.size) * np.dtype(snapshot.dtype).itemsize
        return super().nbytes(snapshot)

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        """An array's shape and numpy dtype, read without copying it."""
        if isinstance(value, NDArray):
            return tuple(value.shape), np.dtype(value.dtype)
        array = self.to_numpy(value)
        return tuple(array.shape), array.dtype

    def _recording(self) -> bool:
        """True while the flight recorder keeps the current step."""
        recorder = self.hook.recorder if self.hook is not None else None
        return recorder is not None and recorder.current is not None

    def check_recorder_budget(self, block: gluon.Block) -> None:
        """Raise if the flight recorder's budget cannot hold one step of what it keeps of
        ``block``'s parameters and gradients (those whose shapes are known yet).

        Raises:
            mltrace.exceptions.MltraceValueError: the budget is too small (mltrace.capture.hook.Hook).
        """
        assert self.hook is not None
        sizes = []
        for param in block.collect_params().values():
            shape = param.shape or ()
            if shape and all(d > 0 for d in shape):  # deferred initialization: not known yet
                nbytes = int(np.prod(shape)) * np.dtype(param.dtype).itemsize
                sizes.append((param.name, nbytes))
                if param.grad_req != "null":
                    sizes.append((GRADIENT_PREFIX + param.name, nbytes))
        if self.hook.recording is not None:
            self.hook.recording.check_budget(sizes, self)

    def on_prepared(self) -> None:
        """Hook the models' child blocks if a saved collection may hold their tensors (decided
        here, at the first step, so collections added after register_block count and MXNet's
        hybridize() does not warn about hooks it will not call)."""
        if self._needs_children():
            for model in self.models:
                model.apply(self._hook_block)

    def on_step_end(self) -> None:
        """Step N ends as step N+1 starts: save its parameters and gradients, as they are after
        step N's optimizer update (smdebug's MXNet lifecycle)."""
        self._save_params()

    def on_finish(self) -> None:
        """At close, save the last step's parameters (not on the disable path, as smdebug)."""
        hook = self.hook
        assert hook is not None
        if hook.disabled or hook.step_written:
            return
        # The core clears step_active before closing: ask the plan whether the last step was.
        if hook.plan.due_for(hook.plan.saved) or hook.plan.nan_watch or self._recording():
            self._save_params()

    # -- attaching to Gluon -----------------------------------------------------------------------
    def register_block(self, block: gluon.Block) -> None:
        """Attach to a model (step boundaries, parameters, gradients, block I/O) or to a loss
        block (its output is saved in collection ``losses``).

        Raises:
            MltraceTypeError: ``block`` is not a gluon.Block.
        """
        if not isinstance(block, gluon.Block):
            raise MltraceTypeError(
                f"register_block needs a gluon.Block, got {type(block).__name__}")
        if id(block) in self._hooked:
            logger.warning("block %s is already registered with the hook; ignoring", block.name)
            return
        if not isinstance(block, gluon.loss.Loss):
            self.check_recorder_budget(block)
            self.models.append(block)
            if len(self.models) == 1:
                block.register_forward_pre_hook(self._forward_pre_hook)
            if self.hook is not None and self.hook.prepared:
                self.on_prepared()
        self._hook_block(block)

    def _hook_block(self, block: gluon.Block) -> None:
        if id(block) not in self._hooked:
            block.register_forward_hook(self._forward_hook)
            self._hooked[id(block)] = block

    def _needs_children(self) -> bool:
        """Whether a saved (or flight-recorded) collection may hold tensors of child blocks
        (smdebug's rule)."""
        assert self.hook is not None
        return any(c.name not in _PARAM_COLLECTIONS and (c.include_regex or c.tensor_names)
                   for c in self.hook.plan.watched)

    # -- callbacks from Gluon ---------------------------------------------------------------------
    @guarded()
    def _forward_pre_hook(self, block: gluon.Block, inputs: Any) -> None:
        """A forward call of the first model: a step boundary."""
        hook = self.hook
        assert hook is not None
        hook.begin_step()  # the previous step's parameters are saved in on_step_end
        if hook.stop_requested is not None:
            # A rule asked to stop: finish the trial, then end the user's loop at this boundary.
            raise hook.stop_training_error()
        self._io_index.clear()
        if hook.step_active and "hybridized" not in self._warned and self._needs_children():
            hidden = [b.name for m in self.models for b in _hybridized_parents(m)]
            if hidden:
                self.warn_once(
                    "hybridized", "hybridized blocks %s: MXNet calls no hook of the blocks inside "
                    "them, so their inputs/outputs are not saved (hybridize after the steps you "
                    "want to inspect)", ", ".join(hidden))

    def _forward_hook(self, block: gluon.Block, inputs: Any, outputs: Any) -> None:
        hook = self.hook
        # Tested before the guard: most steps save nothing.
        if hook is not None and hook.step_active:
            self._save_block_io(block, inputs, outputs)

    @guarded()
    def _save_block_io(self, block: gluon.Block, inputs: Any, outputs: Any) -> None:
        self._save_io(block.name + "_input_", inputs)
        self._save_io(block.name + "_output_", outputs)

    def _save_io(self, prefix: str, value: Any) -> None:
        """Save the arrays in ``value`` as ``<prefix><i>``, counting on from the block's earlier
        calls this step."""
        assert self.hook is not None
        index = self._io_index.get(prefix, 0)
        for array in _flatten_arrays(value):  # Symbols (hybridize's tracing call) are skipped
            self.hook.save_for_tensor(f"{prefix}{index}", array)
            index += 1
        self._io_index[prefix] = index

    # -- parameters -------------------------------------------------------------------------------
    def _save_params(self) -> None:
        """Save every parameter and gradient of the registered models under the ending step."""
        with self._in_step_mode():
            seen: set[str] = set()
            for model in self.models:
                for param in model.collect_params().values():
                    if param.name not in seen:
                        seen.add(param.name)
                        self._save_param(param)

    @contextmanager
    def _in_step_mode(self) -> Iterator[None]:
        """Write under the mode the step began in, even if set_mode changed it since (smdebug
        wrote or dropped such values under the new mode). The clock is the core's public part;
        its mode is set back at once."""
        assert self.hook is not None
        clock = self.hook.clock
        mode, clock.mode = clock.mode, clock.step_mode
        try:
            yield
        finally:
            clock.mode = mode

    def _save_param(self, param: gluon.Parameter) -> None:
        assert self.hook is not None
        try:
            ctx = param.list_ctx()[0]
            self.hook.save_for_tensor(param.name, param.data(ctx))
            if param.grad_req != "null":
                self.hook.save_for_tensor(GRADIENT_PREFIX + param.name, param.grad(ctx))
        except RuntimeError as exc:  # not initialized yet, or no gradient buffer
            self.warn_once(param.name, "cannot save parameter %s: %s", param.name, exc)



def _nan_safe_mask(items: ReductionItems) -> np.ndarray:
    """True where a reduction of ``items`` keeps its value when the tensor holds a NaN."""
    return np.array([canonical_name(name) in NAN_SAFE for name, _ in items])


class _Started:
    """Reductions started on a context: ``values`` (float64, the items then the NaN count)."""

    __slots__ = ("items", "values")

    def __init__(self, items: ReductionItems, values: NDArray) -> None:
        self.items = items
        self.values = values


def _hybridized_parents(block: gluon.Block) -> list[gluon.Block]:
    """The outermost hybridized blocks with children in ``block`` (their insides call no hook).
    Reads Gluon internals: MXNet 1.x has no public accessor for a block's children or for
    whether hybridize() is active."""
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
