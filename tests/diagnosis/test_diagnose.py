"""``mltrace diagnose`` and ``trial.diagnose()`` (mltrace.diagnosis) on trials of real training
with a fault injected at a known step: the origin and the cause it names, the JSON schema, and
bad input (no anomaly, missing collections, a damaged file, a trial still training)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import mltrace.pytorch as smd
from mltrace.cli import main as cli
from mltrace.diagnosis import SCHEMA, diagnose
from mltrace.exceptions import MltraceValueError
from mltrace.trials import create_trial
from tests.support.stability_models import TokenLoss

STEPS, AT = 90, 70
WIDTH, VOCAB, CONTEXT, BATCH = 16, 12, 8, 6


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(WIDTH)
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)
        self.c_fc = nn.Linear(WIDTH, 2 * WIDTH)
        self.c_out = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, 2, c // 2).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.c_proj(y)
        return x + self.c_out(F.gelu(self.c_fc(x)))


class Chain(nn.Module):
    """A small GPT: an embedding, three blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.h = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens)
        for block in self.h:
            x = block(x)
        return self.head(x)


def _batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable stream: each window counts up from a random start (next token = token + 1)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(STEPS):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
        x = (start + torch.arange(CONTEXT + 1)) % VOCAB
        out.append((x[:, :-1], x[:, 1:]))
    return out


Fault = Callable[[int, nn.Module, torch.optim.Optimizer, tuple[torch.Tensor, torch.Tensor]],
                 tuple[torch.Tensor, torch.Tensor]]


def train(out_dir: Path, fault: Fault | None = None, collections: tuple[str, ...] = ("stability",),
          model: nn.Module | None = None) -> str:
    """Train the small GPT (or ``model``) STEPS steps, saving ``collections`` every step;
    ``fault(step, model, optimizer, batch)`` may change anything before a step's forward pass."""
    torch.manual_seed(0)
    model = model or Chain()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = TokenLoss()
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=list(collections))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    for step, batch in enumerate(_batches()):
        if fault is not None:
            batch = fault(step, model, optimizer, batch)
        optimizer.zero_grad()
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    hook.close()
    return str(out_dir)


def lr_spike(step, model, optimizer, batch):
    for group in optimizer.param_groups:
        group["lr"] = 3e-3 * (300.0 if step == AT else 1.0)
    return batch


def shuffled_targets(step, model, optimizer, batch):
    if step != AT:
        return batch
    x, y = batch
    gen = torch.Generator().manual_seed(5)
    flat = y.reshape(-1)
    return x, flat[torch.randperm(flat.numel(), generator=gen)].view_as(y)


@pytest.fixture(scope="module")
def trials(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("diagnosis")
    return {"healthy": train(root / "healthy"), "lr_spike": train(root / "lr_spike", lr_spike),
            "shuffled": train(root / "shuffled", shuffled_targets)}


def test_a_healthy_run_has_no_anomaly_and_says_which_thresholds(trials, capsys):
    report = diagnose(create_trial(trials["healthy"]))
    assert not report.found and report.cause is None
    assert "no anomaly" in report.message() and "robust z >= 8" in report.message()
    assert cli(["diagnose", trials["healthy"]]) == 0
    assert "no anomaly in 90 steps" in capsys.readouterr().out


def test_an_optimizer_fault_is_told_apart_from_a_data_fault(trials):
    """The learning rate x300 for one step: the updates leave their windows at that step,
    before any loss or activation (optimizer). Shuffled targets for one batch: the loss jumps
    at that step while every module output is normal (data)."""
    optimizer = diagnose(create_trial(trials["lr_spike"]))
    assert optimizer.found and optimizer.onset == AT
    assert optimizer.cause_name == "optimizer", optimizer.to_text()
    assert optimizer.origin[0].phase == "optimizer" and optimizer.origin_tensor.startswith("updates/")
    data = diagnose(create_trial(trials["shuffled"]))
    assert data.found and data.onset == AT and data.anomaly.kind == "loss_spike"
    assert data.cause_name == "data", data.to_text()
    assert data.origin[0].phase == "loss"


class Exp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x)


