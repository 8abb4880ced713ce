"""TensorBoard histograms of tensors on an accelerator, binned where they live.

A histogram of a GPU tensor binned on the host first copies every value to the host; binned on
the device, only the ~1,550 bucket counts and five statistics cross, in one copy. The buckets and
the binning rule are mltrace.writer.histogram_bins' (TF's default buckets, ``np.histogram``'s counts):
the finite values are sorted on the device and each edge's position among them is searched.
CPU tensors are binned by numpy on the export's background thread instead (faster there than
torch's sort, and off the training thread).
"""

from __future__ import annotations

import numpy as np
import torch

from mltrace.writer.histogram_bins import DEFAULT_BINS, Binned

_EDGES: dict[torch.device, torch.Tensor] = {}


def bins_on_device(value: object) -> bool:
    """True for a tensor that :func:`device_histogram` should bin (one not on the CPU)."""
    return isinstance(value, torch.Tensor) and value.device.type != "cpu"


@torch.no_grad()
def device_histogram(value: torch.Tensor) -> Binned | None:
    """The histogram of ``value``'s finite elements, binned on its device (None if it has no
    finite element, or is bool, complex or empty, as the host path)."""
    if value.numel() == 0 or value.is_complex() or value.dtype == torch.bool:
        return None
    t = value.detach().reshape(-1).double()  # float64 as the host path: exact edge comparisons
    edges = _EDGES.get(t.device)
    if edges is None:
        edges = _EDGES[t.device] = torch.from_numpy(DEFAULT_BINS).to(t.device)
    finite = torch.isfinite(t)
    ordered = torch.sort(torch.where(finite, t, torch.inf)).values  # non-finite ones last
    found = torch.searchsorted(ordered, edges)  # values below each edge
    counts = found.diff()
    last = torch.searchsorted(ordered, edges[-1:], right=True) - found[-1:]  # right edge too
    counts = torch.cat([counts[:-1], counts[-1:] + last])
    n = finite.sum()
    kept = torch.where(finite, t, 0.0)
    stats = torch.stack([ordered[0], ordered[(n - 1).clamp(min=0)], n.double(), kept.sum(),
                         kept.dot(kept)])
    host = torch.cat([stats, counts.double()]).cpu().numpy()  # the one device-to-host copy
    if host[2] == 0:
        return None
    return Binned(host[5:].astype(np.int64), float(host[0]), float(host[1]), int(host[2]),
                  float(host[3]), float(host[4]))
