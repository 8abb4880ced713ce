"""One switch turns the stability signals on, wherever a hook is configured: smdebug's JSON
configuration (``{"CollectionName": "stability"}``), ``mltrace run --include-collections
stability``, and the Transformers and Lightning callbacks' ``include_collections=["stability"]``.
Each trains a tiny transformer a few steps and reads the trial back; the values themselves are
checked against plain PyTorch in tests/pytorch/test_stability_capture.py. Real smdebug reading
such a trial: tests/legacy/test_smdebug_reads_stability.py."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the model hub

import lightning as L  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

import mltrace  # noqa: E402
import mltrace.pytorch as smd  # noqa: E402
from mltrace.lightning import MltraceCallback as LightningCallback  # noqa: E402
from mltrace.modes import ModeKeys  # noqa: E402
from mltrace.stability.signals import (  # noqa: E402
    PREFIXES,
    SIGNAL_COLLECTIONS,
    STABILITY,
    parse_signal,
)
from mltrace.transformers import MltraceCallback  # noqa: E402
from mltrace.trials import create_trial  # noqa: E402
from tests.support.launch_runs import ROOT, check, environment, mltrace_run, plain  # noqa: E402
from tests.support.stability_models import HEADS, TinyGPT, TokenLoss, batches  # noqa: E402

#: The first path part of every signal tensor's name.
SIGNAL_PREFIXES = {p.rstrip("/") for p in PREFIXES.values()}


def signal_names(trial) -> set[str]:
    """The trial's signal tensors (the Trainer's own ``grad_norm`` metric is none)."""
    return {n for n in trial.tensor_names() if parse_signal(n) is not None}


def signal_prefixes(trial) -> set[str]:
    """The signal prefixes among the trial's tensor names."""
    return {n.split("/", 1)[0] for n in signal_names(trial)}


def check_the_set(trial, model: str, param: str, attention: list[str], loss: str,
                  steps: list[int]) -> None:
    """Every signal collection holds tensors (``model``'s, its parameter ``param``'s) at
    ``steps``; ``stability`` holds all of them and ``loss``; attention is one value per head of
    each module in ``attention``; weights hold no signal."""
    assert signal_prefixes(trial) == SIGNAL_PREFIXES
    assert {STABILITY, *SIGNAL_COLLECTIONS} <= set(trial.collections())
    for collection in SIGNAL_COLLECTIONS:
        names = trial.tensor_names(collection=collection)
        assert names and all(n.startswith(PREFIXES[collection]) for n in names), (collection, names)
    assert trial.tensor_names(collection="attention") == sorted(
        f"attention/{m}/{q}" for m in attention for q in ("max_logit", "entropy"))
    for name in trial.tensor_names(collection="attention"):
        assert trial.tensor(name).steps() == steps
        assert trial.tensor(name).value(steps[0]).shape == (HEADS,)
    for name in (f"logits/{model}/log_z_mean", f"grad_norm/{model}", f"grad_norm/{model}_{param}",
                 f"updates/{model}_{param}/ratio", f"optimizer_state/{model}_{param}/exp_avg_rms",
                 f"optimizer_state/{model}_{param}/eps_fraction"):
        assert trial.tensor(name).steps() == steps, name
    assert signal_names(trial) | {loss} <= set(trial.tensor_names(collection=STABILITY))
    assert not signal_names(trial) & set(trial.tensor_names(collection="weights"))


def train_tinygpt(hook: smd.Hook, steps: int) -> None:
    torch.manual_seed(0)
    model, loss_fn = TinyGPT(), TokenLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for x, y in batches(steps):
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hook.close()


# -- smdebug's JSON configuration --------------------------------------------------------------------
@pytest.mark.parametrize("parameters", [None, {"save_interval": "2"}], ids=["plain", "save_interval"])
def test_json_collection_stability_turns_the_set_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     parameters: dict[str, str] | None) -> None:
    """``{"CollectionName": "stability"}`` (through MLTRACE_CONFIG_FILE_PATH, as SageMaker hands
    the file over) saves every signal; its CollectionParameters' save_interval is theirs, beside
    weights that follow the hook's interval and hold no signal."""
    entry: dict[str, object] = {"CollectionName": "stability"}
    if parameters:
        entry["CollectionParameters"] = parameters
    config = {"LocalPath": str(tmp_path / "run"), "HookParameters": {"save_interval": "1"},
              "CollectionConfigurations": [entry, {"CollectionName": "weights"}]}
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("MLTRACE_CONFIG_FILE_PATH", str(path))
    train_tinygpt(smd.Hook.create_from_json_file(), steps=5)

    trial = create_trial(str(tmp_path / "run"))
    steps = [0, 2, 4] if parameters else [0, 1, 2, 3, 4]
    check_the_set(trial, "TinyGPT", "head.weight", ["blocks.0.attn", "blocks.1.attn"], "TokenLoss_output_0",
                  steps)
    assert trial.tensor("TinyGPT_head.weight").steps() == [0, 1, 2, 3, 4]
    assert "TinyGPT_head.weight" in trial.tensor_names(collection="weights")


# -- mltrace run ---------------------------------------------------------------------------------------
SCRIPT = """
import torch
from tests.support.stability_models import TinyGPT, TokenLoss, batches

torch.manual_seed(0)
model, loss_fn = TinyGPT(), TokenLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
for x, y in batches(3):
    loss = loss_fn(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"loss {loss.item():.6f}")
"""


