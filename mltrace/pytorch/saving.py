"""Saving a tensor from the PyTorch callbacks, sharded tensors (FSDP2's DTensors) included:
their reductions are combined from the local shards once per step, never gathered whole."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from mltrace.capture.errors import guarded
from mltrace.capture.plan import what_to_save
from mltrace.pytorch.adapter_state import TorchAdapterState
from mltrace.pytorch.sharded import gather_full, is_sharded
from mltrace.pytorch.values import Reduced


class ShardedSaves(TorchAdapterState):
    """``save``: a tensor to the hook, a sharded one reduced across ranks first."""

    def save(self, name: str, value: Any) -> None:
        """Save ``value`` as ``name`` if due. A sharded tensor (DTensor) is first turned into
        what the due collections need, on every rank: its reductions, combined from the local
        shards, or the full tensor, gathered to the ranks that write."""
        assert self.hook is not None
        if is_sharded(value):
            value = self._unshard(name, value)
            if value is None:
                return
        self.hook.save_for_tensor(name, value)

    def _unshard(self, name: str, value: Any) -> Any:
        hook = self.hook
        assert hook is not None
        colls = hook.plan.collections_of(name)
        due = hook.plan.due_for(colls) if colls else ()
        if not due:
            return value  # not saved; the NaN watch may still look at it
        if hook.dry_run:
            return None
        save_raw, save_shape, items = what_to_save(list(due))
        histogram = hook.tensorboard is not None and any(c.save_histogram for c in due)
        if save_raw or save_shape or histogram or any(n == "median" for n, _ in items):
            return gather_full(value, None if hook.include_workers == "all" else 0)
        # Reduced now to a few partials on the device; combined with the step's other sharded
        # tensors at the next optimizer step or step boundary (one all-reduce per kind of partial).
        self._sharded.add(value, items)
        self._sharded_saves.append((name, tuple(value.shape), items))
        self.optimizer_steps.install()
        return None

    @guarded()
    def _save_sharded_reductions(self) -> None:
        """Combine the reductions of the sharded tensors saved since the last call and save them.

        Every rank of the job calls this at the same points (optimizer steps, step boundaries,
        close) with the same tensors pending, since the collectives must match. A rank that
        writes nothing (``include_workers="one"``) takes part and discards the results.
        """
        if not self._sharded_saves:
            return
        saves, self._sharded_saves = self._sharded_saves, []
        if not (dist.is_available() and dist.is_initialized()):
            self._sharded.clear()
            self.warn_once("sharded-after-destroy",
                           "not saving reductions of %d sharded tensors: the process group was "
                           "destroyed before the hook combined them; call hook.close() before "
                           "dist.destroy_process_group()", len(saves))
            return
        results = self._sharded.combine()
        hook = self.hook
        if hook is None or hook.writer is None or hook.step_written:
            return
        for (name, shape, items), values in zip(saves, results):
            hook.save_for_tensor(name, Reduced(shape, items, values))
