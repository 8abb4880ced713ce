"""Models for the pickling tests (tests/pytorch/test_pytorch_pickling.py), and the function a spawned
process runs on them. Imports nothing of mltrace: a spawned child checks that unpickling a
hooked model never brings mltrace in."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

#: Module attributes that hold forward hooks.
HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
              "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))


def gpt2() -> nn.Module:
    """A two-layer GPT-2 built from its config (Transformers; nothing downloaded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    return GPT2LMHeadModel(config)


def batch(model: nn.Module) -> Any:
    """An input for ``model`` (GPT-2 or the MLP, maybe what torch.compile returned)."""
    inner = getattr(model, "_orig_mod", model)
    if isinstance(inner, nn.Sequential):
        return torch.randn(2, 4)
    return torch.randint(0, 40, (2, 8))


def train_step(model: nn.Module) -> float:
    """One forward, backward and SGD step; the loss."""
    out = model(batch(model))
    logits = out if isinstance(out, torch.Tensor) else out.logits
    loss = logits.float().pow(2).mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.01 * p.grad
                p.grad = None
    return float(loss.detach())


def hook_entries(model: nn.Module) -> int:
    """How many forward hooks and pre-hooks ``model`` and its submodules hold, plus instance
    attributes that are not torch's own (``__reduce_ex__``, a replaced ``forward``)."""
    count = 0
    for module in model.modules():
        count += sum(len(getattr(module, name, None) or ()) for name in HOOK_DICTS)
        count += "__reduce_ex__" in vars(module)
        forward = vars(module).get("forward")
        if forward is not None and (not hasattr(module, "_orig_mod")  # torch.compile sets its own
                                    or "boundary" in getattr(forward, "__qualname__", "")):
            count += 1
    return count


def child_trains(models: list[nn.Module], results: Any) -> None:
    """What a spawned process runs on unpickled models: train each a step, report whether any
    mltrace module was imported and how many hook entries the models hold."""
    losses = [train_step(m) for m in models]
    results.put({"losses": losses,
                 "mltrace_imported": sorted(n for n in sys.modules if n.split(".")[0] == "mltrace"),
                 "hook_entries": [hook_entries(m) for m in models]})
