r"""examples/mxnet/gluon_cnn.py with its mltrace lines removed: plain MXNet Gluon (.venv-legacy).

The training half of the original, without the hook (and without the half that reads the
trial). Run it under ``mltrace run`` with gluon_cnn.json (the original's hook in smdebug's
configuration format)::

    .venv-legacy/bin/mltrace run --config examples/zero_change/gluon_cnn.json \
        examples/zero_change/gluon_cnn.py

tests/legacy/test_launch_mxnet.py checks that it leaves the trial the original leaves.
"""

from __future__ import annotations

import argparse
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

INITIALIZERS = {"good": (mx.init.Xavier(), 0.1), "bad": (mx.init.Uniform(1), 0.001)}


def build_model() -> tuple[nn.HybridSequential, gluon.loss.Loss]:
    """conv0/conv1 with ReLU, as the notebook's network is named (a fresh name scope)."""
    with mx.name.NameManager():
        net = nn.HybridSequential()
        net.add(nn.Conv2D(6, 5, activation="relu"), nn.MaxPool2D(2),
                nn.Conv2D(8, 5, activation="relu"), nn.MaxPool2D(2),
                nn.Flatten(), nn.Dense(10))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    return net, loss_fn


def synthetic_batches(steps: int, batch_size: int,
                      seed: int) -> list[tuple[mx.nd.NDArray, mx.nd.NDArray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        labels = rng.integers(0, 10, batch_size)
        shift = labels[:, None, None, None] / 10
        images = rng.standard_normal((batch_size, 1, 28, 28)) * 0.5 + shift
        out.append((mx.nd.array(images), mx.nd.array(labels)))
    return out


def train(args: argparse.Namespace) -> None:
    mx.random.seed(args.seed)
    net, loss_fn = build_model()
    init, lr = INITIALIZERS[args.initializer]
    net.initialize(init)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr})
    data = synthetic_batches(args.steps + args.eval_steps, args.batch_size, args.seed)
    for epoch in range(args.epochs):
        for x, y in data[:args.steps]:
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(args.batch_size)
        correct = 0
        for x, y in data[args.steps:]:
            out = net(x)
            loss_fn(out, y)
            correct += int((out.argmax(axis=1) == y).sum().asscalar())
        total = max(1, args.eval_steps * args.batch_size)
        print(f"epoch {epoch}: last train loss {loss.mean().asscalar():.4f}, "
              f"eval accuracy {correct / total:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A Gluon CNN, no mltrace lines")
    parser.add_argument("--initializer", choices=sorted(INITIALIZERS), default="good")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="TRAIN steps per epoch")
    parser.add_argument("--eval-steps", type=int, default=4, help="EVAL steps per epoch")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    train(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
