"""Confusion and ClassImbalance: classification labels against predictions."""

from __future__ import annotations

from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.rules.builtin._params import (
    as_bool,
    as_float,
    as_int,
    as_optional_int,
    as_regex_list,
)
from mltrace.rules.builtin._reading import TensorSelection, value_at
from mltrace.rules.rule import Rule
from mltrace.trials import Trial


def class_ids(value: np.ndarray, argmax: bool) -> np.ndarray | None:
    """Class ids from labels or predictions: argmax over axis 1 of a 2-D tensor when ``argmax``,
    else the flattened values rounded to the nearest integer (a binary probability becomes 0 or
    1; XGBoost's float class ids stay). None for non-numeric data."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf" or arr.size == 0:
        return None
    if argmax and arr.ndim == 2 and arr.shape[1] > 1:
        return np.argmax(arr, axis=1).astype(np.int64)
    with np.errstate(invalid="ignore"):
        ids = np.rint(arr.reshape(-1).astype(np.float64))
    ids[~np.isfinite(ids)] = -1
    return ids.astype(np.int64)


class Confusion(Rule):
    """Fires when the confusion matrix of a step is poor: with ``C[label][prediction]`` counts,
    for a predicted class ``i`` with samples, ``C[i][i] / sum_j C[j][i] < min_diag`` or, for a
    label ``j != i``, ``C[j][i] / sum_j C[j][i] > max_off_diag``.

    Args:
        base_trial: the trial to watch.
        category_no: number of classes; default None: the largest class id seen + 1.
        labels: default "labels": the tensor of true labels.
        predictions: default "predictions": the tensor of predicted labels.
        labels_collection: default "labels": used when there is no tensor named ``labels``
            (its tensors, sorted, are paired with the predictions collection's).
        predictions_collection: default "predictions".
        min_diag: default 0.9; max_off_diag: default 0.1.

    Choices where smdebug is silent: normalization is by column (all samples predicted as a
    class; smdebug's docs wrote the diagonal's denominator as the trace, a typo by evidence of its
    own tests); the matrix is built per saved step (XGBoost saves the validation predictions of
    the current model); 2-D predictions (per-class scores) go through argmax, 1-D ones are
    rounded; class ids outside ``[0, category_no)`` are dropped.
    """

    def __init__(self, base_trial: Trial, category_no: Any = None, labels: Any = "labels",
                 predictions: Any = "predictions", labels_collection: Any = "labels",
                 predictions_collection: Any = "predictions", min_diag: Any = 0.9,
                 max_off_diag: Any = 0.1, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.category_no = as_optional_int(name, "category_no", category_no)
        if self.category_no is not None and self.category_no < 2:
            raise MltraceValueError(f"{name}: category_no={category_no!r} must be at least 2")
        self.labels, self.predictions = str(labels), str(predictions)
        self.labels_collection = str(labels_collection)
        self.predictions_collection = str(predictions_collection)
        self.min_diag = as_float(name, "min_diag", min_diag, 0, 1)
        self.max_off_diag = as_float(name, "max_off_diag", max_off_diag, 0, 1)

    def _names(self, tensor: str, collection: str) -> list[str]:
        trial = self.base_trial
        if trial.has_tensor(tensor):
            return [tensor]
        if collection in trial.collections():
            return trial.tensor_names(collection=collection)
        return []

    def invoke_at_step(self, step: int) -> bool:
        trial = self.base_trial
        pairs = zip(self._names(self.labels, self.labels_collection),
                    self._names(self.predictions, self.predictions_collection))
        for label_name, prediction_name in pairs:
            y = value_at(trial.tensor(label_name), step)
            y_hat = value_at(trial.tensor(prediction_name), step)
            if y is None or y_hat is None:
                continue
            y, y_hat = class_ids(y, argmax=True), class_ids(y_hat, argmax=True)
            if y is None or y_hat is None or y.size != y_hat.size:
                self.logger.debug("step %d: %s and %s do not pair up", step, label_name,
                                  prediction_name)
                continue
            n = self.category_no or int(max(y.max(), y_hat.max(), 0)) + 1
            keep = (y >= 0) & (y < n) & (y_hat >= 0) & (y_hat < n)
            matrix = np.bincount(y[keep] * n + y_hat[keep], minlength=n * n).reshape(n, n)
            message = self._check(matrix)
            if message:
                self.last_message = f"{label_name} vs {prediction_name} at {self.step_label(step)}: {message}"
                return True
        return False

    def _check(self, matrix: np.ndarray) -> str | None:
        columns = matrix.sum(axis=0)
        for i in np.flatnonzero(columns):
            diag = matrix[i, i] / columns[i]
            if diag < self.min_diag:
                return (f"only {diag:.3g} of the samples predicted as class {i} are class {i} "
                        f"(< min_diag {self.min_diag:g})")
            off = matrix[:, i].astype(np.float64) / columns[i]
            off[i] = 0
            j = int(np.argmax(off))
            if off[j] > self.max_off_diag:
                return (f"{off[j]:.3g} of the samples predicted as class {i} are class {j} "
                        f"(> max_off_diag {self.max_off_diag:g})")
        return None


class ClassImbalance(Rule):
    """Fires, once at least ``samples`` labels were seen (over all saved steps so far), when the
    most frequent class has more than ``threshold_imbalance`` times the samples of the least
    frequent one, or when the fraction of a class's samples that were mispredicted exceeds
    ``threshold_misprediction``.

    Args:
        base_trial: the trial to watch.
        threshold_imbalance: default 10.
        threshold_misprediction: default 0.7.
        samples: default 500.
        argmax: default False; True takes argmax over axis 1 of 2-D labels/predictions
            (one-hot labels, per-class scores). Otherwise values are flattened and rounded.
        labels_regex: default ".*labels"; predictions_regex: default ".*predictions"
            (several matches are paired in sorted order).

    Choices where smdebug is silent: counts accumulate over every saved step (a running count
    per class, so each step's tensors are read once); only classes present in the labels count
    towards the imbalance; mispredictions count where a prediction tensor of the same length was
    saved at the same step.
    """

    def __init__(self, base_trial: Trial, threshold_imbalance: Any = 10,
                 threshold_misprediction: Any = 0.7, samples: Any = 500, argmax: Any = False,
                 labels_regex: Any = ".*labels", predictions_regex: Any = ".*predictions",
                 action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.threshold_imbalance = as_float(name, "threshold_imbalance", threshold_imbalance, 1)
        self.threshold_misprediction = as_float(name, "threshold_misprediction",
                                                threshold_misprediction, 0, 1)
        self.samples = as_int(name, "samples", samples)
        self.argmax = as_bool(name, "argmax", argmax)
        self.labels_regex = as_regex_list(name, "labels_regex", labels_regex)
        self.predictions_regex = as_regex_list(name, "predictions_regex", predictions_regex)
        if not self.labels_regex:
            raise MltraceValueError(f"{name}: labels_regex must name the label tensors")
        self._labels = TensorSelection(name, [], self.labels_regex)
        self._predictions = TensorSelection(name, [], self.predictions_regex)
        self._counts: dict[int, int] = {}
        self._judged: dict[int, int] = {}
        self._wrong: dict[int, int] = {}

    def _add(self, y: np.ndarray, y_hat: np.ndarray | None) -> None:
        valid = y >= 0  # class_ids marks NaN/inf labels -1
        y, y_hat = y[valid], (None if y_hat is None else y_hat[valid])
        classes, counts = np.unique(y, return_counts=True)
        for c, k in zip(classes.tolist(), counts.tolist()):
            self._counts[c] = self._counts.get(c, 0) + k
        if y_hat is None:
            return
        wrong = y != y_hat
        for c in classes.tolist():
            mine = y == c
            self._judged[c] = self._judged.get(c, 0) + int(mine.sum())
            self._wrong[c] = self._wrong.get(c, 0) + int((mine & wrong).sum())

    def invoke_at_step(self, step: int) -> bool:
        trial = self.base_trial
        predictions = self._predictions.names(trial) if self.predictions_regex else []
        seen = False
        for i, label_name in enumerate(self._labels.names(trial)):
            value = value_at(trial.tensor(label_name), step)
            y = None if value is None else class_ids(value, self.argmax)
            if y is None:
                continue
            y_hat = None
            if i < len(predictions):
                raw = value_at(trial.tensor(predictions[i]), step)
                y_hat = None if raw is None else class_ids(raw, self.argmax)
                if y_hat is not None and y_hat.size != y.size:
                    y_hat = None
            self._add(y, y_hat)
            seen = True
        total = sum(self._counts.values())
        if not seen or total < self.samples:
            return False
        present = {c: k for c, k in self._counts.items() if k > 0}
        if len(present) >= 2:
            most = max(present, key=present.__getitem__)
            least = min(present, key=present.__getitem__)
            ratio = present[most] / present[least]
            if ratio > self.threshold_imbalance:
                self.last_message = (
                    f"class {most} has {present[most]} samples, class {least} {present[least]}: "
                    f"ratio {ratio:.3g} > threshold_imbalance {self.threshold_imbalance:g}")
                return True
        for c, judged in sorted(self._judged.items()):
            fraction = self._wrong[c] / judged if judged else 0.0
            if fraction > self.threshold_misprediction:
                self.last_message = (
                    f"{fraction:.3g} of class {c}'s {judged} samples were mispredicted "
                    f"(> threshold_misprediction {self.threshold_misprediction:g})")
                return True
        return False
