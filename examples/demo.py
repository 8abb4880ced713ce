"""mltrace's main demo: train with the hook, run rules, log to MLflow, export TensorBoard data.

``scripts/demo.sh`` builds the environment and runs this file. It trains a small classifier on
synthetic data (CPU, offline, a few seconds) with ``mltrace.pytorch.Hook`` in TRAIN and EVAL
modes, saving weights, biases, gradients (with reductions) and the loss into
``./demo-output/run-<time>/`` (or ``--out-dir``), exporting TensorBoard summaries beside them and
logging to MLflow (SQLite at ``./demo-output/mlflow.db``). Then it reads the trial back with
``create_trial``, prints its collections, tensors, steps, loss curve and gradient norms, runs
built-in rules (each an MLflow run nested under the training run) and says how to open both UIs.

Example:
    .venv/bin/python examples/demo.py --out-dir ./demo-output/my-run
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn, optim

import mltrace.pytorch as smd
from mltrace.exceptions import MltraceError
from mltrace.trials import create_trial
from mltrace_mlflow import links

#: Where `mlflow ui --port 5000`, as printed at the end, serves the MLflow UI.
MLFLOW_UI = "http://127.0.0.1:5000"
VANISHING_THRESHOLD = 1e-7  # smdebug's VanishingGradient default
BAR_WIDTH = 30
LOG_LEVEL_VARIABLES = ("MLTRACE_LOG_LEVEL", "SMDEBUG_LOG_LEVEL", "TORNASOLE_LOG_LEVEL")


class MLP(nn.Module):
    """20 -> 64 -> 32 -> 4 classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 32)
        self.fc3 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return F.log_softmax(self.fc3(x), dim=1)


