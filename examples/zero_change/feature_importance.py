"""examples/xgboost/feature_importance.py with its mltrace lines removed: plain XGBoost.

The training half of the original, without the hook (and without the half that reads the trial).
Run it under ``mltrace run`` with feature_importance.json (the original's hook in smdebug's
configuration format)::

    mltrace run --config examples/zero_change/feature_importance.json \
        examples/zero_change/feature_importance.py

then read the trial as the original does. tests/launch/test_launch_examples.py checks that it leaves
the trial the original leaves.
"""

from __future__ import annotations

import argparse

import numpy as np
import xgboost as xgb

FEATURES = ["dose", "age", "weight", "height", "noise_a", "noise_b"]


def make_data(n: int, seed: int = 0) -> tuple[xgb.DMatrix, xgb.DMatrix]:
    """(train, validation) of a problem where each feature's role is known."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, len(FEATURES)))
    y = 3 * x[:, 0] + 2 * x[:, 1] ** 2 + x[:, 2] * x[:, 3] + rng.normal(scale=0.3, size=n)
    cut = int(n * 0.8)
    return (xgb.DMatrix(x[:cut], label=y[:cut], feature_names=FEATURES),
            xgb.DMatrix(x[cut:], label=y[cut:], feature_names=FEATURES))


def main() -> None:
    parser = argparse.ArgumentParser(description="XGBoost training, no mltrace lines")
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    dtrain, dval = make_data(2000)
    params = {"max_depth": 3, "eta": 0.1, "objective": "reg:squarederror", "nthread": 1, "seed": 0}
    booster = xgb.train(params, dtrain, num_boost_round=args.rounds,
                        evals=[(dtrain, "train"), (dval, "validation")], verbose_eval=False)
    print(f"trained {booster.num_boosted_rounds()} rounds")


if __name__ == "__main__":
    main()
