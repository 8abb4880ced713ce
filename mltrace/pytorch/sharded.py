"""Sharded tensors (``torch.distributed.tensor.DTensor``, as FSDP2's ``fully_shard`` leaves
parameters and gradients): the full tensor on one rank, and reductions of the global tensor.

A rank of a sharded job holds only its shard, so neither saving nor reducing its local tensor
says anything about the tensor the user wrote in the model. This module gives both views of the
global tensor, moving as little as it can between ranks:

* :func:`gather_full` sends every shard to one rank (a gather, not an all-gather), so only the
  rank that writes receives the tensor's bytes;
* :class:`ReductionBatch` (and :func:`sharded_reductions`, a batch of one) computes each rank's
  partial sums, extremes and products of its shards and combines those of many tensors with a
  few all-reduces of float64 scalars, never moving the tensors.

Both are collectives: all ranks of the tensor's device mesh must call them, with the same
arguments, in the same order. :func:`bytes_moved` counts what this process sent to other
ranks, so a configuration that saves raw tensors can be compared with one that saves reductions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from mltrace.capture.adapter import ReductionItems
from mltrace.exceptions import MltraceTypeError
from mltrace.pytorch.reductions import torch_reductions
from mltrace.reductions import canonical_name

try:  # torch built without distributed support has no DTensor: nothing can be sharded then
    from torch.distributed.tensor import DTensor, Shard
except ImportError:
    DTENSOR_AVAILABLE = False
else:
    DTENSOR_AVAILABLE = True

_bytes_moved = 0
_collectives = 0


def bytes_moved() -> int:
    """Bytes this process sent to other ranks through this module since the last reset.

    Counted as if every collective went point to point, whatever algorithm the backend picks:
    a gather sends the (padded) local shard once, to ``dst``, and nothing from ``dst`` itself;
    an all-gather or all-reduce sends the local buffer to each of the other ranks that take part.
    The sum over ranks is the traffic of a configuration; it is meant for comparing
    configurations (raw tensors against reductions), not for measuring the wire.
    """
    return _bytes_moved


def collectives_issued() -> int:
    """All-reduces this process started through this module since the last reset (a gather's
    collectives are not counted): what a batch of reductions costs in latency-bound calls."""
    return _collectives


def reset_bytes_moved() -> None:
    """Set :func:`bytes_moved` and :func:`collectives_issued` back to zero (e.g. before the step
    a benchmark measures)."""
    global _bytes_moved, _collectives
    _bytes_moved = _collectives = 0


def _count(nbytes: int) -> None:
    global _bytes_moved
    _bytes_moved += nbytes


def is_sharded(value: object) -> bool:
    """True for a DTensor: a tensor whose values are spread over the ranks of a device mesh,
    which must be gathered or reduced collectively rather than read on one rank."""
    return DTENSOR_AVAILABLE and isinstance(value, DTensor)


# -- the full tensor ------------------------------------------------------------------------------
@torch.no_grad()
def gather_full(value: DTensor, dst: int | None) -> torch.Tensor | None:
    """The full tensor (global shape, a plain torch.Tensor on the local device), for saving it.

    Args:
        value: the sharded tensor; every rank of its device mesh must call this (a collective).
        dst: the global rank that receives the tensor (the others get None), or None for all.

    With ``dst`` set and the layout FSDP2 uses (a 1-D mesh, rows sharded as ``torch.chunk``
    splits them, possibly unevenly), the shards are gathered to ``dst`` alone, so the other ranks
    receive nothing. Any other layout falls back to ``DTensor.full_tensor()`` on every rank (each
    receives the whole tensor) and returns it on ``dst`` only.
    """
    if dst is not None and _rows_on_1d_mesh(value):
        return _gather_rows(value, dst)
    full = value.full_tensor()
    _count(_local_bytes(value) * (_sharing_ranks(value) - 1))
    return full if dst is None or dist.get_rank() == dst else None


def _rows_on_1d_mesh(value: DTensor) -> bool:
    """True for FSDP2's layout: a 1-D mesh and the tensor's rows split over it (``Shard(0)``;
    strided shards of 2-D parallelism are a subclass and do not qualify)."""
    placements = value.placements
    return (value.device_mesh.ndim == 1 and len(placements) == 1
            and type(placements[0]) is Shard and placements[0].dim == 0)


def _gather_rows(value: DTensor, dst: int) -> torch.Tensor | None:
    """Gather row shards to ``dst``: each rank pads its shard to the largest shard's rows (a
    gather needs one size), and ``dst`` trims the padding and stacks shards in mesh order."""
    mesh, rows = value.device_mesh, value.shape[0]
    size = mesh.size()
    chunk = -(-rows // size)  # torch.chunk's rows per rank; the last ranks may get fewer or none
    local = value.to_local().detach()
    if chunk == 0:  # no rows anywhere: nothing to move
        return local.clone() if dist.get_rank() == dst else None
    padded = _pad_rows(local, chunk)
    group = mesh.get_group()
    receiving = dist.get_rank() == dst
    bucket = [torch.empty_like(padded) for _ in range(size)] if receiving else None
    dist.gather(padded, bucket, dst=dst, group=group)
    if not receiving:
        _count(padded.numel() * padded.element_size())
        return None
    assert bucket is not None
    by_rank = {dist.get_global_rank(group, i): shard for i, shard in enumerate(bucket)}
    in_mesh_order = mesh.mesh.reshape(-1).tolist()
    pieces = [by_rank[r][:_rows_at(rows, chunk, c)] for c, r in enumerate(in_mesh_order)]
    return torch.cat(pieces)


def _pad_rows(local: torch.Tensor, rows: int) -> torch.Tensor:
    """``local`` with ``rows`` rows (contiguous, as collectives need); added rows are zeros."""
    if local.shape[0] == rows:
        return local.contiguous()
    padded = local.new_zeros((rows, *local.shape[1:]))
    padded[: local.shape[0]] = local
    return padded


def _rows_at(rows: int, chunk: int, coordinate: int) -> int:
    """Rows that ``torch.chunk`` gives the rank at ``coordinate`` of the mesh."""
    return max(0, min(chunk, rows - coordinate * chunk))


def _local_bytes(value: DTensor) -> int:
    local = value.to_local()
    return local.numel() * local.element_size()


def _sharing_ranks(value: DTensor) -> int:
    """Ranks that exchange pieces of ``value`` when it is made whole: the product of the sizes of
    the mesh dimensions it is sharded or partial on (replicated dimensions exchange nothing)."""
    mesh = value.device_mesh
    return math.prod(mesh.size(d) for d, p in enumerate(value.placements) if not p.is_replicate())


# -- reductions -----------------------------------------------------------------------------------
@torch.no_grad()
def sharded_reductions(value: DTensor, items: ReductionItems) -> list[np.ndarray | None]:
    """Reductions ``items`` of the global tensor, as ``torch_reductions`` of the full tensor
    gives them (same definitions and dtypes, to float rounding), without gathering it.

    A :class:`ReductionBatch` of one tensor: see there for how shards are combined, and use a
    batch to reduce several tensors with the same few collectives.

    Raises:
        mltrace.exceptions.MltraceTypeError: a quantized tensor (as ``torch_reductions``).
        mltrace.exceptions.MltraceValueError: an unknown reduction name.
    """
    batch = ReductionBatch()
    batch.add(value, items)
    return batch.combine()[0]


@dataclass
class _Partials:
    """One tensor's part of a batch: this rank's float64 partials of its shard (on the shard's
    device), or the results already known when nothing needs combining."""

    names: list[str]
    items: ReductionItems
    count: int  # elements of the global tensor
    work: torch.dtype
    group: dist.ProcessGroup | None = None
    local_count: int = 0  # elements this rank contributes (0 on a replica that is not counted)
    sums: torch.Tensor | None = None  # _local_sums
    extremes: torch.Tensor | None = None  # _local_extremes, if min or max is asked for
    products: torch.Tensor | None = None  # _local_products, if prod is asked for
    ready: list[np.ndarray | None] | None = None


class ReductionBatch:
    """Reductions of several sharded tensors, combined across ranks with one all-reduce per kind
    of partial for the whole batch instead of a few per tensor.

    :meth:`add` reduces this rank's shard of a tensor to a few float64 partials on the shard's
    device (sums, counts, extremes, products, the local sum of squared deviations) and keeps
    them; nothing is synchronised or copied to the host. :meth:`combine` then stacks the
    partials of every tensor in the batch and all-reduces them per mesh: one SUM, one MIN (maxima
    ride along negated), one PRODUCT, and for std and variance a second SUM of each rank's
    deviation from the global mean (Chan et al.'s pairwise combination, accurate when the mean is
    large), each only if a tensor asks for it. The results come to the host in one copy per
    all-reduce. A training step that saves reductions of every gradient of an FSDP2 model thus
    pays at most four small collectives, not four per gradient.

    Both methods are collectives in effect: every rank of each tensor's mesh must add the same
    tensors, with the same items, in the same order, and call :meth:`combine` at the same point.

    Tensors whose shards cannot be combined are reduced when added, by gathering the full tensor
    on every rank (``full_tensor()``, a collective then and there): ``median`` (no exact
    combination of shard medians exists), partial placements (pending sums, not values), and a
    mesh of more than one dimension that covers only some of the job's ranks (no process group
    holds exactly its ranks). A replicated tensor is whole on every rank and moves nothing.
    """

    def __init__(self) -> None:
        self._entries: list[_Partials] = []

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop what was added without combining it (the process group is gone)."""
        self._entries.clear()

    @torch.no_grad()
    def add(self, value: DTensor, items: ReductionItems) -> None:
        """Add the reductions ``items`` of ``value`` to the batch (results come from combine).

        Raises:
            mltrace.exceptions.MltraceTypeError: a quantized tensor (as ``torch_reductions``).
            mltrace.exceptions.MltraceValueError: an unknown reduction name.
        """
        names = [canonical_name(name) for name, _ in items]
        local = value.to_local()
        entry = _Partials(names, list(items), value.numel(), _work_dtype(local))
        self._entries.append(entry)
        if value.numel() == 0:
            entry.ready = [None] * len(items)
            return
        if all(p.is_replicate() for p in value.placements):  # every rank holds it all: no traffic
            entry.ready = torch_reductions(local, items)
            return
        entry.group = _reduction_group(value)
        if "median" in names or entry.group is None:
            entry.ready = torch_reductions(_full_everywhere(value), items)
            return
        if local.is_quantized:
            self._entries.pop()
            raise MltraceTypeError(f"cannot reduce a quantized tensor ({local.dtype}); save "
                                   "tensor.dequantize() instead")
        # The shard in the dtype torch_reductions reduces in (no copy for float32 and float64);
        # the partials accumulate in float64.
        shard = local.detach().reshape(-1)
        if not _owns_shard(value):
            shard = shard[:0]
        if shard.dtype != entry.work:
            shard = shard.to(entry.work)
        wanted = set(names)
        entry.local_count = shard.numel()
        entry.sums = _local_sums(shard, wanted)
        if wanted & {"min", "max"}:
            entry.extremes = _local_extremes(shard)
        if "prod" in wanted:
            entry.products = _local_products(shard)

    @torch.no_grad()
    def combine(self) -> list[list[np.ndarray | None]]:
        """The reductions of every tensor added, in the order added; the batch is then empty."""
        entries, self._entries = self._entries, []
        by_group: dict[int, list[_Partials]] = {}
        for entry in entries:
            if entry.ready is None:
                by_group.setdefault(id(entry.group), []).append(entry)
        for members in by_group.values():
            _combine_group(members)
        return [entry.ready if entry.ready is not None else [None] * len(entry.items)
                for entry in entries]


