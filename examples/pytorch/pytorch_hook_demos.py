r"""Tornasole's PyTorch hook demo (seed 000's ``pytorch_hook_demos.py``), ported to mltrace.

Trains the document's small network (20 -> 500 -> 10 -> 4, log_softmax) on random synthetic data,
on the CPU and offline, with one of the document's three hooks:

    --hook-type weights-bias-gradients  weights, biases and gradients at steps 1, 2, 3 (default)
    --hook-type module-input-output     the same plus the model's inputs and output (collection
                                        l_mod) at steps 0, 10, 20, 30, 40
    --hook-type saveall                 every tensor of the model at steps 1, 2, 3

Every hook also saves the loss (collection losses, always saved). Step 0 is saved as well with
save_steps=[1, 2, 3]: as in smdebug, SaveConfig's save_interval defaults to 500, and 0 % 500 == 0.

``--rule_type`` picks a learning rate and momentum that break training on purpose, and replaces
the hook above with one that saves every step, so that the problem shows in the trial:

    --rule_type vanishing_grad    lr=1.0, momentum=0.9: the ReLUs die within a few steps and the
                                  gradients become 0; saves the gradients (and the loss)
    --rule_type exploding_tensor  lr=1e10, momentum=0.9: the first update overflows the network
                                  and NaN/Inf appear by step 2; saves every tensor

Examples (from the repository root):
    python examples/pytorch/pytorch_hook_demos.py --output-uri ./demo-output/demo \
        --hook-type saveall
    python examples/pytorch/pytorch_hook_demos.py --output-uri ./demo-output/demo_vg \
        --rule_type vanishing_grad
    python examples/pytorch/pytorch_hook_demos.py --output-uri ./demo-output/demo_eg \
        --rule_type exploding_tensor

Read the trial afterwards with ``mltrace.trials.create_trial(<output-uri>)``. The VanishingGradient
and ExplodingTensor rules (``python -m mltrace.rules.rule_invoker``) are coming with a later issue;
until then the script prints the same check, written with the trial API, at the end.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

import mltrace.pytorch as smd
from mltrace import SaveConfig
from mltrace.exceptions import MltraceError
from mltrace.pytorch import TornasoleHook, get_collection
from mltrace.trials import create_trial

HOOK_TYPES = ["weights-bias-gradients", "module-input-output", "saveall"]
RULE_TYPES = ["vanishing_grad", "exploding_tensor", "none"]
# Learning rate and momentum per --rule_type: values that really cause the problem with this
# network and data (checked with seeds 0-9: a gradient's mean |value| is 0 by step 17, and
# NaN/Inf appear at step 2).
RULE_HYPERPARAMETERS = {"vanishing_grad": (1.0, 0.9), "exploding_tensor": (1e10, 0.9)}
VANISHING_THRESHOLD = 1e-7  # smdebug's VanishingGradient default


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


def create_model() -> Net:
    """The document's model, on the CPU."""
    device = torch.device("cpu")
    return Net().to(device)


def create_tornasole_hook(
    output_dir: str, module: nn.Module | None = None, hook_type: str = "weights-bias-gradients"
) -> TornasoleHook:
    """The document's three hooks, created exactly as its snippets create them."""
    if hook_type == "saveall":
        # Save weights, biases, gradients, module inputs and outputs of all layers, steps 1-3.
        save_config = SaveConfig(save_steps=[1, 2, 3])
        hook = TornasoleHook(out_dir=output_dir, save_config=save_config, saveall=True)
    elif hook_type == "module-input-output":
        # The names of input and output tensors of a module are in the following format
        #   Inputs: <module_name>_input_<input_index>, Outputs: <module_name>_output_<output_index>
        # (the top-level module is named by its class, here Net_input_0 and Net_output_0).
        if module is None:
            raise ValueError(
                "hook type module-input-output needs the module whose inputs and outputs to save"
            )
        get_collection("l_mod").add_module_tensors(module, inputs=True, outputs=True)
        hook = TornasoleHook(
            out_dir=output_dir,
            save_config=SaveConfig(save_steps=[i * 10 for i in range(5)]),
            include_collections=["weights", "gradients", "biases", "l_mod"],
        )
    elif hook_type == "weights-bias-gradients":
        # Save ONLY weights, biases and gradients (TornasoleHook's default collections), steps 1-3.
        save_config = SaveConfig(save_steps=[1, 2, 3])
        hook = TornasoleHook(out_dir=output_dir, save_config=save_config)
    else:
        raise ValueError(f"unknown hook type {hook_type!r}: use one of {HOOK_TYPES}")
    return hook


def create_rule_hook(output_dir: str, rule_type: str) -> TornasoleHook:
    """A hook that saves every step what the matching rule reads: gradients, or everything."""
    save_config = SaveConfig(save_interval=1)
    if rule_type == "vanishing_grad":
        return TornasoleHook(
            out_dir=output_dir, save_config=save_config, include_collections=["gradients"]
        )
    return TornasoleHook(out_dir=output_dir, save_config=save_config, saveall=True)


def synthetic_batches(steps: int, batch_size: int, generator: torch.Generator):
    """Random inputs in [0, 1) labelled by a fixed random linear 'teacher' (a learnable task)."""
    teacher = torch.randn(20, 4, generator=generator)
    for _ in range(steps):
        data = torch.rand(batch_size, 20, generator=generator)
        yield data, ((data - 0.5) @ teacher).argmax(dim=1)