@pytest.mark.parametrize("collections", ["stability", "attention,grad_norms"])
def test_mltrace_run_include_collections_stability(tmp_path: Path, collections: str) -> None:
    """An unmodified script under ``mltrace run --include-collections stability`` saves the set
    (a signal collection named alone saves only its own), and prints what a plain run prints."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = environment(PYTHONPATH=str(ROOT))  # the script imports the test models
    out = tmp_path / "trial"
    got = check(mltrace_run("--out-dir", str(out), "--save-interval", "1", "--include-collections",
                            collections, str(script), env=env))

    trial = create_trial(str(out))
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2]
    if collections == STABILITY:
        assert got == check(plain(script, env=env))
        check_the_set(trial, "TinyGPT", "head.weight", ["blocks.0.attn", "blocks.1.attn"],
                      "TokenLoss_output_0", [0, 1, 2])
        losses = [float(line.split()[1]) for line in got.splitlines() if line.startswith("loss ")]
        saved = [float(trial.tensor("TokenLoss_output_0").value(s)) for s in range(3)]
        np.testing.assert_allclose(saved, losses, rtol=1e-5)
    else:
        assert signal_prefixes(trial) == {"attention", "grad_norm"}


# -- Transformers ----------------------------------------------------------------------------------------
class Tokens(torch.utils.data.Dataset):
    """Random token sequences, each its own label (causal language modelling)."""

    def __init__(self, n: int, seed: int) -> None:
        self.ids = torch.randint(0, 40, (n, 8), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train_gpt2(out: Path, attn_implementation: str) -> None:
    """A tiny GPT-2 from a config, 3 AdamW steps (the Trainer's default optimizer). Dropout is
    off: sdpa and eager attention draw their dropout masks differently, and the two runs must
    compute the same numbers."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=40, n_positions=16, n_embd=32, n_layer=2, n_head=HEADS,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2,
                        bos_token_id=0, eos_token_id=0, attn_implementation=attn_implementation)
    model = GPT2LMHeadModel(config)
    assert model.config._attn_implementation == attn_implementation
    callback = MltraceCallback(out_dir=str(out), save_config=mltrace.SaveConfig(save_interval=1),
                               include_collections=[STABILITY])
    args = TrainingArguments(output_dir=str(out.parent / f"hf_{attn_implementation}"),
                             per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3,
                             report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True,
                             seed=0, dataloader_num_workers=0, logging_steps=1)
    Trainer(model=model, args=args, train_dataset=Tokens(32, 1), callbacks=[callback]).train()
    callback.close()


def test_transformers_gpt2_sdpa_and_eager_attention_give_the_same_signals(tmp_path: Path) -> None:
    """GPT-2's attention is seen through scaled_dot_product_attention ("sdpa") and through the
    softmax it materialises ("eager"): per head, the same largest logit and entropy."""
    trials = {}
    for impl in ("sdpa", "eager"):
        train_gpt2(tmp_path / impl, impl)
        trials[impl] = trial = create_trial(str(tmp_path / impl))
        assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2]
        # lm_head.weight is tied to transformer.wte.weight: one parameter, named once
        check_the_set(trial, "GPT2LMHeadModel", "transformer.wte.weight",
                      ["transformer.h.0.attn", "transformer.h.1.attn"], "loss_output_0", [0, 1, 2])
        assert "grad_norm" in trial.tensor_names(collection="metrics")  # the Trainer's, beside ours
    sdpa, eager = trials["sdpa"], trials["eager"]
    assert sdpa.tensor_names() == eager.tensor_names()
    # Step 0 has the same weights and batch in both runs: the two ways of seeing attention
    # agree to float rounding. After it the runs' weights differ a little: the two kernels'
    # gradients differ by rounding, and Adam's first steps scale every gradient to about the
    # learning rate, rounding noise included (the attention key bias, whose true gradient is 0,
    # moves by up to lr either way), so later steps agree only to that.
    for name in sdpa.tensor_names(collection="attention"):
        for step, rtol in ((0, 1e-5), (1, 2e-3), (2, 2e-3)):
            np.testing.assert_allclose(eager.tensor(name).value(step), sdpa.tensor(name).value(step),
                                       rtol=rtol, err_msg=f"{name} at step {step}")


# -- Lightning -----------------------------------------------------------------------------------------
class LitGPT(L.LightningModule):
    """TinyGPT in a LightningModule whose training_step calls ``self(x)`` (its forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = TinyGPT()
        self.loss_fn = TokenLoss()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.gpt(tokens)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss_fn(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def test_lightning_callback_include_collections_stability(tmp_path: Path) -> None:
    """With gradient accumulation 2, a TRAIN step is an optimizer step: its signals are saved
    once per step (attention merged over its two micro-batches)."""
    torch.manual_seed(0)
    callback = LightningCallback(out_dir=str(tmp_path / "trial"), save_config=mltrace.SaveConfig(save_interval=1),
                                 include_collections=[STABILITY])
    trainer = L.Trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=[callback], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path / "pl"), accelerator="cpu")
    trainer.fit(LitGPT(), torch.utils.data.DataLoader(batches(4), batch_size=None))
    callback.close()

    trial = create_trial(str(tmp_path / "trial"))
    assert trainer.global_step == 2 and trial.steps(mode=ModeKeys.TRAIN) == [0, 1]
    check_the_set(trial, "LitGPT", "gpt.head.weight", ["gpt.blocks.0.attn", "gpt.blocks.1.attn"],
                  "loss_output_1", [0, 1])
    assert "train_loss" in trial.tensor_names(collection="metrics")
