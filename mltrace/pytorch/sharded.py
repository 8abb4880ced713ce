"""Sharded tensors (``torch.distributed.tensor.DTensor``, as FSDP2's ``fully_shard`` leaves
parameters and gradients): the full tensor on one rank, and reductions of the global tensor.

A rank of a sharded job holds only its shard, so neither saving nor reducing its local tensor
says anything about the tensor the user wrote in the model. This module gives both views of the
global tensor, moving as little as it can between ranks:

* :func:`gather_full` sends every shard to one rank (a gather, not an all-gather), so only the
  rank that writes receives the tensor's bytes;
* :func:`sharded_reductions` computes each rank's partial sums, extremes and products of its
  shard and combines them with a few all-reduces of float64 scalars, never moving the tensor.

Both are collectives: all ranks of the tensor's device mesh must call them, with the same
arguments, in the same order. :func:`bytes_moved` counts what this process sent to other
ranks, so a configuration that saves raw tensors can be compared with one that saves reductions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def bytes_moved() -> int:
    """Bytes this process sent to other ranks through this module since the last reset.

    Counted as if every collective went point to point, whatever algorithm the backend picks:
    a gather sends the (padded) local shard once, to ``dst``, and nothing from ``dst`` itself;
    an all-gather or all-reduce sends the local buffer to each of the other ranks that take part.
    The sum over ranks is the traffic of a configuration; it is meant for comparing
    configurations (raw tensors against reductions), not for measuring the wire.
    """
    return _bytes_moved


def reset_bytes_moved() -> None:
    """Set :func:`bytes_moved` back to zero (e.g. before the step a benchmark measures)."""
    global _bytes_moved
    _bytes_moved = 0


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

    Each rank reduces its own shard to a few float64 partials (sums, counts, extremes, products),
    which are combined with at most four all-reduces over the mesh: sums, minima (maxima
    as negated minima), products, and, for std and variance, the sum of squared deviations from
    the global mean (a second round, which keeps them accurate when the mean is large). Only those
    scalars move between ranks. Every rank gets the results.

    Falls back to gathering the full tensor on every rank (``full_tensor()``) where shards cannot
    be combined: ``median`` (no exact combination of shard medians exists), partial placements
    (pending sums, not values), and a mesh of more than one dimension that covers only some of
    the job's ranks (no process group holds exactly its ranks).

    Raises:
        mltrace.exceptions.MltraceTypeError: a quantized tensor (as ``torch_reductions``).
        mltrace.exceptions.MltraceValueError: an unknown reduction name.
    """
    if value.numel() == 0:
        return [None] * len(items)
    names = [canonical_name(name) for name, _ in items]
    if all(p.is_replicate() for p in value.placements):  # every rank holds it all: no traffic
        return torch_reductions(value.to_local(), items)
    group = _reduction_group(value)
    if "median" in names or group is None:
        return torch_reductions(_full_everywhere(value), items)
    local = value.to_local()
    if local.is_quantized:
        raise MltraceTypeError(f"cannot reduce a quantized tensor ({local.dtype}); save "
                               "tensor.dequantize() instead")
    # Partials in float64: exact for every float dtype torch_reductions reduces in (float32 at
    # most), and the dtype it reduces ints and bools in.
    shard = local.detach().reshape(-1).double() if _owns_shard(value) else local.new_empty(
        0, dtype=torch.float64)
    values = _global_values(shard, set(names), value.numel(), group)
    work = _work_dtype(local)
    return [_as_reference(values[name, abs_], name, work) for name, (_, abs_) in zip(names, items)]


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


