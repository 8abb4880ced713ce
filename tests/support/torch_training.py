"""A tiny PyTorch training loop that records what it computed, for round-trip tests."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn


@dataclass
class Captured:
    """Values seen in the process, by tensor name then mode step."""

    values: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)

    def add(self, name: str, step: int, value: torch.Tensor) -> None:
        self.values.setdefault(name, {})[step] = value.detach().clone().numpy()


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def train(model: nn.Module, hook, steps: int, mode=None, captured: Captured | None = None,
          loss_fn: nn.Module | None = None, lr: float = 0.05, start: int = 0) -> Captured:
    """Run ``steps`` SGD steps (forward only when mode is EVAL/PREDICT), capturing parameters
    before each step's update, gradients and losses."""
    captured = captured or Captured()
    loss_fn = loss_fn or nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    train_mode = mode is None or getattr(mode, "name", "") in ("TRAIN", "GLOBAL")
    if mode is not None:
        hook.set_mode(mode)
    gen = torch.Generator().manual_seed(1234 + start)
    for i in range(start, start + steps):
        x = torch.randn(16, 4, generator=gen)
        y = torch.randn(16, 1, generator=gen)
        for name, p in model.named_parameters():
            captured.add(f"{model._get_name()}_{name}", i, p)
        if train_mode:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            for name, p in model.named_parameters():
                if p.grad is not None:
                    captured.add(f"gradient/{model._get_name()}_{name}", i, p.grad)
            opt.step()
        else:
            with torch.no_grad():
                loss = loss_fn(model(x), y)
        captured.add(f"{loss_fn._get_name()}_output_0", i, loss)
    return captured
