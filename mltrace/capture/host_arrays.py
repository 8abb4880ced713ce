"""Saving many small host arrays of one step at once: an adapter's computed values (the PyTorch
hook's stability signals, a few hundred scalars a step) encoded as one batch of records rather
than one tensor at a time through the hook's per-tensor path."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mltrace.capture.plan import what_to_save
from mltrace.collections import Collection

if TYPE_CHECKING:
    from mltrace.capture.hook import Hook


def save_host_arrays(hook: Hook, records: list[tuple[str, np.ndarray]]) -> None:
    """Save ``records`` (name, host array) in the hook's current step. Those whose due
    collections ask for the raw value only, with no TensorBoard export, flight recorder or
    tracking sink to feed, are encoded together (one wall time); the others, and every record
    of a hook that exports or records, go through ``hook.save_for_tensor`` one by one."""
    outputs, plan = hook.outputs, hook.plan
    plain: list[tuple[str, np.ndarray]] = []
    fast = outputs.tensorboard is None and hook.recorder is None and not outputs.sinks
    raw_only: dict[tuple[Collection, ...], bool] = {}  # most names share a few memberships
    for name, array in records:
        colls = plan.collections_of(name)
        if not colls:
            continue
        plain_here = raw_only.get(colls)
        if plain_here is None:
            due = plan.due_for(colls) if fast else ()
            plain_here = raw_only[colls] = bool(due) and what_to_save(due) == (True, False, [])
        if not plain_here or name in outputs.written:
            hook.save_for_tensor(name, array)
            continue
        outputs.written.add(name)
        plain.append((name, array))
        hook.nan_watch.observe(name, array)
    if plain:
        outputs.write_batch(plain)


__all__ = ["save_host_arrays"]
