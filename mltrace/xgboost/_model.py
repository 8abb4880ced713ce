"""What the XGBoost hook reads from a Booster and its data: data sets, trees of one round,
feature importance, SHAP values. No mltrace state here; the hook decides what to save."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import xgboost as xgb

from mltrace.exceptions import MltraceTypeError, MltraceValueError

IMPORTANCE_TYPES = ("weight", "gain", "cover", "total_gain", "total_cover")
TREE_BOOSTERS = ("gbtree", "dart")
#: Columns of ``trees/<column>``, as Booster.trees_to_dataframe() names them (smdebug's order).
TREE_COLUMNS = ("Tree", "Node", "ID", "Feature", "Split", "Yes", "No", "Missing", "Gain", "Cover",
                "Category")
_CONTENT_TYPES = {"csv": "csv", "text/csv": "csv", "libsvm": "libsvm", "text/libsvm": "libsvm",
                  "text/x-libsvm": "libsvm"}


def as_dmatrix(arg: str, data: Any) -> xgb.DMatrix | None:
    """``train_data`` / ``validation_data`` as a DMatrix.

    Accepts None, a DMatrix, smdebug's ``(local file path, "csv" | "libsvm")`` (CSV: label in
    the first column, no header; LIBSVM: zero-based feature indices, as XGBoost's own reader),
    or ``(X, y)`` with X anything DMatrix takes (numpy, pandas).

    Raises:
        MltraceValueError: a file that does not exist or an unknown content type.
        MltraceTypeError: anything else.
    """
    if data is None or isinstance(data, xgb.DMatrix):
        return data
    pair = isinstance(data, (tuple, list)) and len(data) == 2
    if pair and isinstance(data[0], (str, os.PathLike)):
        path, content_type = os.path.expanduser(os.fspath(data[0])), str(data[1]).lower()
        if content_type not in _CONTENT_TYPES:
            raise MltraceValueError(
                f"{arg}=({data[0]!r}, {data[1]!r}): content type must be one of "
                f"{sorted(_CONTENT_TYPES)}"
            )
        if not os.path.isfile(path):
            raise MltraceValueError(
                f"{arg}: {path!r} is not a local file; pass a DMatrix for other data")
        # Read here: XGBoost 3.1 deprecated loading text files by URI ("path?format=csv").
        fmt = _CONTENT_TYPES[content_type]
        try:
            x, y = (_read_csv if fmt == "csv" else _read_libsvm)(path)
        except (ValueError, IndexError) as exc:
            raise MltraceValueError(f"{arg}: {path!r} is not a {fmt} file ({exc})") from None
        return xgb.DMatrix(x, label=y)
    if pair:
        return xgb.DMatrix(data[0], label=data[1], enable_categorical=True)
    raise MltraceTypeError(
        f"{arg} must be an xgboost.DMatrix, a tuple (X, y), or a tuple (file path, 'csv' | "
        f"'libsvm'); got {type(data).__name__}"
    )


def _read_csv(path: str) -> tuple[np.ndarray, np.ndarray]:
    with open(path, newline="") as f:
        first = f.readline()
    try:
        delimiter = csv.Sniffer().sniff(first, delimiters=",;\t| ").delimiter
    except csv.Error:
        delimiter = ","
    table = np.loadtxt(path, delimiter=delimiter, ndmin=2, dtype=np.float32)
    return table[:, 1:], table[:, 0]


def _read_libsvm(path: str) -> tuple[Any, np.ndarray]:
    """``<label>[:<weight>] <index>:<value> ...`` lines as a CSR matrix and labels."""
    import scipy.sparse  # an XGBoost dependency

    labels, rows, cols, values = [], [], [], []
    with open(path) as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            labels.append(float(fields[0].split(":")[0]))
            for item in fields[1:]:
                index, value = item.split(":")
                rows.append(len(labels) - 1)
                cols.append(int(index))
                values.append(float(value))
    shape = (len(labels), max(cols, default=-1) + 1)
    matrix = scipy.sparse.csr_matrix((np.array(values, dtype=np.float32), (rows, cols)),
                                     shape=shape)
    return matrix, np.array(labels, dtype=np.float32)


class ModelInfo:
    """Facts about the Booster being trained that do not change between rounds."""

    def __init__(self, model: xgb.Booster) -> None:
        config = json.loads(model.save_config())
        self.booster_type: str = config["learner"]["gradient_booster"]["name"]
        # XGBoost names unnamed features f0, f1, ... in dumps, scores and SHAP columns.
        self.feature_names: list[str] = list(
            model.feature_names or (f"f{i}" for i in range(model.num_features())))

    @property
    def has_trees(self) -> bool:
        """Feature importance and tree dumps exist for tree boosters only (not gblinear)."""
        return self.booster_type in TREE_BOOSTERS


def normalized_importance(model: xgb.Booster, importance_type: str) -> dict[str, np.ndarray]:
    """get_score(importance_type) divided by its sum (smdebug's normalization); {} when no
    feature was used yet."""
    raw = model.get_score(importance_type=importance_type)
    scores = {f: np.asarray(s, dtype=np.float64) for f, s in raw.items()}
    total = sum(scores.values())
    if not scores or not np.all(np.isfinite(total)) or np.any(np.asarray(total) == 0):
        return {}
    return {f: s / total for f, s in scores.items()}


def round_trees(model: xgb.Booster, rnd: int) -> dict[str, np.ndarray]:
    """The trees boosted in round ``rnd`` as Booster.trees_to_dataframe() columns, sorted by
    (Tree, Node); every tree of the round (one per class and parallel tree), numbered as in the
    whole model. Leaves: Feature "Leaf", Gain = leaf value, Yes/No/Missing/Category "nan"."""
    dumps = model[rnd : rnd + 1].get_dump(dump_format="json", with_stats=True)
    rows: list[tuple[Any, ...]] = []
    for k, dump in enumerate(dumps):
        tree = rnd * len(dumps) + k
        stack = [json.loads(dump)]
        while stack:
            node = stack.pop()
            stack.extend(node.get("children", ()))
            rows.append(_node_row(tree, node))
    rows.sort(key=lambda r: (r[0], r[1]))
    columns = list(zip(*rows)) if rows else [()] * len(TREE_COLUMNS)
    dtypes = (np.int64, np.int64, str, str, np.float64, str, str, str, np.float64, np.float64, str)
    return {name: np.array(col, dtype=dt) for name, col, dt in zip(TREE_COLUMNS, columns, dtypes)}


def _node_row(tree: int, node: Mapping[str, Any]) -> tuple[Any, ...]:
    nid = int(node["nodeid"])
    if "leaf" in node:
        return (tree, nid, f"{tree}-{nid}", "Leaf", math.nan, "nan", "nan", "nan",
                _number(node["leaf"]), _number(node.get("cover")), "nan")
    condition = node.get("split_condition")
    if isinstance(condition, list):  # a categorical split: the categories that go left
        split, categories = math.nan, ",".join(str(c) for c in condition)
    else:
        split, categories = _number(condition), "nan"
    return (
        tree, nid, f"{tree}-{nid}", str(node["split"]), split,
        f"{tree}-{node['yes']}", f"{tree}-{node['no']}", f"{tree}-{node['missing']}",
        _number(node.get("gain")), _number(node.get("cover")), categories,
    )


def _number(value: Any) -> float:
    """A float, or NaN for what is not one number (vector leaves of multi-target trees)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def shap_values(model: xgb.Booster, data: xgb.DMatrix) -> np.ndarray:
    """SHAP values (pred_contribs): (samples, features + 1), or (samples, classes, features + 1)
    for multi-class models; the last column is the bias."""
    return model.predict(data, pred_contribs=True)
