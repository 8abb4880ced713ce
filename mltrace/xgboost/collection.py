"""XGBoost collections: smdebug's names for what a boosting round saves, with regexes that fit
XGBoost's evaluation-set and metric names (see mltrace.xgboost.hook for the differences)."""

from __future__ import annotations

from mltrace.collections import CollectionKeys, PendingCollections, manager_with_defaults

K = CollectionKeys
#: smdebug's XGBoost default: a step every 10 boosting rounds.
DEFAULT_SAVE_INTERVAL = 10
DEFAULT_COLLECTIONS: dict[str, list[str]] = {
    K.ALL: [],
    K.DEFAULT: [],
    K.HYPERPARAMETERS: [r"^hyperparameters/.*$"],
    # XGBoost forbids "-" in evaluation set names, so <data>-<metric> splits at the first "-".
    K.METRICS: [r"^[^-/]+-[^/]+$"],
    # Not the metrics XGBoost maximizes (early stopping's rule), nor xgb.cv's "-std" companions.
    K.LOSSES: [r"^[^-/]+-(?!(?:auc|pre|ndcg|map(?!e$)))(?!interval-regression-accuracy$)"
               r"[^/]+(?<!-std)$"],
    K.PREDICTIONS: [r"^predictions$"],
    K.LABELS: [r"^labels$"],
    K.FEATURE_IMPORTANCE: [r"^feature_importance/.*"],
    K.AVERAGE_SHAP: [r"^average_shap/(?!bias$).+$"],
    K.FULL_SHAP: [r"^full_shap/(?!bias$).+$"],
    K.TREES: [r"^trees/.*"],
}
DEFAULT_INCLUDE_COLLECTIONS = [K.METRICS]
#: Collections whose tensors are never reduced (strings, or values a reduction would lose).
RAW_ONLY_COLLECTIONS = (K.HYPERPARAMETERS, K.TREES)
#: Collections computed from a Booster (not available from xgb.cv's packed folds).
NEEDS_BOOSTER = (K.PREDICTIONS, K.FEATURE_IMPORTANCE, K.TREES, K.FULL_SHAP, K.AVERAGE_SHAP)

#: Collections made with smd.get_collection(...) before a hook exists go to the next hook.
pending = PendingCollections(lambda: manager_with_defaults(DEFAULT_COLLECTIONS))
