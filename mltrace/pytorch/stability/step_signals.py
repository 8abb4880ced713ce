"""A step's stability signals, kept on their device until the step ends and then copied to the
host together: one device-to-host transfer per device per step, whatever the number of signals.

Signals arrive in groups (the quantities one callback computes, stacked: a module's outlier
statistics, every parameter's update norms), kept as the one tensor they were computed in, so a
step's few hundred signals are a few dozen tensors to concatenate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

#: How a signal seen several times in one step (a module called twice, gradient accumulation's
#: several forward passes) is combined: the largest value, the mean, or the L2 norm of all.
Merge = Literal["max", "mean", "l2"]


@dataclass
class _Group:
    names: Sequence[str]
    value: torch.Tensor  # (len(names), *shape of one signal)
    merges: tuple[Merge, ...]
    calls: int = 1

    def merge(self, value: torch.Tensor) -> None:
        self.calls += 1
        kinds = set(self.merges)
        if kinds == {"max"}:
            self.value = torch.maximum(self.value, value)
            return
        combined = self.value + value
        shape = (len(self.merges),) + (1,) * (value.dim() - 1)
        for kind, op in (("max", torch.maximum), ("l2", torch.hypot)):
            if kind in kinds:
                mask = torch.tensor([m == kind for m in self.merges], device=value.device).reshape(shape)
                combined = torch.where(mask, op(self.value, value), combined)
        self.value = combined


class StepSignals:
    """The signals of the current step, in groups, in the order first seen."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def put(self, names: Sequence[str], values: torch.Tensor, merge: Merge | Sequence[Merge] = "max") -> None:
        """Keep ``values[i]`` (device tensors, not yet read) as ``names[i]``, merged with the
        step's earlier values of the same names (``merge``: one kind, or one per name)."""
        values = values.detach()
        group = self._groups.get(names[0])
        if group is not None:
            group.merge(values)
            return
        merges = (merge,) * len(names) if isinstance(merge, str) else tuple(merge)
        self._groups[names[0]] = _Group(names, values, merges)

    def clear(self) -> None:
        """Forget the step's signals (a step that does not save them)."""
        self._groups.clear()

    def take(self) -> list[tuple[str, np.ndarray]]:
        """The step's signals as host arrays (float64 for float64 tensors, float32 otherwise),
        in one copy per device, and empty for the next step."""
        groups, self._groups = list(self._groups.values()), {}
        by_device: dict[torch.device, list[_Group]] = {}
        for group in groups:
            by_device.setdefault(group.value.device, []).append(group)
        out: list[tuple[str, np.ndarray]] = []
        for here in by_device.values():
            dtype = torch.float64 if any(g.value.dtype == torch.float64 for g in here) else torch.float32
            flat = torch.cat([g.value.reshape(-1).to(dtype) for g in here]).cpu().numpy()
            offset = 0
            for group in here:
                size = group.value.numel()
                block = flat[offset:offset + size].reshape(group.value.shape)
                offset += size
                for i, name in enumerate(group.names):
                    value = block[i]
                    if group.calls > 1 and group.merges[i] == "mean":
                        value = value / group.calls
                    out.append((name, np.array(value)))
        return out


__all__ = ["Merge", "StepSignals"]