def _combine_group(members: list[_Partials]) -> None:
    """Combine the partials of tensors sharded over one process group and set their results."""
    group = members[0].group
    assert group is not None
    local = torch.stack([m.sums for m in members if m.sums is not None])  # every member's
    device = local.device
    sums = local[:, :6].clone()  # all-reduced in place: a copy, local keeps this rank's
    pending = [_all_reduce_async(sums, dist.ReduceOp.SUM, group)]
    lows = products = None
    if any(m.extremes is not None for m in members):
        none = torch.tensor([math.inf] * 4 + [0.0], dtype=torch.float64, device=device)
        lows = torch.stack([none if m.extremes is None else m.extremes for m in members])
        pending.append(_all_reduce_async(lows, dist.ReduceOp.MIN, group))
    if any(m.products is not None for m in members):
        one = torch.ones(2, dtype=torch.float64, device=device)
        products = torch.stack([one if m.products is None else m.products for m in members])
        pending.append(_all_reduce_async(products, dist.ReduceOp.PRODUCT, group))
    for work in pending:
        work.wait()
    deviations = None
    if any(set(m.names) & _STD_NAMES for m in members):
        deviations = _deviations(members, local, sums, group)
    values = _to_host(sums, lows, products, deviations)
    for i, member in enumerate(members):
        member.ready = _results(member, [v[i] if v is not None else None for v in values])


