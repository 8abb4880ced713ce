"""PyTorch tensors as values: host copies, reductions on the tensor's device with one
transfer per step, on-device histograms, and what the flight recorder keeps of them
(mltrace.capture.adapter, mltrace.capture.recording_adapter)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mltrace.capture.adapter import ReductionItems, as_numpy
from mltrace.capture.recording_adapter import RecordingAdapter
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.format.tensors import BFloat16Bits
from mltrace.pytorch.copy_ring import CopiedStep, CopyRing
from mltrace.pytorch.histograms import bins_on_device, device_histogram
from mltrace.pytorch.reductions import (
    QUANTILE_LIMIT,
    DeviceReductions,
    HostReductions,
    read_on_cpu,
    recorder_reductions,
    stack_parts,
    start_reductions,
)
from mltrace.pytorch.sharded import is_sharded
from mltrace.reductions import all_finite, canonical_name
from mltrace.writer.histogram_bins import Binned

#: numpy's dtype of a torch dtype (bfloat16 and the like: float32)
_NUMPY_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
                 torch.int64: np.int64, torch.int32: np.int32}


@dataclass(frozen=True)
class Reduced:
    """A sharded tensor's reductions, combined across ranks, standing in for the tensor when
    only reductions of it are saved (the full tensor is never gathered)."""

    shape: tuple[int, ...]
    items: ReductionItems
    results: list[np.ndarray | None]


class TorchValues(RecordingAdapter):
    """How the capture core and the flight recorder turn torch tensors into host arrays and
    reductions; the attaching to PyTorch is TorchAdapter's (mltrace.pytorch.adapter)."""

    def __init__(self) -> None:
        super().__init__()
        self.host_transfers = 0  # device-to-host copies of reductions (see reductions_to_host)

    def to_numpy(self, value: Any) -> np.ndarray:
        """A host copy of a torch tensor (bfloat16 as its bits); other values as numpy."""
        if isinstance(value, Reduced):
            raise MltraceTypeError("only reductions of this sharded tensor were gathered")
        if not isinstance(value, torch.Tensor):
            return as_numpy(value)
        if is_sharded(value):
            value = value.full_tensor()  # type: ignore[attr-defined]  # a collective: every rank
        if value.dtype == torch.bfloat16:
            return value.detach().cpu().view(torch.uint16).numpy().view(BFloat16Bits)
        try:
            return value.numpy(force=True)  # detach, host copy and conj/neg resolution in one call
        except TypeError as exc:  # quantized, float8, complex32: dtypes numpy does not have
            raise MltraceTypeError(
                f"cannot save a tensor of dtype {value.dtype}: {exc} (numpy has no such dtype; "
                "save a converted copy: tensor.float(), or tensor.dequantize() if quantized)"
            ) from exc
        except RuntimeError as exc:  # a tensor subclass torch cannot copy to numpy
            raise MltraceTypeError(
                f"cannot save a {type(value).__name__} (a torch.Tensor subclass): {exc}; save a "
                "plain copy with hook.save_tensor(name, t.as_subclass(torch.Tensor)) or convert it "
                "the way its library documents") from exc

    def reduce(self, value: Any, items: ReductionItems) -> list[np.ndarray | None]:
        """Reductions on the tensor's device, one device-to-host copy per tensor."""
        return self.reductions_to_host([self.reduce_on_device(value, items)])[0]

    def reduce_on_device(self, value: Any, items: ReductionItems) -> Any:
        """Reductions computed on the tensor's device and left there (a DeviceReductions), or
        the results where they are known or computed on the host: a sharded tensor's combined
        ones, complex tensors and huge medians (numpy's path)."""
        if isinstance(value, Reduced):
            if list(value.items) != list(items):
                raise MltraceValueError("reductions asked for differ from those combined across ranks")
            return value.results
        big_median = any(n == "median" for n, _ in items) and getattr(value, "numel", lambda: 0)() > QUANTILE_LIMIT
        if not isinstance(value, torch.Tensor) or value.is_complex() or big_median:
            return super().reduce(value, items)
        try:
            return start_reductions(value, items)
        except (RuntimeError, TypeError) as exc:
            if type(value) in (torch.Tensor, torch.nn.Parameter):
                raise
            raise MltraceTypeError(
                f"cannot reduce a {type(value).__name__} (a torch.Tensor subclass): {exc}; save a "
                "plain copy with hook.save_tensor(name, t.as_subclass(torch.Tensor))") from exc

    def reducer(self, items: ReductionItems) -> Callable[[Any], Any]:
        """The flight recorder's per-tensor call, decided once: non-empty float tensors of the
        usual dtypes go straight to the fused kernels (a few microseconds of Python less per
        tensor than :meth:`recordable` and :meth:`reduce_on_device`, which handle everything
        else, as they do a median: torch has no fused one)."""
        canonical = [(canonical_name(n), a) for n, a in items]
        general = super().reducer(items)
        if any(n == "median" for n, _ in canonical):
            return general
        return recorder_reductions(canonical, general)

    def bins_on_device(self, value: Any) -> bool:
        """Tensors on an accelerator are binned there (see mltrace.pytorch.histograms)."""
        return bins_on_device(value)

    def device_histogram(self, value: Any) -> Binned | None:
        """The TensorBoard histogram of an accelerator's tensor, binned on it."""
        return device_histogram(value)

    def recordable(self, value: Any) -> bool:
        """Sharded tensors (DTensors) are not recorded (their reductions would need collectives),
        nor complex or empty ones (no plain reductions)."""
        if isinstance(value, torch.Tensor):
            return not is_sharded(value) and not value.is_complex() and value.numel() > 0
        return not isinstance(value, Reduced)

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        """A torch tensor's shape and dtype (the recorder casts a loss back to it)."""
        if isinstance(value, torch.Tensor):
            return tuple(value.shape), _NUMPY_DTYPES.get(value.dtype, np.float32)
        return super().shape_and_dtype(value)

    def snapshot(self, value: Any) -> Any:
        """A copy on the tensor's device (no host transfer until a dump)."""
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        return super().snapshot(value)

    def nbytes(self, snapshot: Any) -> int:
        """A tensor's bytes."""
        if isinstance(snapshot, torch.Tensor):
            return snapshot.numel() * snapshot.element_size()
        return super().nbytes(snapshot)

    def reductions_to_host(self, started: list[Any]) -> list[list[np.ndarray | None]]:
        """The results of a step's reductions: those left on a device are stacked and copied to
        the host together, one copy per device (one per step on a one-GPU job)."""
        pending = [s for s in started if isinstance(s, DeviceReductions)]
        host: dict[int, np.ndarray] = {}
        for here in _by_device(pending):
            values = self._to_host(stack_parts(here))
            offsets = np.cumsum([0] + [len(s.names) for s in here])
            host.update({id(s): values[a:b] for s, a, b in zip(here, offsets, offsets[1:])})
        return [s.results(host[id(s)]) if isinstance(s, DeviceReductions) else s for s in started]

    def reductions_to_host_flat(self, started: list[Any]) -> np.ndarray | None:
        """A step's reductions, all waiting on one device, stacked and copied to the host
        together as float64 (the values :meth:`reductions_to_host` gives, in one array)."""
        values = _stacked_on_one_device(started)
        if values is None:
            return None
        return self._to_host(values if values.dtype == torch.float64 else values.double())

    def step_copies(self, items: ReductionItems, ring_steps: int, max_bytes: int,
                    checked: bool) -> CopyRing | None:
        """A ring of copies (mltrace.pytorch.copy_ring) where reducing a tensor takes more than
        one kernel: min and max alone are one ``aminmax``, no dearer than a copy, and a median
        has no fused kernel."""
        canonical = [(canonical_name(n), a) for n, a in items]
        if sorted(canonical) == [("max", False), ("min", False)] or any(n == "median" for n, _ in canonical):
            return None
        return CopyRing(canonical, ring_steps, max_bytes, self, checked)

    def reductions_to_flat(self, started: list[Any]) -> np.ndarray:
        """A step's reductions in one device-to-host copy, when all of them wait on one device
        (in their own dtype: the flight recorder checks every step and converts only what it
        writes); a step of copies has its reductions computed now."""
        if len(started) == 1 and type(started[0]) is HostReductions:
            return np.frombuffer(started[0].values, dtype=np.float64)
        if len(started) == 1 and type(started[0]) is CopiedStep:
            return started[0].to_flat(self)
        on_host = read_on_cpu(started)  # fresh handles of CPU tensors: a loss read for its spike
        if on_host is not None:
            return np.frombuffer(on_host.values, dtype=np.float64)
        values = _stacked_on_one_device(started)
        if values is None:
            return super().reductions_to_flat(started)
        return self._to_host(values)

    def reductions_finite(self, started: list[Any]) -> bool:
        """A packed step's reductions are read as Python floats, in one copy and no numpy call."""
        if len(started) == 1 and type(started[0]) is HostReductions:
            return all_finite(started[0].values)
        if len(started) == 1 and type(started[0]) is CopiedStep:
            return started[0].finite(self)
        if len(started) == 1 and type(started[0]) is DeviceReductions and started[0].stacked is not None:
            self.host_transfers += 1
            return all_finite(started[0].stacked.tolist())
        return super().reductions_finite(started)

    def pack_reductions(self, started: list[Any]) -> list[Any]:
        """A step's reductions as one object to keep, not one per reduction: read as floats if
        all are on the CPU, else one tensor when all wait on one device."""
        on_host = read_on_cpu(started)
        if on_host is not None:
            self.host_transfers += 1
            return [on_host]
        values = _stacked_on_one_device(started) if len(started) > 1 else None
        if values is None:
            return started
        return [DeviceReductions([n for s in started for n in s.names], [], values)]

    def _to_host(self, values: torch.Tensor) -> np.ndarray:
        """Copy reductions to the host (counted in ``host_transfers``)."""
        self.host_transfers += 1
        return values.cpu().numpy()


def _stacked_on_one_device(started: list[Any]) -> torch.Tensor | None:
    """The results of ``started`` stacked in their own dtype, or None when some are not
    DeviceReductions or they are on several devices (torch refuses to stack those; asking each
    tensor its device would cost a microsecond per tensor)."""
    if not started or not all(type(s) is DeviceReductions for s in started):
        return None
    try:
        return stack_parts(started, float64=False)
    except RuntimeError:
        return None


def _by_device(pending: list[DeviceReductions]) -> list[list[DeviceReductions]]:
    """``pending`` grouped by device, in order within each group."""
    devices: dict[torch.device, list[DeviceReductions]] = {}
    for s in pending:
        devices.setdefault(s.device, []).append(s)
    return list(devices.values())
