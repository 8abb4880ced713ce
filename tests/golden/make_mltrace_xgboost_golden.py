"""Write the golden XGBoost trial that real smdebug's reader must read (legacy suite).

The legacy venv has smdebug but no xgboost, so the trial is written here, with the main venv::

    .venv/bin/python tests/golden/make_mltrace_xgboost_golden.py [--out DIR]

It writes ``DIR/run/`` with ``mltrace.xgboost.Hook`` (a small seeded regression, 4 boosting
rounds saved every 2nd round, every XGBoost collection, hyperparameters with a string and a list,
a scalar saved after training) and ``DIR/expected.json``: what each saved step must hold, taken
from the values seen in the training process by an independent recorder
(tests/support/xgboost_training.py, XGBoost's public API), plus the steps, workers and the tensor
names of each collection. DIR defaults to ``tests/golden/mltrace_xgboost`` beside this file.
tests/xgboost/test_xgboost_hook.py checks that the committed files still match what the hook writes;
tests/legacy/test_smdebug_reads_mltrace_xgboost.py reads them with smdebug 1.0.34.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import xgboost as xgb

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import mltrace.xgboost as smd  # noqa: E402
from tests.support.xgboost_training import Capture, make_data  # noqa: E402

ROUNDS = 4
INTERVAL = 2
PARAMS = {"max_depth": 2, "eta": 0.5, "objective": "reg:squarederror", "nthread": 1, "seed": 0,
          "eval_metric": ["rmse", "mae"]}
COLLECTIONS = ["metrics", "losses", "hyperparameters", "predictions", "labels",
               "feature_importance", "full_shap", "average_shap", "trees"]
SCALAR = ("final_score", 0.25)


def _jsonable(value: np.ndarray) -> dict[str, Any]:
    def item(v: Any) -> Any:
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        return v

    return {"dtype": value.dtype.str if value.dtype.kind != "U" else "str",
            "shape": list(value.shape), "value": [item(v) for v in value.reshape(-1).tolist()]}


def build(out: Path) -> dict[str, Any]:
    """Train, write ``out/run`` and ``out/expected.json``; return the expected document."""
    run = out / "run"
    if run.exists():
        shutil.rmtree(run)
    out.mkdir(parents=True, exist_ok=True)
    dtrain, dval = make_data(n=24, n_val=8)
    hyper = {"max_depth": 2, "eta": 0.5, "objective": "reg:squarederror", "eval_metric": ["rmse", "mae"]}
    hook = smd.Hook(out_dir=str(run), save_config=smd.SaveConfig(save_interval=INTERVAL),
                    include_collections=COLLECTIONS, hyperparameters=hyper,
                    train_data=dtrain, validation_data=dval)
    capture = Capture(dtrain, dval, hyper)
    xgb.train(PARAMS, dtrain, ROUNDS, evals=[(dtrain, "train"), (dval, "validation")],
              callbacks=[hook, capture], verbose_eval=False)
    hook.save_scalar(*SCALAR)
    hook.close()

    saved_steps = [s for s in range(ROUNDS) if s % INTERVAL == 0]
    values: dict[str, dict[str, Any]] = {}
    for name, by_step in sorted(capture.values.items()):
        if name.endswith("/bias"):
            continue  # the SHAP collections leave the bias column out
        steps = [0] if name.startswith("hyperparameters/") else saved_steps
        kept = {str(s): _jsonable(by_step[s]) for s in steps if s in by_step}
        if kept:
            values[name] = kept
    scalar_step = ROUNDS  # saved after training: one step after the last round
    values["scalar/" + SCALAR[0]] = {str(scalar_step): _jsonable(np.array([SCALAR[1]]))}
    collections = {c: sorted(n for n in values if hook.get_collection(c).matches(n)) for c in COLLECTIONS}
    expected = {
        "xgboost": xgb.__version__,
        "steps": sorted({int(s) for v in values.values() for s in v}),
        "workers": ["worker_0"],
        "tensor_names": sorted(values),
        "collections": collections,
        "values": values,
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    return expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "mltrace_xgboost"))
    args = parser.parse_args()
    os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")
    expected = build(Path(args.out))
    print(f"wrote {args.out}: {len(expected['tensor_names'])} tensors, steps {expected['steps']}")


if __name__ == "__main__":
    main()
