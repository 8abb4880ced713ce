"""The flight recorder's ring of copies: each step's tensors copied into a preallocated slot,
their reductions computed only when the step is read.

Why: on a model whose tensors are small, a reduction costs its kernel launches, not its
arithmetic. Five reductions of every recorded tensor at every step are three or four launches
per tensor; a copy is one, and the step's check for NaN and infinity is then one sum over its
slot. The reductions are computed when a step is read (a dump, a check that found something, a
step written after a trigger): the same kernels as :func:`mltrace.pytorch.reductions.fused_reductions`
on a float32 copy, which is exact for float32, float16 and bfloat16 (the reducer upcasts the
last two too).

The layout (the tensors' shapes, in the order they come) is learned from the first recorded
step. Slots for the ring's steps plus the one being recorded are made then, on the tensors'
device, if they fit in the bytes the recorder allows (:meth:`CopyRing.fits`). A step whose
tensors stop matching the layout (another shape or dtype at some position: a smaller last
batch, an evaluation) copies the prefix that matched and reduces the rest as the recorder did
before; after :data:`MISSES_TO_STOP` such steps in a row the ring is given up. Steps already in
the recorder's ring keep their slots until they leave it.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mltrace.capture.recording_adapter import RecordingAdapter
from mltrace.pytorch.reductions import DeviceReductions, fused_reductions
from mltrace.reductions import all_finite

#: dtypes a float32 copy holds exactly
COPIED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
#: consecutive steps that did not match the learned layout before the ring is given up
MISSES_TO_STOP = 8


@dataclass(slots=True, eq=False, weakref_slot=True)
class CopiedStep:
    """One recorded step, packed: its copies (views of its slot) and the handles of what was
    reduced as it came (a scalar, a loss, a tensor that did not match the layout), packed by the
    adapter. Its slot stays its own while it is alive (kept in the recorder's ring)."""

    ring: CopyRing
    slot: int
    copies: list[torch.Tensor]
    used: torch.Tensor  # the slot's prefix holding the copies (one flat tensor)
    rest: list[Any]  # the other handles, packed
    #: per handle in step order, True for a copy; None when all are copies
    kinds: list[bool] | None = None
    widths: list[int] | None = None  # the other handles' widths (their reductions), in order
    #: the sum of a full slot, taken by the ring after the step's last copy (see
    #: :meth:`CopyRing.reducer`); None: :meth:`finite` sums ``used`` itself
    total: torch.Tensor | None = None

    def finite(self, adapter: Any) -> bool:
        """True if every copied value and every other reduction is finite: one sum over the
        slot, read with the other handles' values in one copy where they share its device.
        False may also be a sum that overflowed (the recorder then looks tensor by tensor).
        Asked of the step just packed, whose slot is its own."""
        total, self.total = self.total, None
        if total is None:
            total = self.used.sum()
        rest = self.rest
        adapter.host_transfers += 1
        if not rest:
            return math.isfinite(total.item())
        packed = rest[0]
        if (len(rest) == 1 and type(packed) is DeviceReductions and packed.stacked is not None
                and packed.stacked.device == total.device):
            return all_finite(torch.cat([total.reshape(1), packed.stacked]).tolist())
        return math.isfinite(total.item()) and adapter.reductions_finite(rest)

    def to_flat(self, adapter: Any) -> np.ndarray:
        """The step's reductions in its order, as the recorder keeps them (float64): those of
        the copies computed now (one copy to the host), the others read."""
        self.ring.check(self)
        reduce = self.ring.reduce_copy
        values = torch.stack([v for copy in self.copies for v in reduce(copy)])
        adapter.host_transfers += 1
        copied = values.double().cpu().numpy().reshape(len(self.copies), -1)
        if self.kinds is None:
            return copied.reshape(-1)
        other = adapter.reductions_to_flat(self.rest) if self.rest else np.zeros(0)
        assert self.widths is not None
        parts: list[np.ndarray] = []
        c = r = w = 0
        for is_copy in self.kinds:
            if is_copy:
                parts.append(copied[c])
                c += 1
            else:
                width = self.widths[w]
                parts.append(np.asarray(other[r:r + width], dtype=np.float64))
                r, w = r + width, w + 1
        return np.concatenate(parts) if parts else np.zeros(0)


class CopyRing:
    """Preallocated slots for recorded steps' tensors (see the module docstring): the recorder's
    per-tensor call copies a tensor into the current step's slot, :meth:`pack` closes the step.

    A slot belongs to the :class:`CopiedStep` made of it for as long as that step is alive: the
    recorder drops a step from its ring, or reads it (a dump, a step written at once), and its
    slot is free again. A step's slot is taken when the step before it is packed; there are two
    more slots than the ring's steps (the step just packed, before the ring drops its oldest,
    and the next), so one is free then. If none is (a dump waits), the step takes one at its
    first tensor, or reduces its tensors as they come: a kept step is never overwritten.

    Args:
        items: the canonical reductions kept of each tensor.
        ring_steps: how many steps the recorder's ring keeps.
        max_bytes: what the slots may take together; more and no ring is made.
        adapter: the PyTorch adapter (packs, reads and counts what is not copied).
        checked: the recorder checks each step for non-finite values (:meth:`CopiedStep.finite`):
            a full slot is summed as soon as its last copy is made. Read at each step's last
            copy (``self.checked``), so it may change between steps.
    """

    def __init__(self, items: list[tuple[str, bool]], ring_steps: int, max_bytes: int,
                 adapter: RecordingAdapter, checked: bool = True) -> None:
        self.reduce_copy = fused_reductions(items)
        self.slots = ring_steps + 2
        self.max_bytes = max_bytes
        self.adapter = adapter
        self.checked = checked
        self.nbytes = 0  # the slots' bytes, once made
        #: (shape, device) of the first recorded step's tensors, until the slots are made
        self._learning: list[tuple[torch.Size, torch.device]] | None = []
        self._learned_all = True  # every tensor of that step could be copied
        self.views: list[torch.Tensor] = []  # the current slot's, one per position
        self._shapes: list[torch.Size] = []  # the layout's, one per position
        self.position = 0  # tensors copied so far this step
        self._slot_views: list[list[torch.Tensor]] = []
        self._flats: list[torch.Tensor] = []
        self._ends: list[int] = []  # where each position's copy ends in a slot
        self._owners: list[Callable[[], CopiedStep | None] | None] = []  # weak, per slot
        self._slot = -1  # the current step's, or the last one taken
        self._total: torch.Tensor | None = None  # the current slot's sum, once it is full
        self._needs_slot = False  # the next tensor starts a step: take a free slot first
        self._mismatched = False  # this step stopped copying at a tensor the layout did not have
        self._misses = 0
        self._copy_or_reduce: Callable[[Any], Any] = lambda t: None

    # -- each tensor ----------------------------------------------------------------------------
    def reducer(self, fallback: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """The recorder's per-tensor call: a copy into the current slot (a view of it is the
        handle) when the tensor matches the layout at its position, else ``fallback(value)``
        (the reductions, computed now). Runs for every recorded tensor of every step, so the
        matching case is written out in one call.

        The copy that fills the slot is followed by the slot's sum, for the step's check: the
        same kernel costs about half as much here as at the step's end, after the optimizer's
        (measured on a CPU: 3.5-4 against 6-7 µs), and on an accelerator it is queued sooner."""
        plain, copied_dtypes = _PLAIN_TYPES, COPIED_DTYPES

        def copy_or_reduce(t: Any) -> Any:
            i = self.position
            views = self.views
            if i < len(views) and type(t) in plain and t.shape == self._shapes[i] and t.dtype in copied_dtypes:
                view = views[i]
                view.copy_(t.detach() if t.requires_grad else t)
                self.position = i = i + 1
                if i == len(views) and self.checked:
                    self._total = self._flats[self._slot].sum()
                return view
            return self._not_copied(t, fallback)

        self._copy_or_reduce = copy_or_reduce
        return copy_or_reduce

    def _not_copied(self, t: Any, fallback: Callable[[Any], Any]) -> Any:
        """A tensor the current slot did not take: the step's first when no slot was free at
        the last step's end (take one now and copy it), one while learning the layout (note
        it), or one the layout does not have (the rest of the step is reduced as it comes: the
        copies stay one prefix of the slot)."""
        if self._needs_slot:
            self._needs_slot = False
            if self._take_slot():
                return self._copy_or_reduce(t)
        result = fallback(t)
        learning = self._learning
        if learning is not None:
            if (self._learned_all and result is not None and type(t) in _PLAIN_TYPES
                    and t.dtype in COPIED_DTYPES and t.numel()):
                learning.append((t.shape, t.device))
            elif result is not None:
                self._learned_all = False  # the layout is the prefix learned so far
        elif self.views:
            self._mismatched = True
            self.views = []
        return result

    def _take_slot(self) -> bool:
        """Make a free slot the current step's (the one after the last taken, mostly)."""
        owners = self._owners
        for k in range(1, self.slots + 1):
            slot = (self._slot + k) % self.slots
            owner = owners[slot]
            if owner is None or owner() is None:
                self._slot, self.views = slot, self._slot_views[slot]
                return True
        self.views = []
        return False  # every slot is held by a kept step: reduced as they come, for now

    # -- each step ------------------------------------------------------------------------------
    def pack(self, started: list[Any]) -> list[Any]:
        """Close the step whose handles are ``started``: a :class:`CopiedStep` if it copied
        anything, else the adapter's packing of its reductions."""
        copied, self.position = self.position, 0
        total, self._total = self._total, None  # the slot's sum, if the step filled it
        self._misses = self._misses + 1 if self._mismatched else 0
        self._mismatched = False
        if self._learning is not None and started:
            self._make_slots(self._learning)
        if copied:
            packed: list[Any] = [self._copied_step(started, copied, total)]
        else:
            packed = self.adapter.pack_reductions(started) if started else started
        if self._misses >= MISSES_TO_STOP:
            self.release()  # after the step is made: it keeps its own views of its slot
        self._next_slot()
        return packed

    def _copied_step(self, started: list[Any], copied: int, total: torch.Tensor | None) -> CopiedStep:
        """The step whose first ``copied`` tensors are in the current slot, which it now owns."""
        slot = self._slot
        used = self._flats[slot] if copied == len(self._ends) else self._flats[slot][:self._ends[copied - 1]]
        if copied == len(started):
            step = CopiedStep(self, slot, started, used, [], total=total)
        else:
            kinds = [type(s) is torch.Tensor for s in started]
            others = [s for s, is_copy in zip(started, kinds) if not is_copy]
            step = CopiedStep(self, slot, [s for s, is_copy in zip(started, kinds) if is_copy], used,
                              self.adapter.pack_reductions(others), kinds, [_width(s) for s in others],
                              total)
        self._owners[slot] = weakref.ref(step)
        return step

    def _next_slot(self) -> None:
        """The next step's slot, if one is free now (else at its first tensor): mostly the one
        after the last, which the ring's oldest step just left."""
        self._needs_slot = bool(self._slot_views) and not self._take_slot()

    def check(self, step: CopiedStep) -> None:
        """Raise if ``step``'s slot is not its own (never expected: the ring would read another
        step's values)."""
        owner = self._owners[step.slot] if step.slot < len(self._owners) else None
        if owner is not None and owner() is not step:
            raise RuntimeError(f"flight recorder: copy slot {step.slot} of a kept step was reused")

    def release(self) -> None:
        """Make no more copies and drop the slots (steps still kept hold their own views)."""
        self._learning = None
        self._slot_views, self._flats, self.views, self.nbytes = [], [], [], 0
        self._needs_slot = False
        self._total = None

    def _make_slots(self, layout: list[tuple[torch.Size, torch.device]]) -> None:
        self._learning = None
        devices = {device for _, device in layout}
        sizes = [shape.numel() for shape, _ in layout]
        nbytes = sum(sizes) * 4 * self.slots
        if not layout or len(devices) > 1 or nbytes > self.max_bytes:
            return  # nothing to copy, several devices, or too big: every tensor reduced as it comes
        device = devices.pop()
        try:
            flats = [torch.empty(sum(sizes), dtype=torch.float32, device=device) for _ in range(self.slots)]
        except RuntimeError:  # out of device memory: reduce as before
            return
        self._flats = flats
        self._slot_views = [[v.view(shape) for v, (shape, _) in zip(flat.split(sizes), layout)]
                            for flat in flats]
        self._ends = np.cumsum(sizes).tolist()
        self._shapes = [shape for shape, _ in layout]
        self._owners = [None] * self.slots
        self.nbytes = nbytes


def _width(handle: Any) -> int:
    """How many reductions a reducer's handle holds."""
    return len(handle.names) if type(handle) is DeviceReductions else len(handle)
