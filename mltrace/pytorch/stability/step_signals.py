"""A step's stability signals, kept on their device until the step ends and then copied to the
host together: one device-to-host transfer per device per step, whatever the number of signals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

#: How a signal seen several times in one step (a module called twice, gradient accumulation's
#: several forward passes) is combined: the largest value, the mean, or the L2 norm of all.
Merge = Literal["max", "mean", "l2"]


@dataclass
class _Pending:
    value: torch.Tensor
    merge: Merge
    calls: int = 1


class StepSignals:
    """The signals of the current step, by tensor name, in the order first seen."""

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, name: str, value: torch.Tensor, merge: Merge = "max") -> None:
        """Keep ``value`` (a device tensor, not yet read) as ``name``, merged with the step's
        earlier value of the same name."""
        value = value.detach()
        before = self._pending.get(name)
        if before is None:
            self._pending[name] = _Pending(value, merge)
            return
        before.calls += 1
        if merge == "max":
            before.value = torch.maximum(before.value, value)
        elif merge == "mean":
            before.value = before.value + value
        else:
            before.value = torch.hypot(before.value, value)

    def put_parts(self, names: list[str], values: torch.Tensor, merge: Merge = "max") -> None:
        """``values[i]`` as ``names[i]``: a stacked computation's results, kept as one tensor."""
        for i, name in enumerate(names):
            self.put(name, values[i], merge)

    def clear(self) -> None:
        """Forget the step's signals (a step that does not save them)."""
        self._pending.clear()

    def take(self) -> list[tuple[str, np.ndarray]]:
        """The step's signals as host arrays (float64 for float64 tensors, float32 otherwise),
        in one copy per device, and empty for the next step."""
        pending, self._pending = self._pending, {}
        by_device: dict[torch.device, list[tuple[str, _Pending]]] = {}
        for name, item in pending.items():
            by_device.setdefault(item.value.device, []).append((name, item))
        out: list[tuple[str, np.ndarray]] = []
        for items in by_device.values():
            wide = any(item.value.dtype == torch.float64 for _, item in items)
            dtype = torch.float64 if wide else torch.float32
            flat = torch.cat([item.value.reshape(-1).to(dtype) for _, item in items]).cpu().numpy()
            offset = 0
            for name, item in items:
                size = item.value.numel()
                array = flat[offset:offset + size].reshape(item.value.shape)
                offset += size
                if item.merge == "mean" and item.calls > 1:
                    array = array / item.calls
                out.append((name, np.array(array)))
        return out


__all__ = ["Merge", "StepSignals"]
