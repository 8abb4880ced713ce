"""The stability signals the PyTorch hook saves (mltrace.pytorch.stability), checked against a
plain-PyTorch computation of the same quantities on the same training, plus what a user sees
when a signal cannot be recorded. FSDP2's shards: tests/pytorch/test_pytorch_fsdp.py."""

from __future__ import annotations

import logging
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mltrace.pytorch as smd
from mltrace.pytorch.stability.statistics import sdpa_statistics
from mltrace.trials import create_trial
from tests.support.stability_models import HEADS, WIDTH, TinyGPT, TokenLoss, batches


def _train(out: Path, model: nn.Module, steps: int = 3, collections: list[str] | None = None,
           optimizer: str = "adamw", interval: int = 1, record: Any = None) -> Any:
    """Train ``model`` with the hook; ``record(step, model, opt, phase)`` sees each phase."""
    hook = smd.Hook(out_dir=str(out), include_collections=collections or ["stability"],
                    save_config=smd.SaveConfig(save_interval=interval))
    loss_fn = TokenLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = (torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=0.1))
    for step, (x, y) in enumerate(batches(steps)):
        logits = model(x)
        loss = loss_fn(logits, y)
        opt.zero_grad()
        loss.backward()
        if record:
            record(step, model, opt, "before", logits)
        opt.step()
        if record:
            record(step, model, opt, "after", logits)
    hook.close()
    return create_trial(str(out))


def _expected_attention(attn: nn.Module, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    q, k, _ = attn.heads(x)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(WIDTH // HEADS)
    t = x.shape[1]
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    p = torch.softmax(scores, -1)
    entropy = -(torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))).sum(-1)
    return scores.amax(dim=(0, 2, 3)).detach().numpy(), entropy.mean(dim=(0, 2)).detach().numpy()