def train(
    model: nn.Module,
    hook: TornasoleHook,
    optimizer: optim.Optimizer,
    loss_fn: nn.Module,
    steps: int,
    batch_size: int,
    seed: int,
) -> list[float]:
    """Train ``steps`` SGD steps in TRAIN mode; returns the loss of every step."""
    model.train()
    hook.set_mode(smd.modes.TRAIN)
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


def analyse(path: str, rule_type: str) -> str:
    """One line about the trial, computed with the trial API (what the rules will check)."""
    trial = create_trial(path)
    steps = trial.steps()
    if rule_type == "vanishing_grad":
        for step in steps:
            for name in trial.tensor_names(collection="gradients", step=step):
                mean_abs = float(trial.tensor(name).reduction_value(step, "mean", abs=True))
                if mean_abs < VANISHING_THRESHOLD:
                    return (
                        f"vanishing gradient: mean(|{name}|) = {mean_abs:.3g} < "
                        f"{VANISHING_THRESHOLD:g} at step {step} (of {len(steps)} saved steps)"
                    )
        return f"no vanishing gradient in {len(steps)} saved steps (try more --steps)"
    if rule_type == "exploding_tensor":
        for step in steps:
            names = trial.tensor_names(step=step)
            bad = [n for n in names if not _all_finite(trial.tensor(n).value(step))]
            if bad:
                return (
                    f"exploding tensor: {len(bad)} of {len(names)} tensors hold NaN/Inf at step "
                    f"{step} (of {len(steps)} saved steps), e.g. {', '.join(bad[:3])}"
                )
        return f"no NaN/Inf in {len(steps)} saved steps (try more --steps)"
    names = trial.tensor_names()
    grads = trial.tensor_names(collection="gradients")
    last = steps[-1] if steps else None
    grad_part = ""
    if grads and last is not None:
        grad_means = {
            n: float(trial.tensor(n).reduction_value(last, "mean", abs=True)) for n in grads
        }
        low = min(grad_means, key=grad_means.get)
        grad_part = f"; smallest mean |gradient| at step {last}: {low} = {grad_means[low]:.3g}"
    return f"{len(names)} tensors saved at steps {steps}{grad_part}"


def _all_finite(value: np.ndarray) -> bool:
    return value.dtype.kind not in "fc" or bool(np.isfinite(value).all())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Tornasole's PyTorch hook demo, ported to mltrace")
    parser.add_argument(
        "--output-uri",
        type=str,
        default=None,
        help="directory to save the trial in (default: ./demo-output/pytorch_hook_demos/"
        "<type>-<time>); s3:// URIs need the S3 backend (a later issue)",
    )
    parser.add_argument(
        "--hook-type",
        choices=HOOK_TYPES,
        default="weights-bias-gradients",
        help="which tensors to save (default: weights-bias-gradients; --rule_type replaces it)",
    )
    parser.add_argument(
        "--rule_type",
        choices=RULE_TYPES,
        default="none",
        help="break training on purpose (sets lr and momentum, saves every step)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps (default: 50, or 30 with --rule_type)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="batch size (default: 32)")
    parser.add_argument(
        "--lr", type=float, default=0.01, help="learning rate without --rule_type (default: 0.01)"
    )
    parser.add_argument(
        "--momentum",
        type=float,
        default=0.9,
        help="SGD momentum without --rule_type (default: 0.9)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the model and the data (default: 0)"
    )
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 50 if args.rule_type == "none" else 30
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.output_uri is None:
        kind = args.hook_type if args.rule_type == "none" else args.rule_type
        args.output_uri = (
            f"./demo-output/pytorch_hook_demos/{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    model = create_model()
    if args.rule_type == "none":
        lr, momentum = args.lr, args.momentum
    else:
        lr, momentum = RULE_HYPERPARAMETERS[args.rule_type]
    try:
        if args.rule_type == "none":
            hook = create_tornasole_hook(
                output_dir=args.output_uri, module=model, hook_type=args.hook_type
            )
        else:
            hook = create_rule_hook(args.output_uri, args.rule_type)
    except MltraceError as exc:  # e.g. an s3:// URI before the S3 backend exists
        print(f"error: {exc}", file=sys.stderr)
        return 2

    optimizer = optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.NLLLoss()
    hook.register_hook(model)
    hook.register_loss(loss_fn)

    what = args.hook_type if args.rule_type == "none" else f"rule_type {args.rule_type}"
    print(f"training {args.steps} steps ({what}, lr={lr:g}, momentum={momentum:g})")
    losses = train(model, hook, optimizer, loss_fn, args.steps, args.batch_size, args.seed)
    hook.close()

    print(f"loss: first {losses[0]:.4g}, last {losses[-1]:.4g}")
    print(f"trial saved to {args.output_uri}")
    print(f"analysis: {analyse(args.output_uri, args.rule_type)}")
    print("open it with: from mltrace.trials import create_trial")
    print(f"              trial = create_trial({args.output_uri!r})")
    if args.rule_type != "none":
        print(
            "(the VanishingGradient and ExplodingTensor rules, python -m "
            "mltrace.rules.rule_invoker, are coming with a later issue)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
