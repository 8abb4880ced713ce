"""The ``samples`` collection (mltrace.stability.samples, mltrace.pytorch.samples): each
sample's loss and a fingerprint of each sample's input, saved by the PyTorch hook. A poisoned
sample has the highest loss at its index; the per-sample losses average to the loss the hook
saved, for torch's own losses and for custom ones; fingerprints are stable across runs and are
what ``mltrace.pytorch.fingerprint`` computes; a loss whose per-sample losses cannot be computed
is said once and training goes on. The flight recorder's side is in
tests/capture/test_flight_recorder.py; real smdebug reading them, tests/legacy/test_smdebug_reads_stability.py."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import mltrace.pytorch as smd
from mltrace.pytorch import samples as per_sample
from mltrace.pytorch.stability import sample_probe
from mltrace.stability.samples import ROW_BYTES_CAP, SAMPLES, fingerprint_name, loss_name
from mltrace.trials import create_trial
from tests.support.stability_models import CONTEXT, VOCABULARY, TinyGPT, TokenLoss

ADAPTER_LOGGER = "mltrace.pytorch.adapter"  # the adapter's one-time warnings


class LanguageModelLoss(nn.modules.loss._Loss):
    """A custom ``_Loss`` that ignores ``reduction`` (as bench/nanogpt.py's)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class NoVmapLoss(nn.Module):
    """A mean squared error that reads a value on the host: torch.func.vmap cannot batch it."""

    def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        scale = 1.0 if out.sum().item() > -1e9 else 0.0
        return ((out - target) ** 2).mean() * scale


def counting(n: int, batch: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tokens, next tokens) of sequences that count up modulo the vocabulary: learnable."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start = torch.randint(0, VOCABULARY, (batch, 1), generator=gen)
        seq = (start + torch.arange(CONTEXT + 1)) % VOCABULARY
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def trained_gpt() -> TinyGPT:
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    for x, y in counting(150, 16, seed=3):
        loss = F.cross_entropy(model(x).reshape(-1, VOCABULARY), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def per_sample_ce(logits: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(1).detach().numpy()


@pytest.mark.parametrize("loss_fn", [TokenLoss(), LanguageModelLoss()], ids=["module", "_Loss"])
def test_a_poisoned_sample_has_the_highest_loss_at_its_index(tmp_path: Path, loss_fn: nn.Module) -> None:
    """A trained model, one batch clean and one whose sample 5 has shuffled targets (and one
    sample of a single repeated token in the next): the saved per-sample losses peak there,
    equal a plain per-sample cross-entropy, and average to the loss the hook saved."""
    model = trained_gpt()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), include_collections=[SAMPLES, "losses"],
                    save_config=smd.SaveConfig(save_interval=1))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    (x0, y0), (x1, y1), (x2, y2) = counting(3, 8, seed=11)
    y1 = y1.clone()
    y1[5] = y1[5][torch.randperm(CONTEXT, generator=torch.Generator().manual_seed(0))]
    x2, y2 = x2.clone(), y2.clone()
    x2[2], y2[2] = 4, 4  # the same token throughout: the model expects the next one
    logits = []
    for x, y in ((x0, y0), (x1, y1), (x2, y2)):
        out = model(x)
        loss_fn(out, y).backward()
        logits.append(out.detach())
    hook.close()

    trial = create_trial(str(tmp_path / "run"))
    name = loss_name(type(loss_fn).__name__)
    assert trial.tensor_names(collection=SAMPLES) == sorted([name, fingerprint_name("TinyGPT")])
    for step, (y, poisoned) in enumerate(((y0, None), (y1, 5), (y2, 2))):
        losses = trial.tensor(name).value(step)
        assert losses.dtype == np.float32 and losses.shape == (8,)
        np.testing.assert_allclose(losses, per_sample_ce(logits[step], y), rtol=1e-5, atol=1e-6)
        saved = float(trial.tensor(f"{type(loss_fn).__name__}_output_0").value(step))
        assert np.mean(losses, dtype=np.float64) == pytest.approx(saved, rel=1e-5)
        if poisoned is not None:
            assert int(np.argmax(losses)) == poisoned
            assert losses[poisoned] > 3 * np.median(losses)


def test_torch_losses_are_recomputed_unreduced_and_custom_ones_vmapped_or_looped() -> None:
    torch.manual_seed(0)
    logits, targets = torch.randn(6, 5), torch.randint(0, 5, (6,))
    losses, method = per_sample.per_sample_losses(nn.CrossEntropyLoss(), (logits, targets), {})
    assert method == "reduction"
    torch.testing.assert_close(losses, F.cross_entropy(logits, targets, reduction="none"))
    tokens, next_tokens = torch.randn(4, 3, 7), torch.randint(0, 7, (4, 3))
    losses, method = per_sample.per_sample_losses(LanguageModelLoss(), (tokens,), {"targets": next_tokens})
    assert method == "vmap"
    torch.testing.assert_close(losses, torch.from_numpy(per_sample_ce(tokens, next_tokens)))
    out, target = torch.randn(5, 2), torch.randn(5, 2)
    losses, method = per_sample.per_sample_losses(NoVmapLoss(), (out, target), {})
    assert method == "loop"
    torch.testing.assert_close(losses, ((out - target) ** 2).mean(1))
    with pytest.raises(per_sample.NoPerSampleLoss, match="vmap.*loop.*300 samples"):
        per_sample.per_sample_losses(NoVmapLoss(), (torch.randn(300, 2), torch.randn(300, 2)), {})


def test_cross_entropy_per_sample_losses_average_to_the_saved_loss(tmp_path: Path) -> None:
    """nn.CrossEntropyLoss on a classifier's (batch, classes) logits, label smoothing on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    hook = smd.Hook(out_dir=str(tmp_path / "run"), include_collections=["stability", SAMPLES],
                    save_config=smd.SaveConfig(save_interval=1))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(10, 4), torch.randint(0, 3, (10,))) for _ in range(3)]
    for x, y in batches:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert {loss_name("CrossEntropyLoss"), fingerprint_name("Sequential")} <= set(trial.tensor_names(collection=SAMPLES))
    assert not {loss_name("CrossEntropyLoss")} & set(trial.tensor_names(collection="stability"))
    for step, (x, _) in enumerate(batches):
        losses = trial.tensor(loss_name("CrossEntropyLoss")).value(step)
        saved = float(trial.tensor("CrossEntropyLoss_output_0").value(step))
        assert losses.shape == (10,) and np.mean(losses, dtype=np.float64) == pytest.approx(saved, rel=1e-5)
        np.testing.assert_array_equal(trial.tensor(fingerprint_name("Sequential")).value(step), smd.fingerprint(x))
    assert loss_fn.reduction == "mean"  # recomputed on a copy: the module is untouched


def _fingerprints(out: Path, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[np.ndarray]:
    torch.manual_seed(0)
    model, loss_fn = TinyGPT(), TokenLoss()
    hook = smd.Hook(out_dir=str(out), include_collections=[SAMPLES], save_config=smd.SaveConfig(save_interval=1))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    for x, y in batches:
        loss_fn(model(x), y).backward()
    hook.close()
    trial = create_trial(str(out))
    return [trial.tensor(fingerprint_name("TinyGPT")).value(step) for step in range(len(batches))]


def test_fingerprints_are_stable_across_runs_and_are_what_fingerprint_computes(tmp_path: Path) -> None:
    batches = counting(3, 6, seed=5)
    first, second = _fingerprints(tmp_path / "a", batches), _fingerprints(tmp_path / "b", batches)
    for step, (x, _) in enumerate(batches):
        assert first[step].dtype == np.int64 and first[step].shape == (6,)
        np.testing.assert_array_equal(first[step], second[step])
        np.testing.assert_array_equal(first[step], smd.fingerprint(x))
        np.testing.assert_array_equal(first[step], smd.fingerprint(x.clone()))  # values, not identity
    assert len({int(v) for f in first for v in f}) == len({tuple(x[i].tolist()) for x, _ in batches for i in range(6)})


def test_the_fingerprint_is_blake2b_of_dtype_shape_and_bytes() -> None:
    """The documented digest, so a pipeline can compute it without torch."""
    batch = torch.arange(12, dtype=torch.int64).reshape(2, 2, 3)
    want = [int.from_bytes(hashlib.blake2b(b"int64:2x3:" + row.numpy().tobytes(), digest_size=8).digest(),
                           "little", signed=True) for row in batch]
    assert smd.fingerprint(batch).tolist() == want
    assert smd.fingerprint(batch.float()).tolist() != want  # the dtype counts
    assert smd.fingerprint(batch.reshape(2, 3, 2)).tolist() != want  # the shape counts
    assert smd.fingerprint(torch.tensor([True, False])).shape == (2,)
    assert smd.fingerprint(batch.to(torch.bfloat16)).shape == (2,)
    assert smd.fingerprint(torch.zeros(0, 3)).shape == (0,)
    with pytest.raises(ValueError, match="batch"):
        smd.fingerprint(torch.tensor(1.0))


def test_a_row_over_the_cap_is_hashed_from_a_strided_sample() -> None:
    images = torch.rand(2, 3, 64, 128, generator=torch.Generator().manual_seed(0))  # 96 KiB a row
    assert images[0].numel() * 4 > ROW_BYTES_CAP
    rows, _ = per_sample.fingerprint_rows(images)
    assert rows.shape[1] <= ROW_BYTES_CAP
    stride = -(-images[0].numel() // (ROW_BYTES_CAP // 4))  # 2: every other element
    base = smd.fingerprint(images)
    changed = images.clone()
    changed.view(2, -1)[0, 1] += 1.0  # between two sampled elements: not seen
    assert stride == 2 and (smd.fingerprint(changed) == base).all()
    changed.view(2, -1)[0, 2] += 1.0  # a sampled one
    assert smd.fingerprint(changed)[0] != base[0] and smd.fingerprint(changed)[1] == base[1]


def test_nothing_is_computed_on_steps_that_save_no_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"losses": 0, "rows": 0}
    losses, rows = sample_probe.per_sample_losses, sample_probe.fingerprint_rows

    def count_losses(*args, **kwargs):
        calls["losses"] += 1
        return losses(*args, **kwargs)

    def count_rows(*args, **kwargs):
        calls["rows"] += 1
        return rows(*args, **kwargs)

    monkeypatch.setattr(sample_probe, "per_sample_losses", count_losses)
    monkeypatch.setattr(sample_probe, "fingerprint_rows", count_rows)
    def run(out: str, collection: str, interval: int, steps: int) -> None:
        hook = smd.Hook(out_dir=str(tmp_path / out), include_collections=[collection],
                        save_config=smd.SaveConfig(save_interval=interval))
        torch.manual_seed(0)
        model, loss_fn = nn.Linear(4, 1), nn.MSELoss()
        hook.register_module(model)
        hook.register_loss(loss_fn)
        for _ in range(steps):
            loss_fn(model(torch.randn(5, 4)), torch.randn(5, 1)).backward()
        hook.close()

    run("run", SAMPLES, 3, 7)
    assert calls == {"losses": 3, "rows": 3}  # steps 0, 3 and 6
    assert create_trial(str(tmp_path / "run")).tensor(loss_name("MSELoss")).steps() == [0, 3, 6]

    calls.update(losses=0, rows=0)  # a hook that saves no samples computes none
    run("plain", "losses", 1, 3)
    assert calls == {"losses": 0, "rows": 0}
    assert not [n for n in create_trial(str(tmp_path / "plain")).tensor_names() if n.startswith("samples/")]


@pytest.mark.parametrize(("loss_fn", "said"), [
    (nn.MSELoss(reduction="sum"), "is not the loss"),
    (NoVmapLoss(), "could not be computed; tried torch.func.vmap"),
], ids=["a sum", "no method"])
def test_a_loss_without_per_sample_losses_warns_once_and_training_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, loss_fn: nn.Module, said: str) -> None:
    hook = smd.Hook(out_dir=str(tmp_path / "run"), include_collections=[SAMPLES, "losses"],
                    save_config=smd.SaveConfig(save_interval=1))
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with caplog.at_level(logging.WARNING, logger=ADAPTER_LOGGER):
        for _ in range(4):
            loss = loss_fn(model(torch.randn(300, 4)), torch.randn(300, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    hook.close()
    warnings = [r.getMessage() for r in caplog.records if "per-sample losses" in r.getMessage()]
    assert len(warnings) == 1 and said in warnings[0] and type(loss_fn).__name__ in warnings[0]
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2, 3] and not hook.errors.disabled
    assert trial.tensor_names(collection=SAMPLES) == [fingerprint_name("Linear")]
    assert trial.tensor(f"{type(loss_fn).__name__}_output_0").steps() == [0, 1, 2, 3]