@pytest.mark.parametrize("eager", [False, True], ids=["sdpa", "eager-softmax"])
def test_signals_equal_a_plain_pytorch_computation(tmp_path: Path, eager: bool) -> None:
    torch.manual_seed(0)
    model = TinyGPT(eager=eager)
    seen: dict[tuple[int, str], Any] = {}
    attn_in: dict[int, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}
    step_of = {"n": 0}
    model.blocks[1].attn.register_forward_pre_hook(lambda m, a: attn_in.__setitem__(step_of["n"], a[0].detach()))
    model.blocks[0].fc.register_forward_hook(lambda m, a, o: outputs.__setitem__(f"fc{step_of['n']}", o.detach()))

    def record(step: int, model: nn.Module, opt: torch.optim.Optimizer, phase: str, logits: torch.Tensor) -> None:
        step_of["n"] = step + 1
        params = dict(model.named_parameters())
        if phase == "before":
            seen[step, "grads"] = {n: p.grad.detach().clone() for n, p in params.items()}
            seen[step, "before"] = {n: p.detach().clone() for n, p in params.items()}
            seen[step, "logits"] = logits.detach()
        else:
            seen[step, "after"] = {n: p.detach().clone() for n, p in params.items()}
            seen[step, "state"] = {n: {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
                                   for n, p in params.items()}

    trial = _train(tmp_path, model, record=record)
    with torch.no_grad():
        for step in range(3):
            value = lambda name, step=step: trial.tensor(name).value(step)  # noqa: E731
            # attention: per head, the largest logit and the mean entropy
            best, entropy = _expected_attention(model_at(seen, step, eager).blocks[1].attn, attn_in[step])
            np.testing.assert_allclose(value("attention/blocks.1.attn/max_logit"), best, rtol=1e-5)
            np.testing.assert_allclose(value("attention/blocks.1.attn/entropy"), entropy, rtol=1e-5)
            assert value("attention/blocks.0.attn/max_logit").shape == (HEADS,)
            # output logits
            logits = seen[step, "logits"].reshape(-1, seen[step, "logits"].shape[-1])
            log_z = torch.logsumexp(logits, -1)
            p = torch.softmax(logits, -1)
            np.testing.assert_allclose(value("logits/TinyGPT/log_z_mean"), log_z.mean(), rtol=1e-5)
            np.testing.assert_allclose(value("logits/TinyGPT/log_z_max"), log_z.max(), rtol=1e-5)
            np.testing.assert_allclose(value("logits/TinyGPT/max"), logits.max(), rtol=1e-5)
            np.testing.assert_allclose(value("logits/TinyGPT/entropy"), (-(p * p.log()).sum(-1)).mean(), rtol=1e-5)
            # a module's output: max |a|, the lower median of |a| (48 x 16 elements: all sampled), L2
            out = outputs[f"fc{step}"].abs().reshape(-1).numpy()
            lower_median = np.sort(out)[(out.size - 1) // 2]
            np.testing.assert_allclose(value("activations/blocks.0.fc/abs_max"), out.max(), rtol=1e-6)
            np.testing.assert_allclose(value("activations/blocks.0.fc/abs_median"), lower_median, rtol=1e-6)
            np.testing.assert_allclose(value("activations/blocks.0.fc/max_over_median"), out.max() / lower_median, rtol=1e-5)
            np.testing.assert_allclose(value("activations/blocks.0.fc/l2"), np.linalg.norm(out), rtol=1e-5)
            # gradient norms, before the optimizer steps
            grads = seen[step, "grads"]
            for name, g in grads.items():
                np.testing.assert_allclose(value(f"grad_norm/TinyGPT_{name}"), g.norm(), rtol=1e-5)
            np.testing.assert_allclose(value("grad_norm/TinyGPT"),
                                       torch.sqrt(sum((g * g).sum() for g in grads.values())), rtol=1e-5)
            # the update the optimizer applied, and Adam's state after it
            for name in grads:
                before, after = seen[step, "before"][name], seen[step, "after"][name]
                delta = after - before
                np.testing.assert_allclose(value(f"updates/TinyGPT_{name}/l2"), delta.norm(), rtol=1e-4)
                np.testing.assert_allclose(value(f"updates/TinyGPT_{name}/abs_max"), delta.abs().max(), rtol=1e-4)
                np.testing.assert_allclose(value(f"updates/TinyGPT_{name}/ratio"), delta.norm() / before.norm(), rtol=1e-4)
                state = seen[step, "state"][name]
                m, v, t = state["exp_avg"], state["exp_avg_sq"], float(state["step"])
                v_hat = v / (1 - 0.999 ** t)
                g = grads[name]
                prefix = f"optimizer_state/TinyGPT_{name}/"
                np.testing.assert_allclose(value(prefix + "exp_avg_rms"), m.pow(2).mean().sqrt(), rtol=1e-5)
                np.testing.assert_allclose(value(prefix + "exp_avg_abs_max"), m.abs().max(), rtol=1e-5)
                np.testing.assert_allclose(value(prefix + "exp_avg_sq_mean"), v_hat.mean(), rtol=1e-5)
                np.testing.assert_allclose(value(prefix + "exp_avg_sq_max"), v_hat.max(), rtol=1e-5)
                positive = v > 0
                near_eps = positive & (v_hat.sqrt() < 10 * 1e-8)
                np.testing.assert_allclose(value(prefix + "eps_fraction"),
                                           near_eps.sum() / max(int(positive.sum()), 1), atol=1e-7)
                np.testing.assert_allclose(value(prefix + "grad_sq_ratio"), (g * g).sum() / v_hat.sum(), rtol=1e-5)


def model_at(seen: dict[tuple[int, str], Any], step: int, eager: bool) -> nn.Module:
    """A copy of the model with the parameters it had at ``step``'s forward pass."""
    copy = TinyGPT(eager=eager)
    copy.load_state_dict(seen[step, "before"])
    return copy


def test_sdpa_statistics_handle_masks_grouped_heads_and_long_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A boolean mask, an additive mask, fewer key heads than query heads, and query rows in
    chunks give what the whole score matrix gives; a fully masked row has no entropy."""
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 4, 6, 8, generator=gen), torch.randn(2, 2, 9, 8, generator=gen)
    keep = torch.rand(6, 9, generator=gen) > 0.3
    keep[2] = False  # a query that sees no key
    kk = k.repeat_interleave(2, dim=1)
    scores = (q @ kk.transpose(-2, -1)) * 0.5
    scores = scores.masked_fill(~keep, float("-inf"))
    p = torch.softmax(scores, -1)
    rows = keep.any(-1)
    entropy = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)[:, :, rows]
    want_max, want_entropy = scores.amax(dim=(0, 2, 3)), entropy.mean(dim=(0, 2))
    for mask in (keep, torch.zeros(6, 9).masked_fill(~keep, float("-inf"))):
        best, ent = sdpa_statistics(q, k, mask, scale=0.5)
        torch.testing.assert_close(best, want_max)
        torch.testing.assert_close(ent, want_entropy)
    monkeypatch.setattr("mltrace.pytorch.stability.statistics.SCORE_CHUNK_ELEMENTS", 2 * 4 * 9)  # one row a chunk
    best, ent = sdpa_statistics(q, k, keep, scale=0.5)
    torch.testing.assert_close(best, want_max)
    torch.testing.assert_close(ent, want_entropy)


def test_signals_follow_the_save_interval_and_stay_out_of_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trial = _train(tmp_path, TinyGPT(), steps=12, interval=5)
    assert trial.tensor("attention/blocks.0.attn/max_logit").steps() == [0, 5, 10]
    assert trial.tensor("grad_norm/TinyGPT").steps() == [0, 5, 10]
    assert trial.tensor_names(collection="weights") == []  # weights were not saved
    names = trial.tensor_names(collection="attention")
    assert names == ["attention/blocks.0.attn/entropy", "attention/blocks.0.attn/max_logit",
                     "attention/blocks.1.attn/entropy", "attention/blocks.1.attn/max_logit"]
    assert "grad_norm/TinyGPT_head.weight" in trial.tensor_names(collection="stability")
    assert "TokenLoss_output_0" in trial.tensor_names(collection="stability")


def test_weights_saved_beside_signals_hold_only_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trial = _train(tmp_path, TinyGPT(), steps=2, collections=["stability", "weights"])
    weights = trial.tensor_names(collection="weights")
    assert "TinyGPT_head.weight" in weights
    assert all(n.startswith("TinyGPT_") for n in weights), weights


def test_only_the_named_signal_collections_are_computed(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trial = _train(tmp_path, TinyGPT(), steps=2, collections=["logits", "grad_norms"])
    prefixes = {n.split("/")[0] for n in trial.tensor_names()}
    assert prefixes == {"logits", "grad_norm", "TokenLoss_output_0"}


def test_a_model_without_attention_and_sgd_say_what_stays_empty(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(11, WIDTH)
            self.fc = nn.Linear(WIDTH, 11)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.fc(self.wte(tokens))

    with caplog.at_level(logging.WARNING):
        trial = _train(tmp_path, Mlp(), steps=2, optimizer="sgd")
    text = caplog.text
    assert "the attention collection stays empty" in text and "scaled_dot_product_attention" in text
    assert "the optimizer_state collection stays empty" in text and "Adam" in text
    assert text.count("attention collection stays empty") == 1  # once, not every step
    assert "updates/Mlp_fc.weight/ratio" in trial.tensor_names()  # what can be recorded is


def test_a_misspelt_collection_name_suggests_stability(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        trial = _train(tmp_path, TinyGPT(), steps=1, collections=["stabilty"])
    assert "Did you mean 'stability' for 'stabilty'?" in caplog.text
    assert trial.tensor_names() == ["TokenLoss_output_0"]  # what was asked for is written still


def test_the_attention_functions_are_torchs_again_after_close(tmp_path: Path) -> None:
    sdpa, softmax = F.scaled_dot_product_attention, F.softmax
    hook = smd.Hook(out_dir=str(tmp_path), include_collections=["stability"])
    model = TinyGPT()
    hook.register_module(model)
    model(batches(1)[0][0])
    assert F.scaled_dot_product_attention is not sdpa  # listening
    hook.close()
    assert F.scaled_dot_product_attention is sdpa and F.softmax is softmax


def test_a_model_with_the_signals_on_still_pickles(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    _train(tmp_path, model, steps=1)
    copy = pickle.loads(pickle.dumps(model))
    assert not copy.blocks[0].fc._forward_hooks
    torch.testing.assert_close(copy(batches(1)[0][0]), model(batches(1)[0][0]))


def test_compiled_model_adds_no_graph_break(tmp_path: Path) -> None:
    """With the signals on, torch.compile's graph breaks are those of the model alone; the
    signals computed outside the compiled region (logits, the optimizer's) are saved."""
    dynamo = pytest.importorskip("torch._dynamo")
    from torch._dynamo.utils import counters

    def breaks(with_hook: bool, out: Path) -> int:
        dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = TinyGPT()
        compiled = torch.compile(model, backend="eager")
        hook = smd.Hook(out_dir=str(out), include_collections=["stability"],
                        save_config=smd.SaveConfig(save_interval=2)) if with_hook else None
        if hook:
            hook.register_module(compiled)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        for x, y in batches(4):
            loss = F.cross_entropy(compiled(x).reshape(-1, 11), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if hook:
            hook.close()
        return sum(counters["graph_break"].values())

    assert breaks(True, tmp_path / "hooked") == breaks(False, tmp_path / "plain")
    trial = create_trial(str(tmp_path / "hooked"))
    assert trial.tensor("logits/TinyGPT/log_z_mean").steps() == [0, 2]
    assert trial.tensor("updates/TinyGPT_head.weight/ratio").steps() == [0, 2]


def test_grad_norms_are_taken_before_clipping(tmp_path: Path) -> None:
    """A loop that clips (nanoGPT, the Trainer, Lightning): the saved norms are those
    clip_grad_norm_ measured and returned, not the clipped ones, so a spike still shows."""
    torch.manual_seed(0)
    model = TinyGPT()
    hook = smd.Hook(out_dir=str(tmp_path), include_collections=["grad_norms"],
                    save_config=smd.SaveConfig(save_interval=1))
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    returned, head = [], []
    for x, y in batches(3):
        loss = F.cross_entropy(model(x).reshape(-1, 11), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        head.append(float(model.head.weight.grad.norm()))
        returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e-3)))
        opt.step()
    hook.close()
    trial = create_trial(str(tmp_path))
    np.testing.assert_allclose([trial.tensor("grad_norm/TinyGPT").value(s) for s in range(3)], returned, rtol=1e-5)
    np.testing.assert_allclose([trial.tensor("grad_norm/TinyGPT_head.weight").value(s) for s in range(3)], head, rtol=1e-5)
    assert min(returned) > 1e-2  # far above the clipped norm
    assert torch.nn.utils.clip_grad_norm_.__module__ == "torch.nn.utils.clip_grad"  # torch's again


def test_a_stability_rule_from_the_rule_cli_names_module_layer_and_head(tmp_path: Path) -> None:
    """The rule CLI on a trial the hook wrote: a threshold every head's logits pass fires at the
    first step, naming the module, its layer and the head; the defaults find nothing."""
    import subprocess
    import sys

    torch.manual_seed(0)
    _train(tmp_path, TinyGPT(), steps=3)
    base = [sys.executable, "-m", "mltrace.rules.rule_invoker", "--trial-dir", str(tmp_path),
            "--rule-name", "AttentionLogitGrowth"]
    quiet = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    fired = subprocess.run([*base, "--max_logit", "0.001"], capture_output=True, text=True, timeout=120)
    assert fired.returncode == 1, fired.stdout + fired.stderr
    out = fired.stdout + fired.stderr
    assert "step 0" in out and "attention/blocks.0.attn/max_logit head 0" in out and "layer blocks.0" in out


def test_a_hook_closed_before_its_first_step_writes_nothing_and_raises_nothing(tmp_path: Path) -> None:
    sdpa = F.scaled_dot_product_attention
    hook = smd.Hook(out_dir=str(tmp_path / "run"), include_collections=["stability"], strict=True)
    hook.register_module(TinyGPT())
    hook.close()
    assert F.scaled_dot_product_attention is sdpa
