"""Tiny Gluon models and a training loop that records what a hook should have saved.

Shared by the MXNet tests of the legacy suite (imported as a plain module: tests/ has no
__init__.py). Block names come from MXNet's process-wide name counters, so models are built in a
fresh ``mx.name.NameManager()`` and get the same names in every test: ``conv0``, ``conv0_relu``,
``pool0``, ``conv1``, ``conv1_relu``, ``flatten0``, ``dense0`` (the CNN of seed 002's notebook),
``dense0``, ``dense0_relu``, ``dense1`` (the MLP), ``softmaxcrossentropyloss0``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

Expected = dict[tuple[str, int], dict[str, np.ndarray]]


def build_cnn(seed: int = 0) -> tuple[gluon.HybridBlock, gluon.loss.Loss]:
    """conv0(+relu) -> pool0 -> conv1(+relu) -> flatten0 -> dense0, for 1x10x10 inputs."""
    mx.random.seed(seed)
    with mx.name.NameManager():
        net = nn.HybridSequential()
        net.add(nn.Conv2D(4, 3, activation="relu"), nn.MaxPool2D(),
                nn.Conv2D(4, 3, activation="relu"), nn.Flatten(), nn.Dense(3))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    net.initialize(mx.init.Xavier())
    return net, loss_fn


def build_mlp(seed: int = 0) -> tuple[gluon.HybridBlock, gluon.loss.Loss]:
    """dense0(+relu) 5 -> 8 -> dense1 -> 3."""
    mx.random.seed(seed)
    with mx.name.NameManager():
        net = nn.HybridSequential()
        net.add(nn.Dense(8, activation="relu", in_units=5), nn.Dense(3, in_units=8))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    net.initialize(mx.init.Xavier())
    return net, loss_fn


def batch(net: gluon.Block, step: int, n: int = 4) -> tuple[mx.nd.NDArray, mx.nd.NDArray]:
    """A fixed batch per step for ``net`` (image batches for the CNN, vectors for the MLP)."""
    rng = np.random.default_rng(1000 + step)
    conv = isinstance(net[0], nn.Conv2D)
    shape = (n, 1, 10, 10) if conv else (n, 5)
    return mx.nd.array(rng.standard_normal(shape)), mx.nd.array(rng.integers(0, 3, n))


def train(net: gluon.Block, loss_fn: gluon.loss.Loss, schedule: Iterable[tuple[str, int]],
          set_mode: Callable[[str], Any] | None = None,
          io_blocks: Iterable[gluon.Block] = (), lr: float = 0.1) -> tuple[Expected, dict]:
    """Run ``schedule`` ([(mode, steps), ...]) and record, per (mode, mode step), every value a
    hook saving parameters, gradients (TRAIN), the loss and the I/O of ``io_blocks`` must write:
    parameters and gradients as they are after the step's update (MXNet's lifecycle).

    Returns (expected values, {(mode, mode step): global step}).
    """
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr})
    expected: Expected = defaultdict(dict)
    current: dict[str, Any] = {}

    def recorder(block: gluon.Block, inputs: Any, outputs: Any) -> None:
        values = expected[current["key"]]
        for suffix, group in (("_input_", inputs), ("_output_", outputs)):
            arrays = list(group) if isinstance(group, (tuple, list)) else [group]
            for i, a in enumerate(arrays):
                if isinstance(a, mx.nd.NDArray):
                    values[f"{block.name}{suffix}{i}"] = a.asnumpy()

    for block in io_blocks:
        block.register_forward_hook(recorder)
    mode_steps: dict[str, int] = defaultdict(int)
    global_of: dict[tuple[str, int], int] = {}
    step = 0
    for mode, n in schedule:
        if set_mode is not None:
            set_mode(mode)
        for _ in range(n):
            key = (mode, mode_steps[mode])
            current["key"] = key
            global_of[key] = step
            x, y = batch(net, step)
            if mode == "TRAIN":
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                trainer.step(x.shape[0])
            else:
                loss = loss_fn(net(x), y)
            values = expected[key]
            values[f"{loss_fn.name}_output_0"] = loss.asnumpy()
            for param in net.collect_params().values():
                values[param.name] = param.data().asnumpy()
                if mode == "TRAIN":
                    values[f"gradient/{param.name}"] = param.grad().asnumpy()
            mode_steps[mode] += 1
            step += 1
    return dict(expected), global_of


def param_names(net: gluon.Block) -> list[str]:
    return [p.name for p in net.collect_params().values()]
