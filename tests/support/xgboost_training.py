"""Tiny XGBoost trainings that record, beside the hook, what each round should have saved.

``Capture`` is a second training callback, listed after the hook: it computes every tensor of
mltrace.xgboost's collections with XGBoost's own public API (``trees_to_dataframe`` for trees,
``get_score`` for importance, ``pred_contribs`` for SHAP), not with the hook's code, so the
round-trip tests compare the trial with an independent oracle. Used by tests/xgboost/test_xgboost_hook.py
and tests/golden/make_mltrace_xgboost_golden.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xgboost as xgb

IMPORTANCE_TYPES = ("weight", "gain", "cover", "total_gain", "total_cover")
FEATURES = ["alpha", "income", "bias_s"]  # names ending in a and s: smdebug's SHAP regex dropped them


def make_data(n: int = 40, n_val: int = 16, seed: int = 0, classes: int = 0,
              features: list[str] | None = None) -> tuple[xgb.DMatrix, xgb.DMatrix]:
    """(train, validation) DMatrix of a small synthetic problem (regression unless ``classes``)."""
    features = FEATURES if features is None else features
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n + n_val, len(features))).astype(np.float32)
    signal = 2 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] * x[:, 0]
    if classes:
        y = np.digitize(signal, np.quantile(signal, np.linspace(0, 1, classes + 1)[1:-1]))
    else:
        y = signal + rng.normal(scale=0.1, size=n + n_val)
    y = y.astype(np.float32)
    return (xgb.DMatrix(x[:n], label=y[:n], feature_names=features),
            xgb.DMatrix(x[n:], label=y[n:], feature_names=features))


class Capture(xgb.callback.TrainingCallback):
    """Records {tensor name: {step: value}} for every round, as the hook should save them."""

    def __init__(self, train_data: xgb.DMatrix | None = None, validation_data: xgb.DMatrix | None = None,
                 hyperparameters: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.train_data, self.validation_data = train_data, validation_data
        self.hyperparameters = hyperparameters or {}
        self.values: dict[str, dict[int, np.ndarray]] = {}
        self.first_step: int | None = None

    def add(self, name: str, step: int, value: Any) -> None:
        self.values.setdefault(name, {})[step] = np.asarray(value)

    def after_iteration(self, model: xgb.Booster, epoch: int, evals_log: dict) -> bool:
        step = model.num_boosted_rounds() - 1
        if self.first_step is None:
            self.first_step = step
            for key, value in self.hyperparameters.items():
                self.add(f"hyperparameters/{key}", step, np.array([value]) if np.isscalar(value) else value)
        for data, metrics in evals_log.items():
            for metric, history in metrics.items():
                self.add(f"{data}-{metric}", step, np.array([history[-1]]))
        if self.validation_data is not None:
            self.add("predictions", step, model.predict(self.validation_data))
            self.add("labels", step, self.validation_data.get_label())
        for kind in IMPORTANCE_TYPES:
            scores = model.get_score(importance_type=kind)
            total = sum(scores.values())
            for feature, score in scores.items():
                self.add(f"feature_importance/{kind}/{feature}", step, np.array([score / total]))
        for column, values in trees_of_round(model, step).items():
            self.add(f"trees/{column}", step, values)
        if self.train_data is not None:
            contribs = model.predict(self.train_data, pred_contribs=True)
            names = list(model.feature_names) + ["bias"]
            means = contribs.mean(axis=tuple(range(contribs.ndim - 1)))
            for i, name in enumerate(names):
                self.add(f"full_shap/{name}", step, contribs[..., i])
                self.add(f"average_shap/{name}", step, np.array([means[i]]))
        return False


def trees_of_round(model: xgb.Booster, rnd: int) -> dict[str, np.ndarray]:
    """The rows of ``trees_to_dataframe()`` for the trees of round ``rnd``, as the hook stores
    them: NaN in string columns becomes "nan", categorical split sets become "1,3"."""
    frame = model.trees_to_dataframe()
    per_round = len(model.get_dump()) // model.num_boosted_rounds()
    frame = frame[(frame.Tree >= rnd * per_round) & (frame.Tree < (rnd + 1) * per_round)]
    out: dict[str, np.ndarray] = {}
    for column in ("Tree", "Node"):
        out[column] = frame[column].to_numpy(dtype=np.int64)
    for column in ("Split", "Gain", "Cover"):
        out[column] = frame[column].to_numpy(dtype=np.float64)
    for column in ("ID", "Feature", "Yes", "No", "Missing", "Category"):
        out[column] = np.array([_as_text(v) for v in frame[column]], dtype=str)
    return out


def _as_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "nan"
    return str(value)
