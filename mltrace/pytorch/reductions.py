"""mltrace.reductions' definitions computed with torch ops on the tensor's own device.

:func:`start_reductions` leaves the results on the device (:class:`DeviceReductions`), so that a
step's reductions of many tensors can be moved to the host in one copy; :func:`torch_reductions`
is the same for one tensor, moved at once.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mltrace.capture.adapter import ReductionItems
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.reductions import COUNT_REDUCTIONS, canonical_name


@dataclass(slots=True)
class DeviceReductions:
    """The reductions of one tensor, computed on its device and not yet on the host: one 0-d
    tensor per item, stacked together with the step's others when they are moved (one stack
    per step instead of one per tensor: each op costs microseconds of CPU)."""

    names: list[str]  # canonical reduction names, one per item
    parts: list[torch.Tensor]  # 0-d tensors on the tensor's device, one per item
    stacked: torch.Tensor | None = None  # or all of them in one 1-d tensor (packed)

    @property
    def device(self) -> torch.device:
        """Where the results are."""
        return self.stacked.device if self.stacked is not None else self.parts[0].device

    @property
    def values(self) -> torch.Tensor:
        """The results as one float64 tensor on the device."""
        return stack_parts([self])

    def results(self, host: np.ndarray) -> list[np.ndarray | None]:
        """The results as ``torch_reductions`` returns them, from ``values`` copied to the host
        (counts as int64, the rest float64)."""
        return [np.asarray(np.int64(h) if n in COUNT_REDUCTIONS else h) for n, h in zip(self.names, host)]


@dataclass(slots=True)
class HostReductions:
    """A step's reductions of CPU tensors, read as floats when the step is packed
    (:func:`read_on_cpu`)."""

    values: array  # float64, in the order of the step's handles and their items


def read_on_cpu(started: list[Any]) -> HostReductions | None:
    """``started`` (DeviceReductions fresh from the reducer) read into one float64 array, if the
    first is on the CPU; else None (also for packed handles, which have no parts). On a CPU the
    results exist already: reading each 0-d tensor as a float costs about half of stacking them
    (one op that allocates), measured in place at the end of a training step (the flight
    recorder packs every step)."""
    # Asking every handle its type and device costs about as much as reading the values, so
    # only the first is asked where the values are: a part on another device reads right too,
    # just not as fast. A handle without parts (not DeviceReductions) stops the reading.
    first = started[0] if started else None
    if type(first) is not DeviceReductions or not first.parts or not first.parts[0].is_cpu:
        return None
    try:
        return HostReductions(array("d", [p.item() for s in started for p in s.parts]))
    except AttributeError:
        return None


def torch_reductions(value: torch.Tensor, items: ReductionItems) -> list[np.ndarray | None]:
    """mltrace.reductions' definitions computed with torch ops on ``value``'s device; one
    device-to-host copy of the results."""
    started = start_reductions(value, items)
    if isinstance(started, list):
        return started
    return started.results(started.values.cpu().numpy())


def stack_parts(started: list[DeviceReductions], float64: bool = True) -> torch.Tensor:
    """The results of ``started``, in order, as one tensor on their device (float64, or the
    promoted dtype of the parts when not ``float64``).

    Raises:
        RuntimeError: they are on several devices (torch refuses to stack them).
    """
    if all(s.stacked is None for s in started):
        values = torch.stack([p for s in started for p in s.parts])  # dtypes promoted
    else:
        values = torch.cat([s.stacked if s.stacked is not None else torch.stack(s.parts)
                            for s in started])
    return values.double() if float64 and values.dtype != torch.float64 else values


def start_reductions(value: torch.Tensor, items: ReductionItems) -> DeviceReductions | list[np.ndarray | None]:
    """The reductions ``items`` of ``value`` computed on its device (nothing waits for them),
    or a None per item for an empty tensor (no reduction has a value then)."""
    if value.numel() == 0:
        return [None] * len(items)
    if value.is_quantized:
        raise MltraceTypeError(f"cannot reduce a quantized tensor ({value.dtype}); save "
                               "tensor.dequantize() instead")
    t = value.detach().reshape(-1)
    if not t.is_floating_point():
        t = t.double()  # ints and bools reduce in float64, as numpy's definition here says
    elif t.dtype in (torch.float16, torch.bfloat16) or t.element_size() == 1:
        t = t.float()  # float8 too: torch has few operators for it
    key = tuple(items)
    canonical = _CANONICAL.get(key)
    if canonical is None:
        canonical = _CANONICAL[key] = [(canonical_name(name), abs_) for name, abs_ in items]
    return DeviceReductions([n for n, _ in canonical], fused_reductions(canonical)(t))


_CANONICAL: dict[tuple[tuple[str, bool], ...], list[tuple[str, bool]]] = {}
#: Up to this many elements torch's one-pass std_mean is the cheaper way to a std on a CPU; above
#: it the two-pass mean, subtraction and norm (vectorized kernels) are several times faster there.
#: On an accelerator std_mean is one kernel launch instead of four, at any size.
_ONE_PASS_STD_LIMIT = 512


def fused_reductions(items: list[tuple[str, bool]]) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """A function computing the canonical reductions ``items`` of a tensor (any shape; float)
    as 0-d tensors (counts in float64, the rest in the tensor's dtype), decided once per list
    of items (each call is on the training thread; each kernel launch and each line of Python
    costs microseconds, which is most of a small tensor's reduction time). A pair asked together
    is one kernel where torch has one (min and max: aminmax; a std or variance comes with the
    mean), and ``|t|`` is computed once for all the absolute ones."""
    key = tuple(items)
    found = _PLANS.get(key)
    if found is None:
        found = _PLANS[key] = _fused(items, None)
    return found


def recorder_reductions(items: list[tuple[str, bool]], other: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The flight recorder's per-tensor call, in one Python call for the common value: a
    non-empty plain tensor of a float dtype torch reduces directly (float32, float64; float16
    and bfloat16 upcast) gets :func:`fused_reductions`' reductions of the canonical ``items``
    as DeviceReductions; any other value gets ``other(value)``. One call instead of a checking
    call and a reducing call: each costs about a microsecond in place, for every recorded
    tensor of every step. Min and max alone: see :func:`_recorder_min_max` (any dtype torch
    has an ``aminmax`` for)."""
    return _fused(items, other)


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_DIRECT = (torch.float32, torch.float64)
_UPCAST = (torch.float16, torch.bfloat16)


def _fused(items: list[tuple[str, bool]], other: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """:func:`fused_reductions` (``other`` None: the results as a list), or
    :func:`recorder_reductions`."""
    names = [name for name, _ in items]
    index = {item: i for i, item in enumerate(items)}
    # per absolute-or-not: where min/max go (one aminmax), where std/mean/variance go (one
    # std_mean, or mean + norm of the centred values); the rest one op each
    groups: list[tuple[bool, tuple[int, int] | None, tuple[int | None, int | None, int | None] | None,
                       list[tuple[int, str]]]] = []
    for abs_ in (False, True):
        if not any(a == abs_ for _, a in items):
            continue
        minmax = (index[("min", abs_)], index[("max", abs_)]) if (
            ("min", abs_) in index and ("max", abs_) in index) else None
        spread: tuple[int | None, int | None, int | None] | None = (
            index.get(("std", abs_)), index.get(("mean", abs_)), index.get(("variance", abs_)))
        if spread is not None and spread[0] is None and spread[2] is None:
            spread = None
        done = set(minmax or ()) | {i for i in spread or () if i is not None}
        rest = [(i, name) for i, (name, a) in enumerate(items) if a == abs_ and i not in done]
        groups.append((abs_, minmax, spread, rest))
    size = len(items)
    # min and max alone (the recorder's cheapest setting: what its non-finite check reads) are
    # one kernel whose results come in their order: no plan to walk
    min_max = groups == [(False, (0, 1), None, [])]
    if min_max and other is not None:
        return _recorder_min_max(names, other)

    def reduce(t: Any) -> Any:
        if other is not None:
            if type(t) not in _PLAIN_TYPES or not t.numel():
                return other(t)
            dtype = t.dtype
            if dtype in _DIRECT:
                t = t.detach()
            elif dtype in _UPCAST:
                t = t.detach().float()
            else:
                return other(t)
        out: list[Any]
        if min_max:  # fused_reductions' (the recorder's is _recorder_min_max)
            return list(torch.aminmax(t))
        out = [None] * size
        for abs_, minmax, spread, rest in groups:
            x = t.abs() if abs_ else t
            if minmax is not None:
                out[minmax[0]], out[minmax[1]] = torch.aminmax(x)
            if spread is not None:
                n = x.numel()
                if n <= _ONE_PASS_STD_LIMIT or not x.is_cpu:  # one kernel on an accelerator
                    std, mean = torch.std_mean(x, correction=0)
                else:  # two passes, as numpy's std
                    mean = x.mean()
                    std = torch.linalg.vector_norm(x - mean) / (n ** 0.5)
                i_std, i_mean, i_var = spread
                if i_std is not None:
                    out[i_std] = std
                if i_mean is not None:
                    out[i_mean] = mean
                if i_var is not None:
                    out[i_var] = std * std
            for i, name in rest:
                out[i] = _torch_reduction(x, name, False)
        return out if other is None else DeviceReductions(names, out)

    return reduce


def _recorder_min_max(names: list[str], other: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """:func:`recorder_reductions` for min and max alone: one ``aminmax`` of any plain tensor
    whose dtype torch has it for (its results in the tensor's dtype: exact for a min and a max;
    ints and bools too), ``other(value)`` for anything else. What torch cannot reduce (an empty
    tensor, a complex, quantized or float8 one) raises RuntimeError, so nothing is asked of the
    tensor first: each question costs a fraction of a microsecond, for every recorded tensor of
    every step."""
    aminmax = torch.aminmax

    def reduce(t: Any) -> Any:
        if type(t) in _PLAIN_TYPES:
            try:
                # a gradient needs no detach (it does not require grad): a tensor less to make
                return DeviceReductions(names, list(aminmax(t.detach() if t.requires_grad else t)))
            except RuntimeError:  # NotImplementedError too
                pass
        return other(t)

    return reduce


_PLANS: dict[tuple[tuple[str, bool], ...], Callable[[torch.Tensor], list[torch.Tensor]]] = {}


#: Above this many elements a median is computed on the host (torch.quantile refuses more).
QUANTILE_LIMIT = 16_000_000


def _torch_reduction(t: torch.Tensor, name: str, abs_: bool) -> torch.Tensor:
    """numpy's definitions (ddof=0, flattened norms) with torch ops, on the tensor's device."""
    if abs_:
        t = t.abs()
    if name == "min":
        return t.min()
    if name == "max":
        return t.max()
    if name == "mean":
        return t.mean()
    if name == "std":
        return t.std(correction=0)
    if name == "variance":
        return t.var(correction=0)
    if name == "sum":
        return t.sum()
    if name == "prod":
        return t.prod()
    if name == "median":
        return t.double().quantile(0.5)
    if name == "l1":
        return t.abs().sum()
    if name == "l2":
        return t.abs().square().sum().sqrt() if t.is_complex() else torch.linalg.vector_norm(t, 2)
    if name == "nan_count":
        return torch.isnan(t).sum(dtype=torch.float64)
    if name == "inf_count":
        return torch.isinf(t).sum(dtype=torch.float64)
    if name == "zero_fraction":
        return (t == 0).sum().double() / t.numel()
    raise MltraceValueError(f"unknown reduction {name!r}")