def _deviations(members: list[_Partials], local: torch.Tensor, global_sums: torch.Tensor,
                group: dist.ProcessGroup) -> torch.Tensor:
    """Each tensor's sum of squared deviations from its global mean, of x and of |x|, combined
    over ``group``: every rank adds its local one (columns 6 and 7 of its stacked partials
    ``local``, about its own mean) and ``n_i * (mean_i - mean)**2`` (Chan et al.), then one SUM all-reduce."""
    device = global_sums.device
    counts = torch.tensor([float(m.count) for m in members], dtype=torch.float64, device=device)
    local_counts = torch.tensor([float(m.local_count) for m in members], dtype=torch.float64,
                                device=device)
    global_means = global_sums[:, 0:2] / counts[:, None]
    local_means = local[:, 0:2] / local_counts.clamp(min=1.0)[:, None]
    between = local_counts[:, None] * (local_means - global_means).square()
    deviations = local[:, 6:8] + between
    _all_reduce_async(deviations, dist.ReduceOp.SUM, group).wait()
    return deviations


def _to_host(*tensors: torch.Tensor | None) -> list[list[list[float]] | None]:
    """The combined partials on the host: one device-to-host copy per all-reduced tensor."""
    return [None if t is None else t.tolist() for t in tensors]


def _results(entry: _Partials, values: list[list[float] | None]) -> list[np.ndarray | None]:
    """The reductions of one tensor from its combined partials (rows of :func:`_combine_group`)."""
    sums, lows, products, deviations = values
    assert sums is not None
    out: dict[tuple[str, bool], float] = {}
    count = entry.count
    for a in (False, True):
        for name in _SUM_NAMES:
            out[name, a] = _from_sums(sums, name, a, count)
        if lows is not None:
            nan = lows[4] < 0  # any rank held a NaN: NaN, as torch.min and torch.max propagate it
            out["min", a] = math.nan if nan else lows[int(a)]
            out["max", a] = math.nan if nan else -lows[2 + int(a)]
        if products is not None:
            out["prod", a] = products[int(a)]
        if deviations is not None:
            out["variance", a] = deviations[int(a)] / count
            out["std", a] = math.sqrt(out["variance", a])
    return [_as_reference(out[name, abs_], name, entry.work)
            for name, (_, abs_) in zip(entry.names, entry.items)]


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype ``torch_reductions`` reduces ``t`` in: float64 for ints and bools, float32 for
    16- and 8-bit floats, the tensor's own otherwise."""
    if not t.is_floating_point():
        return torch.float64
    if t.dtype in (torch.float16, torch.bfloat16) or t.element_size() == 1:
        return torch.float32
    return t.dtype


