r"""Feature importance over the boosting rounds, read from an mltrace trial (seed 003's
"use Debugger with XGBoost to save feature importance values and plot them").

Trains XGBoost on a synthetic regression problem whose answer is known (y depends strongly on
``dose`` and ``age``, through a product on ``weight`` x ``height``, and not at all on ``noise_a`` /
``noise_b``) with ``mltrace.xgboost.Hook`` saving the collections metrics and feature_importance
every ``--save-interval`` rounds. Then it opens the trial with ``create_trial``, as a notebook
would, and plots each feature's normalized importance (``--importance-type``: weight, gain,
cover, total_gain or total_cover) against the boosting round, next to the train and validation
RMSE. A feature not used by any tree yet has no value at that round and is drawn as 0.

The reading half works the same on a job that is still training: ``create_trial(out_dir)``
sees each round as soon as the hook's callback for it returns.

Example (from the repository root):
    python examples/xgboost/feature_importance.py --out-dir ./demo-output/xgb_fi \
        --plot ./demo-output/xgb_feature_importance.png
"""

from __future__ import annotations

import argparse
import os
import shutil

import numpy as np
import xgboost as xgb

import mltrace.xgboost as smd
from mltrace.trials import create_trial

FEATURES = ["dose", "age", "weight", "height", "noise_a", "noise_b"]


def make_data(n: int, seed: int = 0) -> tuple[xgb.DMatrix, xgb.DMatrix]:
    """(train, validation) of a problem where each feature's role is known."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, len(FEATURES)))
    y = 3 * x[:, 0] + 2 * x[:, 1] ** 2 + x[:, 2] * x[:, 3] + rng.normal(scale=0.3, size=n)
    cut = int(n * 0.8)
    return (xgb.DMatrix(x[:cut], label=y[:cut], feature_names=FEATURES),
            xgb.DMatrix(x[cut:], label=y[cut:], feature_names=FEATURES))


def train(out_dir: str, rounds: int, save_interval: int) -> None:
    """Train with the hook; the trial lands in ``out_dir``."""
    dtrain, dval = make_data(2000)
    params = {"max_depth": 3, "eta": 0.1, "objective": "reg:squarederror", "nthread": 1, "seed": 0}
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=save_interval),
        include_collections=["metrics", "feature_importance"],
    )
    xgb.train(params, dtrain, num_boost_round=rounds, evals=[(dtrain, "train"), (dval, "validation")],
              callbacks=[hook], verbose_eval=False)
    hook.close()


def importance_over_rounds(trial, importance_type: str) -> tuple[list[int], dict[str, np.ndarray]]:
    """(saved steps, {feature: normalized importance at each step, 0 where unused})."""
    steps = trial.steps()
    prefix = f"feature_importance/{importance_type}/"
    series = {}
    for name in trial.tensor_names(collection="feature_importance"):
        if not name.startswith(prefix):
            continue
        tensor = trial.tensor(name)
        saved = set(tensor.steps())
        series[name[len(prefix):]] = np.array(
            [float(tensor.value(s)[0]) if s in saved else 0.0 for s in steps])
    return steps, dict(sorted(series.items(), key=lambda kv: -kv[1][-1]))


def plot(trial, importance_type: str, path: str) -> None:
    """Write the figure: importance per feature over the rounds, and the RMSE curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, series = importance_over_rounds(trial, importance_type)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for feature, values in series.items():
        left.plot(steps, values, marker="o", markersize=3, label=feature)
    left.set(title=f"feature importance ({importance_type}, normalized)", xlabel="boosting round",
             ylabel="share of total", ylim=(0, 1))
    left.legend(fontsize="small")
    for name in trial.tensor_names(collection="metrics"):
        tensor = trial.tensor(name)
        right.plot(tensor.steps(), [tensor.value(s)[0] for s in tensor.steps()], label=name)
    right.set(title="metrics", xlabel="boosting round", ylabel="RMSE")
    right.legend(fontsize="small")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default="./demo-output/xgb_feature_importance")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--save-interval", type=int, default=2)
    parser.add_argument("--importance-type", default="gain",
                        choices=["weight", "gain", "cover", "total_gain", "total_cover"])
    parser.add_argument("--plot", default="./demo-output/xgb_feature_importance.png")
    args = parser.parse_args()

    if os.path.isdir(args.out_dir):
        shutil.rmtree(args.out_dir)  # a trial directory holds one run
    train(args.out_dir, args.rounds, args.save_interval)

    trial = create_trial(args.out_dir)
    steps, series = importance_over_rounds(trial, args.importance_type)
    print(f"{args.importance_type} importance (normalized) at rounds {steps[0]} and {steps[-1]}:")
    for feature, values in series.items():
        print(f"  {feature:<8} {values[0]:6.3f} -> {values[-1]:6.3f}")
    plot(trial, args.importance_type, args.plot)
    print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
