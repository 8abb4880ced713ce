"""examples/pytorch/pytorch_hook_demos.py with its mltrace lines removed: plain PyTorch.

Run it under ``mltrace run`` with one of the JSON files beside it (each is one of the original's
``--hook-type`` / ``--rule_type`` hooks, in smdebug's configuration format)::

    mltrace run --config examples/zero_change/pytorch_saveall.json \
        examples/zero_change/pytorch_hook_demos.py --steps 5

tests/launch/test_launch_examples.py checks that it leaves the trial the original leaves: the same
tensor names, steps and values.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn, optim

RULE_TYPES = ["vanishing_grad", "exploding_tensor", "none"]
RULE_HYPERPARAMETERS = {"vanishing_grad": (1.0, 0.9), "exploding_tensor": (1e10, 0.9)}


class Net(nn.Module):
    """The network of the Tornasole document."""

    def __init__(self) -> None:
        super().__init__()
        self.add_module("fc1", nn.Linear(20, 500))
        self.add_module("relu1", nn.ReLU())
        self.add_module("fc2", nn.Linear(500, 10))
        self.add_module("relu2", nn.ReLU())
        self.add_module("fc3", nn.Linear(10, 4))

    def forward(self, x_in: torch.Tensor) -> torch.Tensor:
        fc1_out = self.fc1(x_in)
        relu1_out = self.relu1(fc1_out)
        fc2_out = self.fc2(relu1_out)
        relu2_out = self.relu2(fc2_out)
        fc3_out = self.fc3(relu2_out)
        out = F.log_softmax(fc3_out, dim=1)
        return out


def synthetic_batches(steps: int, batch_size: int, generator: torch.Generator):
    """Random inputs in [0, 1) labelled by a fixed random linear 'teacher' (a learnable task)."""
    teacher = torch.randn(20, 4, generator=generator)
    for _ in range(steps):
        data = torch.rand(batch_size, 20, generator=generator)
        yield data, ((data - 0.5) @ teacher).argmax(dim=1)


def train(model: nn.Module, optimizer: optim.Optimizer, loss_fn: nn.Module, steps: int,
          batch_size: int, seed: int) -> list[float]:
    """Train ``steps`` SGD steps; returns the loss of every step."""
    model.train()
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for data, target in synthetic_batches(steps, batch_size, generator):
        optimizer.zero_grad()
        output = model(data)
        loss = loss_fn(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Tornasole's PyTorch demo, no mltrace lines")
    parser.add_argument("--rule_type", choices=RULE_TYPES, default="none")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 50 if args.rule_type == "none" else 30
    torch.manual_seed(args.seed)
    model = Net().to(torch.device("cpu"))
    if args.rule_type == "none":
        lr, momentum = args.lr, args.momentum
    else:
        lr, momentum = RULE_HYPERPARAMETERS[args.rule_type]
    optimizer = optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.NLLLoss()
    print(f"training {args.steps} steps (lr={lr:g}, momentum={momentum:g})")
    losses = train(model, optimizer, loss_fn, args.steps, args.batch_size, args.seed)
    print(f"loss: first {losses[0]:.4g}, last {losses[-1]:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