def _global_values(shard: torch.Tensor, names: set[str], count: int,
                   group: dist.ProcessGroup) -> dict[tuple[str, bool], float]:
    """Reductions ``names`` of the global tensor, plain and of the absolute value, keyed by
    (name, abs), from this rank's float64 ``shard``; ``count`` is the global number of elements.

    One all-reduce per kind of partial, each only if a name needs it: sums (also the base of
    std and variance), minima (maxima ride along negated), products, and squared deviations
    from the global mean (after the sums, as they need the mean).
    """
    out: dict[tuple[str, bool], float] = {}
    sums = [0.0] * 6
    if names & (_SUM_NAMES | _STD_NAMES):
        sums = _all_reduce(_local_sums(shard, names), dist.ReduceOp.SUM, group)
        out.update({(n, a): _from_sums(sums, n, a, count) for n in _SUM_NAMES for a in (False, True)})
    if names & {"min", "max"}:
        lows = _all_reduce(_local_extremes(shard), dist.ReduceOp.MIN, group)
        nan = lows[4] < 0  # any rank held a NaN: NaN, as torch.min and torch.max propagate it
        for a in (False, True):
            out["min", a] = math.nan if nan else lows[int(a)]
            out["max", a] = math.nan if nan else -lows[2 + int(a)]
    if "prod" in names:
        products = _all_reduce(_local_products(shard), dist.ReduceOp.PRODUCT, group)
        out.update({("prod", a): products[int(a)] for a in (False, True)})
    if names & _STD_NAMES:
        means = [sums[0] / count, sums[1] / count]
        squares = _all_reduce(_local_squared_deviations(shard, means), dist.ReduceOp.SUM, group)
        for a in (False, True):
            out["variance", a] = squares[int(a)] / count
            out["std", a] = math.sqrt(out["variance", a])
    return out


def _from_sums(sums: Sequence[float], name: str, abs_: bool, count: int) -> float:
    """A reduction from the all-reduced partials of :func:`_local_sums`."""
    total, total_abs, squares, nans, infs, zeros = sums
    if name in ("mean", "sum"):
        s = total_abs if abs_ else total
        return s / count if name == "mean" else s
    return {"l1": total_abs, "l2": math.sqrt(squares), "nan_count": nans, "inf_count": infs,
            "zero_fraction": zeros / count}[name]


#: Which partial of :func:`_local_sums` each reduction needs (by position).
_SUM_PARTIALS = {"mean": (0, 1), "sum": (0, 1), "std": (0, 1), "variance": (0, 1), "l1": (1,),
                 "l2": (2,), "nan_count": (3,), "inf_count": (4,), "zero_fraction": (5,)}


def _local_sums(shard: torch.Tensor, names: set[str]) -> torch.Tensor:
    """sum(x), sum(|x|), sum(|x|**2), and counts of NaN, inf and zero elements, of the shard;
    a partial no reduction in ``names`` needs is left 0 (not computed: each is a pass over the
    shard)."""
    needed = {i for n in names for i in _SUM_PARTIALS.get(n, ())}
    parts = [
        (lambda: shard.sum()), (lambda: shard.abs().sum()), (lambda: shard.abs().square().sum()),
        (lambda: shard.isnan().sum()), (lambda: shard.isinf().sum()), (lambda: (shard == 0).sum()),
    ]
    zero = torch.zeros((), dtype=torch.float64, device=shard.device)
    return torch.stack([part().double() if i in needed else zero for i, part in enumerate(parts)])


def _local_extremes(shard: torch.Tensor) -> torch.Tensor:
    """min(x), min(|x|), -max(x), -max(|x|) (maxima negated to share a MIN all-reduce), and -1 if
    the shard holds a NaN (a backend's MIN need not propagate NaN; gloo's does not), else 0. An
    empty shard gives +inf, which no minimum keeps."""
    if shard.numel() == 0:
        return torch.tensor([math.inf] * 4 + [0.0], dtype=torch.float64, device=shard.device)
    magnitude = shard.abs()
    return torch.stack([shard.min(), magnitude.min(), -shard.max(), -magnitude.max(),
                        -shard.isnan().any().double()])


def _local_products(shard: torch.Tensor) -> torch.Tensor:
    """prod(x) and prod(|x|) of the shard (1 for an empty shard)."""
    return torch.stack([shard.prod(), shard.abs().prod()])


def _local_squared_deviations(shard: torch.Tensor, means: Sequence[float]) -> torch.Tensor:
    """sum((x - mean)**2) and sum((|x| - mean_abs)**2) of the shard, for the global means."""
    return torch.stack([(shard - means[0]).square().sum(),
                        (shard.abs() - means[1]).square().sum()])


def _all_reduce(partials: torch.Tensor, op: dist.ReduceOp.RedOpType,
                group: dist.ProcessGroup) -> list[float]:
    """``partials`` (float64) combined over ``group`` with ``op``, counted in bytes_moved."""
    dist.all_reduce(partials, op=op, group=group)
    _count(partials.numel() * partials.element_size() * (dist.get_world_size(group) - 1))
    return [float(x) for x in partials.tolist()]