def make_data(
    n: int, generator: torch.Generator, teacher: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian inputs labelled by a fixed random linear teacher: a task the MLP can learn."""
    x = torch.randn(n, 20, generator=generator)
    return x, (x @ teacher).argmax(dim=1)


def create_hook(out_dir: str, tracking_uri: str) -> smd.Hook:
    """smd.Hook saving weights, biases, gradients and losses; gradients also as reductions;
    TensorBoard export and MLflow logging switched on."""
    save_config = {
        smd.modes.TRAIN: smd.SaveConfigMode(save_interval=10),
        smd.modes.EVAL: smd.SaveConfigMode(save_interval=2),
    }
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=save_config,
        include_collections=["weights", "biases", "gradients", "losses"],
        export_tensorboard=True,
        mlflow={"tracking_uri": tracking_uri, "experiment": "mltrace-demo", "run_name": "demo-mlp"},
    )
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(
        reductions=["mean", "std", "nan_count", "inf_count"], abs_reductions=["mean"], norms=["l2"],
        save_raw_tensor=True
    )
    return hook


def train(
    out_dir: str, epochs: int, steps_per_epoch: int, eval_steps: int, batch_size: int,
    tracking_uri: str,
) -> tuple[str, str]:
    """Train in TRAIN mode and evaluate in EVAL mode each epoch, with the hook attached; returns
    the MLflow (experiment id, run id) of the training run."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    teacher = torch.randn(20, 4, generator=generator)
    model = MLP()
    loss_fn = nn.NLLLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    hook = create_hook(out_dir, tracking_uri)
    hook.register_module(model)
    hook.register_loss(loss_fn)

    for epoch in range(1, epochs + 1):
        hook.set_mode(smd.modes.TRAIN)
        model.train()
        for _ in range(steps_per_epoch):
            data, target = make_data(batch_size, generator, teacher)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            optimizer.step()

        hook.set_mode(smd.modes.EVAL)
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for _ in range(eval_steps):
                data, target = make_data(batch_size, generator, teacher)
                output = model(data)
                loss_fn(output, target)
                correct += int((output.argmax(dim=1) == target).sum())
                total += len(target)
        print(
            f"  epoch {epoch}: last train loss {loss.item():.3f}, eval accuracy {correct / total:.0%}"
        )
    hook.close()
    sink = hook.sinks[0]
    return sink.experiment_id, sink.run_id


def bar(value: float, top: float) -> str:
    return "#" * max(1, round(BAR_WIDTH * value / top)) if top > 0 else ""


def analyse(out_dir: str) -> None:
    """Read the trial back with create_trial and print what it holds."""
    trial = create_trial(out_dir)

    print("\nCollections (tensors in each):")
    for name in sorted(trial.collections()):
        count = len(trial.tensor_names(collection=name))
        if count:
            print(f"  {name:<10} {count}")

    names = trial.tensor_names()
    print(f"\nTensors ({len(names)}):")
    for name in names:
        print(f"  {name}")

    print("\nSaved steps per mode:")
    for mode in (smd.modes.TRAIN, smd.modes.EVAL):
        steps = trial.steps(mode=mode)
        print(f"  {mode.name:<5} {len(steps):>2} steps: {steps}")

    (loss_name,) = trial.tensor_names(collection="losses")
    for mode in (smd.modes.TRAIN, smd.modes.EVAL):
        loss = trial.tensor(loss_name)
        curve = {step: float(loss.value(step, mode=mode)) for step in loss.steps(mode=mode)}
        if not curve:
            continue
        top = max(curve.values())
        print(f"\nLoss curve, {mode.name} ({loss_name}):")
        for step, value in curve.items():
            print(f"  step {step:>3}  {value:.4f}  {bar(value, top)}")

    grads = trial.tensor_names(collection="gradients")
    short = [g.split("_", 1)[1] for g in grads]  # gradient/MLP_fc1.weight -> fc1.weight
    print("\nGradient L2 norms per TRAIN step (saved as reductions during training):")
    print("  step " + "".join(f"{s:>12}" for s in short))
    for step in trial.steps(mode=smd.modes.TRAIN):
        norms = [
            float(trial.tensor(g).reduction_value(step, "l2", mode=smd.modes.TRAIN)) for g in grads
        ]
        print(f"  {step:>4} " + "".join(f"{n:>12.4g}" for n in norms))

    # The VanishingGradient rule's test, written with the trial API.
    smallest = min(
        (
            float(trial.tensor(g).reduction_value(step, "mean", mode=smd.modes.TRAIN, abs=True)),
            g,
            step,
        )
        for g in grads
        for step in trial.tensor(g).steps(mode=smd.modes.TRAIN)
    )
    value, name, step = smallest
    verdict = "VANISHING GRADIENT" if value < VANISHING_THRESHOLD else "no vanishing gradient"
    print(
        f"\nVanishing-gradient check: smallest mean |gradient| is {value:.3g} ({name}, TRAIN step "
        f"{step}); threshold {VANISHING_THRESHOLD:g}: {verdict}"
    )


def run_rules(out_dir: str) -> None:
    """Run built-in rules over the finished trial; each is an MLflow run under the training run."""
    from mltrace.exceptions import NoMoreData
    from mltrace.rules import invoke_rule
    from mltrace.rules.builtin import rule_class

    trial = create_trial(out_dir)
    checks = [("VanishingGradient", {}), ("NaNInfDetected", {}),
              ("LossNotDecreasing", {"num_steps": "20"}), ("Overfit", {})]
    print("\nRules (each also an MLflow run nested under the training run):")
    for name, params in checks:
        rule = rule_class(name)(trial, **params)
        try:
            result = invoke_rule(rule)
        except NoMoreData as exc:
            result = exc.rule_result  # type: ignore[attr-defined]
        found = f"fired at steps {result.fired_steps[:5]}: {result.message}" if result.fired_steps else ""
        print(f"  {name:<20} {result.status:<14} {result.evaluated_steps} steps evaluated {found}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out-dir",
        default=None,
        help="where to write the trial (default: ./demo-output/run-<time>)",
    )
    parser.add_argument("--epochs", type=int, default=3, help="training epochs (default: 3)")
    parser.add_argument(
        "--steps-per-epoch", type=int, default=40, help="TRAIN steps per epoch (default: 40)"
    )
    parser.add_argument(
        "--eval-steps", type=int, default=4, help="EVAL steps per epoch (default: 4)"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default: 64)")
    args = parser.parse_args(argv)
    if args.out_dir is None:
        args.out_dir = os.path.join("demo-output", f"run-{time.strftime('%Y%m%d-%H%M%S')}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not any(os.environ.get(v) for v in LOG_LEVEL_VARIABLES):  # the user's choice wins
        logging.getLogger("mltrace").setLevel(logging.WARNING)  # keep the library's INFO lines out
    for noisy in ("mlflow", "alembic"):  # MLflow's database set-up chatter on first use
        logging.getLogger(noisy).setLevel(logging.WARNING)
    out_dir = os.path.abspath(args.out_dir)
    db = os.path.join(os.path.dirname(out_dir), "mlflow.db")
    tracking_uri = f"sqlite:///{db}"
    os.environ.setdefault("MLFLOW_TRACKING_URI", tracking_uri)  # rule runs log there too
    started = time.perf_counter()
    print(f"Training a small MLP with mltrace.pytorch.Hook -> {out_dir}")
    try:
        experiment_id, run_id = train(out_dir, args.epochs, args.steps_per_epoch, args.eval_steps,
                                      args.batch_size, os.environ["MLFLOW_TRACKING_URI"])
    except MltraceError as exc:  # e.g. out_dir holds a finished run
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"Training done in {time.perf_counter() - started:.1f}s. Analysing the trial:")
    analyse(out_dir)
    run_rules(out_dir)
    print(f"""
Open the results:
  - TensorBoard (scalars, histograms, and the mltrace tab with tensors, collections, rules):
      .venv/bin/mltrace tensorboard {out_dir} --port 6006 --mltrace_mlflow_uri {MLFLOW_UI}
      then browse http://127.0.0.1:6006
  - MLflow UI (the training run with a description of what the rules found, its rule runs
    nested under it, named with their outcome, the summary under Artifacts > mltrace):
      .venv/bin/mlflow ui --backend-store-uri {os.environ["MLFLOW_TRACKING_URI"]} --port 5000
      then open the training run: {links.run_url(MLFLOW_UI, experiment_id, run_id)}
      or its experiment: {links.experiment_url(MLFLOW_UI, experiment_id)}
      (the workflowType parameter opens MLflow's machine-learning view, not its GenAI one)
  - the trial in Python:
      from mltrace.trials import create_trial
      trial = create_trial({out_dir!r})
      trial.tensor("gradient/MLP_fc1.weight").reduction_value(0, "mean", mode="train", abs=True)
  - a rule from the command line:
      .venv/bin/python -m mltrace.rules.rule_invoker --trial-dir {out_dir} --rule-name VanishingGradient
  - the Tornasole demo: .venv/bin/python examples/pytorch/pytorch_hook_demos.py --rule_type vanishing_grad""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