def _as_reference(value: float, name: str, work: torch.dtype) -> np.ndarray:
    """A combined value as ``torch_reductions`` returns it: counts as int64, the rest as float64
    rounded to ``work`` first (the precision the reference computes in; zero_fraction is always
    computed in float64)."""
    if name in _COUNTS:
        return np.asarray(np.int64(value))
    if name != "zero_fraction":
        value = torch.tensor(value, dtype=torch.float64).to(work).item()
    return np.asarray(np.float64(value))


def _full_everywhere(value: DTensor) -> torch.Tensor:
    full = gather_full(value, None)
    assert full is not None
    return full


def _reduction_group(value: DTensor) -> dist.ProcessGroup | None:
    """The process group of the mesh's ranks, or None where shards cannot be combined (a partial
    placement, or a multi-dimensional mesh over only some of the job's ranks)."""
    mesh = value.device_mesh
    if any(p.is_partial() for p in value.placements):
        return None
    if mesh.ndim == 1:
        return mesh.get_group()
    return dist.group.WORLD if mesh.size() == dist.get_world_size() else None


def _owns_shard(value: DTensor) -> bool:
    """True on the one rank of each replica set that contributes its shard (coordinate 0 on every
    replicated mesh dimension), so replicated shards are counted once."""
    coordinate = value.device_mesh.get_coordinate()
    if coordinate is None:  # this rank is not in the mesh: it holds nothing
        return False
    return all(c == 0 for c, p in zip(coordinate, value.placements) if p.is_replicate())


