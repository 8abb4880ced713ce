"""mltrace.reductions' definitions computed with torch ops on the tensor's own device.

:func:`start_reductions` leaves the results on the device (:class:`DeviceReductions`), so that a
step's reductions of many tensors can be moved to the host in one copy; :func:`torch_reductions`
is the same for one tensor, moved at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mltrace.capture.adapter import ReductionItems
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.reductions import canonical_name


@dataclass(frozen=True)
class DeviceReductions:
    """The reductions of one tensor, computed on its device and not yet on the host."""

    names: list[str]  # canonical reduction names, one per item
    values: torch.Tensor  # float64, one value per item, on the tensor's device

    def results(self, host: np.ndarray) -> list[np.ndarray | None]:
        """The results as ``torch_reductions`` returns them, from ``values`` copied to the host
        (counts as int64, the rest float64)."""
        return [np.asarray(np.int64(h) if n in _COUNTS else h) for n, h in zip(self.names, host)]


def torch_reductions(value: torch.Tensor, items: ReductionItems) -> list[np.ndarray | None]:
    """mltrace.reductions' definitions computed with torch ops on ``value``'s device; one
    device-to-host copy of the results."""
    started = start_reductions(value, items)
    if isinstance(started, list):
        return started
    return started.results(started.values.cpu().numpy())


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
    names = [canonical_name(name) for name, _ in items]
    outs = [_torch_reduction(t, name, abs_).double() for name, (_, abs_) in zip(names, items)]
    return DeviceReductions(names, torch.stack(outs))


#: Above this many elements a median is computed on the host (torch.quantile refuses more).
QUANTILE_LIMIT = 16_000_000
_COUNTS = ("nan_count", "inf_count")


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
        return torch.isnan(t).sum()
    if name == "inf_count":
        return torch.isinf(t).sum()
    if name == "zero_fraction":
        return (t == 0).sum().double() / t.numel()
    raise MltraceValueError(f"unknown reduction {name!r}")
