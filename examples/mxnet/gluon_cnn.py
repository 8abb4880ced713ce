r"""Train a small Gluon CNN with mltrace's MXNet hook, then analyse the trial (seed 002's setting).

The model is the notebook's: conv0 (ReLU) -> pool -> conv1 (ReLU) -> dense, trained on
synthetic 28x28 "digits" (random images whose class shifts their mean), offline and on the CPU.
``--initializer bad`` is the notebook's poorly configured run (Uniform(1) weights, lr 0.001): its
gradients are orders of magnitude larger and its loss stays far higher, which the analysis
printed at the end shows. Runs in .venv-legacy (MXNet 1.9.1 needs numpy<1.24).

    .venv-legacy/bin/python examples/mxnet/gluon_cnn.py --out-dir ./demo-output/mxnet_good
    .venv-legacy/bin/python examples/mxnet/gluon_cnn.py --out-dir ./demo-output/mxnet_bad \
        --initializer bad --save-all
    .venv-legacy/bin/python examples/mxnet/gluon_cnn.py --config hook.json
                                # smdebug's JSON hook configuration; LocalPath is the trial

What is saved: weights, biases, gradients, the loss, and the inputs/outputs of the two ReLU
blocks (collection ``relu_activations``), every ``--save-interval`` steps; ``--save-all`` saves
every tensor of every block. Each epoch has TRAIN steps, then EVAL steps (no gradients).
Parameters and gradients of a step are its values after the optimizer update (MXNet's lifecycle).
"""

from __future__ import annotations

import argparse
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mltrace.mxnet as smd
from mltrace.trials import create_trial

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


def create_hook(args: argparse.Namespace, net: nn.HybridSequential) -> smd.Hook:
    if args.config:  # smdebug's JSON file: its LocalPath is the trial directory
        return smd.Hook.create_from_json_file(args.config)
    hook = smd.Hook(
        out_dir=args.out_dir, save_config=smd.SaveConfig(save_interval=args.save_interval),
        include_collections=["weights", "biases", "gradients", "losses", "relu_activations"],
        save_all=args.save_all)
    relu = hook.get_collection("relu_activations")
    for conv in (net[0], net[2]):  # their ReLUs are child blocks named conv0_relu, conv1_relu
        relu.add_block_tensors(conv.act, inputs=True, outputs=True)
    return hook


def train(args: argparse.Namespace) -> str:
    mx.random.seed(args.seed)
    net, loss_fn = build_model()
    init, lr = INITIALIZERS[args.initializer]
    net.initialize(init)
    if args.hybridize:
        # Before registering: MXNet warns when a block with hooks is hybridized. Hybridized,
        # the children run as one graph and their inputs/outputs are not visible to any hook.
        net.hybridize()
    hook = create_hook(args, net)
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr})
    data = synthetic_batches(args.steps + args.eval_steps, args.batch_size, args.seed)
    for epoch in range(args.epochs):
        hook.set_mode(smd.modes.TRAIN)
        for x, y in data[:args.steps]:
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(args.batch_size)
        hook.set_mode(smd.modes.EVAL)
        correct = 0
        for x, y in data[args.steps:]:
            out = net(x)
            loss_fn(out, y)
            correct += int((out.argmax(axis=1) == y).sum().asscalar())
        total = max(1, args.eval_steps * args.batch_size)
        print(f"epoch {epoch}: last train loss {loss.mean().asscalar():.4f}, "
              f"eval accuracy {correct / total:.2f}")
    hook.close()
    return hook.out_dir


def analyse(out_dir: str) -> None:
    """The notebook's questions, asked with the trial API."""
    trial = create_trial(out_dir)
    print(f"trial {out_dir}: TRAIN steps {trial.steps(mode=smd.modes.TRAIN)}, "
          f"EVAL steps {trial.steps(mode=smd.modes.EVAL)}")
    for tname in trial.tensor_names(regex=".*relu_input"):
        tensor = trial.tensor(tname)
        last = tensor.steps(mode=smd.modes.TRAIN)[-1]
        value = tensor.value(last, mode=smd.modes.TRAIN)
        print(f"  {tname} at TRAIN step {last}: {np.mean(value <= 0) * 100:.1f}% "
              "of ReLU inputs <= 0")
    for tname in trial.tensor_names(collection="gradients"):
        tensor = trial.tensor(tname)
        variances = [np.var(tensor.value(s, mode=smd.modes.TRAIN))
                     for s in tensor.steps(mode=smd.modes.TRAIN)]
        print(f"  {tname}: gradient variance {variances[0]:.3g} (first saved step) -> "
              f"{variances[-1]:.3g} (last)")
    loss = trial.tensor_names(collection="losses")[0]
    losses = trial.tensor(loss)
    print(f"  {loss}: " + ", ".join(f"{float(np.mean(losses.value(s, mode=smd.modes.TRAIN))):.3f}"
                                     for s in losses.steps(mode=smd.modes.TRAIN)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", help="the trial directory (must not hold a finished run)")
    parser.add_argument("--initializer", choices=sorted(INITIALIZERS), default="good")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="TRAIN steps per epoch")
    parser.add_argument("--eval-steps", type=int, default=4, help="EVAL steps per epoch")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--save-interval", type=int, default=5)
    parser.add_argument("--save-all", action="store_true", help="save every tensor of every block")
    parser.add_argument("--hybridize", action="store_true")
    parser.add_argument("--config", help="smdebug's JSON hook configuration instead of the flags")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.out_dir and not args.config:
        parser.error("give --out-dir (or --config, whose LocalPath is the trial directory)")
    args.out_dir = args.out_dir and os.path.abspath(args.out_dir)
    analyse(train(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