_COUNTS = ("nan_count", "inf_count")
_STD_NAMES = frozenset({"std", "variance"})
_SUM_NAMES = frozenset({"mean", "sum", "l1", "l2", "nan_count", "inf_count", "zero_fraction"})


def _from_sums(sums: Sequence[float], name: str, abs_: bool, count: int) -> float:
    """A reduction from the all-reduced partials of :func:`_local_sums`."""
    total, total_abs, squares, nans, infs, zeros = sums[:6]
    if name in ("mean", "sum"):
        s = total_abs if abs_ else total
        return s / count if name == "mean" else s
    return {"l1": total_abs, "l2": math.sqrt(squares), "nan_count": nans, "inf_count": infs,
            "zero_fraction": zeros / count}[name]


#: Which partial of :func:`_local_sums` each reduction needs (by position).
_SUM_PARTIALS = {"mean": (0, 1), "sum": (0, 1), "std": (0, 1, 6, 7), "variance": (0, 1, 6, 7),
                 "l1": (1,), "l2": (2,), "nan_count": (3,), "inf_count": (4,), "zero_fraction": (5,)}


def _local_sums(shard: torch.Tensor, names: set[str]) -> torch.Tensor:
    """sum(x), sum(|x|), sum(|x|**2), counts of NaN, inf and zero elements, and the sums of
    squared deviations of x and |x| from the shard's own means, of the shard; a partial no
    reduction in ``names`` needs is left 0 (not computed: each is a pass over the shard). The
    last two stay on this rank (see :func:`_deviations`); the first six are all-reduced."""
    needed = {i for n in names for i in _SUM_PARTIALS.get(n, ())}
    n = max(shard.numel(), 1)
    f64 = torch.float64

    def deviations(x: torch.Tensor) -> torch.Tensor:  # about the shard's own mean
        return (x - x.sum(dtype=f64).to(x.dtype) / n).square().sum(dtype=f64)

    parts = [
        (lambda: shard.sum(dtype=f64)), (lambda: shard.abs().sum(dtype=f64)),
        (lambda: torch.linalg.vector_norm(shard, dtype=f64).square()),
        (lambda: shard.isnan().sum()), (lambda: shard.isinf().sum()), (lambda: (shard == 0).sum()),
        (lambda: deviations(shard)), (lambda: deviations(shard.abs())),
    ]
    zero = torch.zeros((), dtype=f64, device=shard.device)
    return torch.stack([part().to(f64) if i in needed else zero for i, part in enumerate(parts)])


def _local_extremes(shard: torch.Tensor) -> torch.Tensor:
    """min(x), min(|x|), -max(x), -max(|x|) (maxima negated to share a MIN all-reduce), and -1 if
    the shard holds a NaN (a backend's MIN need not propagate NaN; gloo's does not), else 0. An
    empty shard gives +inf, which no minimum keeps."""
    if shard.numel() == 0:
        return torch.tensor([math.inf] * 4 + [0.0], dtype=torch.float64, device=shard.device)
    magnitude = shard.abs()
    return torch.stack([shard.min(), magnitude.min(), -shard.max(), -magnitude.max(),
                        -shard.isnan().any().to(shard.dtype)]).double()


def _local_products(shard: torch.Tensor) -> torch.Tensor:
    """prod(x) and prod(|x|) of the shard (1 for an empty shard), multiplied in float64."""
    return torch.stack([shard.prod(dtype=torch.float64), shard.abs().prod(dtype=torch.float64)])


def _all_reduce_async(partials: torch.Tensor, op: dist.ReduceOp.RedOpType,
                      group: dist.ProcessGroup) -> Any:
    """Start combining ``partials`` (float64, in place) over ``group`` with ``op``; returns the
    work to wait on. Counted in bytes_moved and collectives_issued."""
    global _collectives
    work = dist.all_reduce(partials, op=op, group=group, async_op=True)
    _count(partials.numel() * partials.element_size() * (dist.get_world_size(group) - 1))
    _collectives += 1
    return work