class Deep(nn.Module):
    """layers.0 .. layers.6; the exponential (layers.3) overflows what a corrupted layers.2
    sends it, and layers.4 turns the infinities into NaN: two layers after the corrupted one."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList([nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), Exp(),
                                     nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, VOCAB)])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens)
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_corrupted_layer_is_the_origin_though_the_nan_shows_two_layers_later(tmp_path):
    def corrupt(step, model, optimizer, batch):
        if step == AT:
            with torch.no_grad():
                model.layers[2].weight.mul_(1e4)  # finite outputs (hundreds); their exp: inf
        return batch

    report = diagnose(create_trial(train(tmp_path / "deep", corrupt, model=Deep())))
    assert report.anomaly.kind == "nonfinite" and report.anomaly.step == AT
    nonfinite = [d.tensor for d in report.origin if d.z == float("inf")]
    assert nonfinite and not nonfinite[0].startswith("activations/layers.2/")  # the NaN shows later
    assert report.origin_layer == "layers.2", report.to_text()
    assert report.origin_tensor.startswith("activations/layers.2/")
    assert report.cause_name == "corruption", report.to_text()


def test_the_json_schema(trials, capsys):
    assert cli(["diagnose", trials["shuffled"], "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == SCHEMA == "mltrace.diagnosis/1"
    assert set(doc) == {"schema", "trial", "worker", "found", "message", "steps", "anomaly", "anomalies",
                        "onset", "origin", "origin_layer", "cause", "samples", "record_next", "method",
                        "damaged"}
    assert doc["found"] is True and doc["onset"] == AT and doc["steps"] == {"count": STEPS, "first": 0,
                                                                            "last": STEPS - 1}
    assert set(doc["anomaly"]) == {"step", "kind", "tensor", "detail"}
    assert set(doc["origin"][0]) == {"tensor", "layer", "step", "phase", "z", "value", "window_median"}
    assert set(doc["cause"]) == {"class", "summary", "evidence", "advice"}
    assert doc["cause"]["class"] == "data" and doc["cause"]["advice"]
    assert {"window", "z_anomaly", "z_deviation", "lookback"} <= set(doc["method"])


def test_a_step_asked_about_is_explained(trials):
    report = diagnose(create_trial(trials["lr_spike"]), step=AT + 2)
    assert report.anomaly.kind == "asked" and report.anomaly.step == AT + 2
    assert report.onset == AT


def test_a_trial_without_the_signals_says_what_to_record(tmp_path):
    report = diagnose(create_trial(train(tmp_path / "losses", shuffled_targets, collections=("losses",))))
    assert report.found and report.anomaly.kind == "loss_spike"
    assert {"updates", "optimizer_state", "activation_outliers"} <= set(report.cause.record_next)
    assert "record_next" in report.to_dict() and "not recorded" in report.to_text()


def test_a_damaged_file_is_skipped_with_a_warning_and_nothing_is_written(trials, tmp_path, caplog):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(trials["shuffled"], copy)
    events = sorted((copy / "events").rglob("*.tfevents"))
    damaged = events[10]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    before = {p: p.stat().st_mtime_ns for p in copy.rglob("*")}
    with caplog.at_level("WARNING"):
        report = diagnose(create_trial(str(copy)))
    assert report.found and report.cause_name == "data"
    assert report.damaged and "damaged" in caplog.text
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*")} == before  # read only


def test_the_command_names_a_missing_trial(tmp_path, capsys):
    assert cli(["diagnose", str(tmp_path / "nothing")]) == 2
    assert str(tmp_path / "nothing") in capsys.readouterr().err


def test_a_trial_still_training_is_only_read(tmp_path):
    """A diagnosis of a live trial (no end marker yet) reads what is there and writes nothing."""
    out = tmp_path / "live"
    torch.manual_seed(0)
    model, loss_fn = Chain(), TokenLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    hook = smd.Hook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=1), include_collections=["stability"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    for x, y in _batches()[:40]:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    hook.flush() if hasattr(hook, "flush") else None
    listing = sorted(os.listdir(out))
    report = diagnose(create_trial(str(out)))
    assert not report.found
    assert sorted(os.listdir(out)) == listing
    hook.close()


POISONED = (2, 4)


def poisoned_samples(step, model, optimizer, batch):
    """Two samples of the batch at AT with labels from nowhere (a bad shard's rows)."""
    if step != AT:
        return batch
    x, y = batch
    y = y.clone()
    gen = torch.Generator().manual_seed(7)
    for i in POISONED:
        y[i] = torch.randint(0, VOCAB, (CONTEXT,), generator=gen)
    return x, y


def test_a_poisoned_batch_is_found_by_its_per_sample_losses_and_fingerprint(tmp_path):
    """The samples collection keeps each step's per-sample losses and input fingerprints: the
    diagnosis names the two poisoned samples of the batch, with the fingerprints a user finds
    them by in the pipeline (smd.fingerprint of the batch's inputs)."""
    out = train(tmp_path / "poisoned", poisoned_samples, collections=("stability", "samples"))
    report = diagnose(create_trial(out))
    assert report.found and report.onset == AT and report.cause_name == "data", report.to_text()
    named = {s["index"]: s for s in report.cause.samples}
    assert set(named) == set(POISONED), report.cause.samples
    inputs = _batches()[AT][0]
    expected = smd.fingerprint(inputs)
    for i in POISONED:
        assert named[i]["fingerprint"] == f"{int(expected[i].view(np.uint64)):016x}"
        assert named[i]["loss"] >= 3 * named[i]["batch_median"]
    assert any(e.cause == "data" and e.supports and "sample" in e.text for e in report.cause.evidence)
    text = report.to_text()
    assert all(f"sample {i}:" in text for i in POISONED)
    # what the user does with it: find the batch among the pipeline's by its fingerprints
    model_name = next(n for n in create_trial(out).tensor_names() if n.endswith("/fingerprint"))
    saved = create_trial(out).tensor(model_name).value(AT)
    assert [s for s, (x, _) in enumerate(_batches()) if (smd.fingerprint(x) == saved).all()] == [AT]


def test_a_worker_is_chosen_by_name(trials, capsys):
    report = create_trial(trials["lr_spike"]).diagnose(worker="worker_0")
    assert report.worker == "worker_0" and report.onset == AT
    with pytest.raises(MltraceValueError, match="no worker 'worker_7'.*worker_0"):
        diagnose(create_trial(trials["lr_spike"]), worker="worker_7")
    assert cli(["diagnose", trials["lr_spike"], "--worker", "worker_7"]) == 2
    assert "no worker 'worker_7'" in capsys.readouterr().err
