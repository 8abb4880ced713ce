"""What crosses from an accelerator to the host (issue 14), checked on CPU:

* a step's reductions: every saved tensor's are computed on its device when it is saved and
  copied together when the step is written, so a step synchronises once for reductions, not once
  per tensor; counted through the adapter's own transfer function (``host_transfers``);
* TensorBoard histograms of an accelerator's tensors are binned on it and only the counts cross
  (mltrace.pytorch.histograms); the binning is run here on CPU tensors, and the hook is made to
  take that path for them, and compared with the host binning (np.histogram's counts).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from tensorboard.backend.event_processing import event_accumulator as ea

import mltrace.pytorch as smd
from mltrace.pytorch.adapter import TorchAdapter
from mltrace.pytorch.histograms import device_histogram
from mltrace.reductions import compute
from mltrace.trials import create_trial
from mltrace.writer.histogram_bins import DEFAULT_BINS, bin_values

STEPS = 4
ITEMS = [("mean", False), ("max", False), ("min", True), ("nan_count", False), ("l2", False)]


def _train(out_dir: Path, save_raw: bool) -> smd.Hook:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.ReLU(), nn.Linear(4, 1))
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients"],
                    reduction_config=smd.ReductionConfig(
                        reductions=["mean", "max", "nan_count"], abs_reductions=["min"],
                        norms=["l2"], save_raw_tensor=save_raw))
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(32, 8)), torch.randn(32, 1)).backward()
        opt.step()  # weights change in place after they were saved: reductions must predate it
    hook.close()
    return hook


def test_each_step_copies_its_reductions_to_the_host_once(tmp_path: Path) -> None:
    hook = _train(tmp_path, save_raw=False)
    trial = create_trial(str(tmp_path))
    saved = [n for n in trial.tensor_names() if not n.startswith("MSELoss")]
    assert len(saved) == 12  # 6 weights and biases, 6 gradients
    assert trial.steps() == list(range(STEPS))
    for name in saved:
        assert trial.tensor(name).reduction_value(STEPS - 1, "l2") is not None
    assert hook.adapter.host_transfers == STEPS  # not 12 per step


def test_reductions_copied_together_equal_those_of_the_saved_values(tmp_path: Path) -> None:
    """Weights are saved before the optimizer updates them in place; their reductions, copied
    at the step's end, are still those of the values saved (numpy's definitions)."""
    hook = _train(tmp_path, save_raw=True)
    assert hook.adapter.host_transfers == STEPS
    trial = create_trial(str(tmp_path))
    for name in trial.tensor_names(collection="weights") + trial.tensor_names(collection="gradients"):
        tensor = trial.tensor(name)
        for step in tensor.steps():
            raw = tensor.value(step)
            for red, abs_ in ITEMS:
                np.testing.assert_allclose(tensor.reduction_value(step, red, abs=abs_),
                                           compute(red, raw, abs_), rtol=1e-5, atol=1e-9,
                                           err_msg=f"{name} {red} abs={abs_} step {step}")


_RNG = np.random.default_rng(3)


@pytest.mark.parametrize("values", [
    _RNG.normal(0, 0.05, 5000).astype(np.float32),
    _RNG.normal(3, 100, (64, 33)),
    np.concatenate([DEFAULT_BINS[::7], [0.0, 1e21, -1e21, 1e-13, np.nan, np.inf, -np.inf]]),
    _RNG.integers(-5, 7, 300),
    np.array([2.5], dtype=np.float16),
], ids=["float32", "float64", "edges_and_nonfinite", "int64", "float16"])
def test_binning_on_the_device_counts_as_np_histogram(values: np.ndarray) -> None:
    got, want = device_histogram(torch.from_numpy(values)), bin_values(values)
    assert got is not None and want is not None
    finite = np.asarray(values, dtype=np.float64)[np.isfinite(values)]
    np.testing.assert_array_equal(got.counts, np.histogram(finite, bins=DEFAULT_BINS)[0])
    np.testing.assert_array_equal(got.counts, want.counts)
    assert (got.min, got.max, got.num) == (want.min, want.max, want.num)
    scale = float(np.abs(finite).sum())
    assert got.sum == pytest.approx(want.sum, abs=1e-12 * scale)
    assert got.sum_squares == pytest.approx(want.sum_squares, rel=1e-12)


def test_no_finite_value_no_histogram() -> None:
    assert device_histogram(torch.tensor([float("nan"), float("inf")])) is None
    assert device_histogram(torch.zeros(0)) is None
    assert device_histogram(torch.tensor([True, False])) is None


def _histograms(out_dir: Path) -> dict[str, list[tuple[int, list[float], list[float]]]]:
    acc = ea.EventAccumulator(str(out_dir / "tensorboard" / "TRAIN"),
                              size_guidance={ea.HISTOGRAMS: 0})
    acc.Reload()
    return {tag: [(h.step, list(h.histogram_value.bucket), list(h.histogram_value.bucket_limit))
                  for h in acc.Histograms(tag)] for tag in acc.Tags()["histograms"]}


def _train_with_histograms(out_dir: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    hook = smd.Hook(out_dir=str(out_dir), export_tensorboard=True,
                    save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients"])
    for name in ("weights", "gradients"):
        hook.get_collection(name).save_histogram = True
    hook.register_module(model)
    hook.set_mode(smd.modes.TRAIN)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 1)).backward()
        opt.step()
    hook.close()


def test_the_hook_exports_device_binned_histograms_as_host_binned_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The export path for an accelerator's tensors, taken for CPU tensors: the same buckets and
    counts in TensorBoard as binning a host copy gives."""
    _train_with_histograms(tmp_path / "host")
    binned: list[str] = []
    real = TorchAdapter.device_histogram

    def on_device(self: TorchAdapter, value: torch.Tensor):  # type: ignore[no-untyped-def]
        binned.append(str(value.device))
        return real(self, value)

    monkeypatch.setattr(TorchAdapter, "bins_on_device", lambda self, value: True)
    monkeypatch.setattr(TorchAdapter, "device_histogram", on_device)
    _train_with_histograms(tmp_path / "device")
    host, device = _histograms(tmp_path / "host"), _histograms(tmp_path / "device")
    # 2 weights and 4 gradients (of weights and biases), 3 steps
    assert binned == ["cpu"] * 18
    assert sorted(host) == sorted(device) and len(host) == 6
    assert host == device
