"""The PyTorch adapter's per-tensor call for the flight recorder (TorchAdapter.reducer): every
dtype a training has reads back as numpy's min and max (or the default reductions), in the
order the tensors were kept; what cannot be reduced is left out or named, never wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mltrace.exceptions import MltraceTypeError
from mltrace.pytorch.adapter import TorchAdapter

MIN_MAX = [("min", False), ("max", False)]
DEFAULT = [("min", False), ("max", False), ("mean", False), ("std", False), ("l2", False)]


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy().reshape(-1)


def _tensors() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(4, 5, generator=gen) * 30
    return [base, base.double(), base.half(), base.bfloat16(), base.round().long(), base > 0,
            torch.nn.Parameter(base.clone()), base.clone().requires_grad_(True) * 2,
            torch.full((1,), -7.0)]


@pytest.mark.parametrize("items", [MIN_MAX, DEFAULT], ids=["min_max", "default"])
def test_each_dtype_reads_back_as_numpys_values_in_order(items):
    adapter = TorchAdapter()
    reduce = adapter.reducer(items)
    tensors = _tensors()
    flat = adapter.reductions_to_flat(adapter.pack_reductions([reduce(t) for t in tensors]))
    expected = []
    for t in tensors:
        a = _numpy(t)
        values = {"min": a.min(), "max": a.max(), "mean": a.mean(), "std": a.std(),
                  "l2": np.linalg.norm(a)}
        expected += [values[name] for name, _ in items]
    # half-precision tensors reduce in float32 or in their own dtype: a min or a max is exact
    np.testing.assert_allclose(flat, expected, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
@pytest.mark.parametrize("items", [MIN_MAX, DEFAULT], ids=["min_max", "default"])
def test_what_cannot_be_reduced_is_left_out_or_named(items):
    reduce = TorchAdapter().reducer(items)
    assert reduce(torch.empty(0)) is None
    assert reduce(torch.empty(3, 0)) is None
    assert reduce(torch.randn(3, dtype=torch.complex64)) is None
    with pytest.raises(MltraceTypeError, match="quantized"):
        reduce(torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8))


def test_a_non_finite_value_reaches_min_or_max():
    adapter = TorchAdapter()
    reduce = adapter.reducer(MIN_MAX)
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.randn(6)
        t[2] = bad
        flat = adapter.reductions_to_flat(adapter.pack_reductions([reduce(t)]))
        assert not np.isfinite(flat).all(), bad
