"""FeatureImportanceOverweight and TreeDepth: XGBoost rules over the XGBoost hook's tensors
(``feature_importance/<type>/<feature>``, ``trees/<column>``; smdebug 1.0.34's XGBoost rules)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.rules.builtin._params import as_float, as_int, as_regex_list
from mltrace.rules.builtin._reading import TensorSelection, scalar_at, value_at
from mltrace.rules.rule import Rule
from mltrace.trials import Trial

TREE_NODES = "trees/Node"
TREE_IDS = "trees/Tree"


class FeatureImportanceOverweight(Rule):
    """Fires when the ``nfeatures`` most important features hold more than ``threshold`` of the
    total importance: a model leaning on a few features (or a leaked label).

    Args:
        base_trial: the trial to watch.
        threshold: default 0.8.
        nfeatures: default 3.
        tensor_regex: default ".*feature_importance/weight": one scalar tensor per feature
            (``feature_importance/weight/f0``...), as the XGBoost hook saves them.

    Choices where smdebug is silent: importances are normalized to sum 1 at each step (the hook
    already does); with ``nfeatures`` or fewer features saved at a step the sum is trivially 1,
    so the step is skipped rather than flagged.
    """

    def __init__(self, base_trial: Trial, threshold: Any = 0.8, nfeatures: Any = 3,
                 tensor_regex: Any = ".*feature_importance/weight", action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.threshold = as_float(name, "threshold", threshold, 0, 1)
        self.nfeatures = as_int(name, "nfeatures", nfeatures)
        if self.nfeatures < 1:
            raise MltraceValueError(f"{name}: nfeatures={nfeatures!r} must be a positive integer")
        self.tensor_regex = as_regex_list(name, "tensor_regex", tensor_regex)
        if not self.tensor_regex:
            raise MltraceValueError(
                f"{name}: tensor_regex must name the feature importance tensors")
        self._selection = TensorSelection(name, [], self.tensor_regex)

    def invoke_at_step(self, step: int) -> bool:
        importances = {}
        for tensor in self._selection.tensors(self.base_trial, self):
            value = scalar_at(tensor, step)
            if value is not None and math.isfinite(value) and value >= 0:
                importances[tensor.name] = value
        total = sum(importances.values())
        if len(importances) <= self.nfeatures or total <= 0:
            return False
        top = sorted(importances, key=importances.__getitem__, reverse=True)[: self.nfeatures]
        share = sum(importances[n] for n in top) / total
        if share > self.threshold:
            names = ", ".join(n.rsplit("/", 1)[-1] for n in top)
            self.last_message = (
                f"the {self.nfeatures} most important of {len(importances)} features ({names}) "
                f"hold {share:.3g} of the importance at {self.step_label(step)} "
                f"(> threshold {self.threshold:g})")
            return True
        return False


def exact_depths(ids: np.ndarray, yes: np.ndarray, no: np.ndarray) -> dict[str, int]:
    """Depth of each tree (edges from the root to the deepest leaf) from the hook's
    ``trees/ID``, ``trees/Yes`` and ``trees/No`` strings ("<tree>-<node>"; "nan" for leaves)."""
    names = [str(i) for i in np.asarray(ids).reshape(-1)]
    known = set(names)
    children = {i: [str(c) for c in (y, n) if str(c) in known]
                for i, y, n in zip(names, np.asarray(yes).reshape(-1), np.asarray(no).reshape(-1))}
    has_parent = {c for kids in children.values() for c in kids}
    depths = {}
    for root in (i for i in names if i not in has_parent):
        deepest, stack = 0, [(root, 0)]
        while stack:
            node, depth = stack.pop()
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children[node])
        depths[root.split("-", 1)[0]] = deepest
    return depths


def log2_depths(nodes: np.ndarray, trees: np.ndarray | None) -> dict[str, int]:
    """smdebug's estimate: ``floor(log2(largest node id + 1))`` per tree (exact for complete
    trees, 0 for a single leaf)."""
    nodes = np.asarray(nodes).reshape(-1).astype(np.int64)
    if trees is None or np.size(trees) != nodes.size or np.asarray(trees).dtype.kind not in "iuf":
        trees = np.zeros_like(nodes)
    trees = np.asarray(trees).reshape(-1).astype(np.int64)
    out = {}
    for tree in np.unique(trees):
        largest = int(nodes[trees == tree].max())
        out[str(tree)] = int(math.floor(math.log2(largest + 1))) if largest >= 0 else 0
    return out


class TreeDepth(Rule):
    """Fires when a tree of the current boosting iteration is shallower than ``depth``
    (XGBoost rejects splits that do not improve the loss, so trees may not grow as deep as
    intended).

    Args:
        base_trial: the trial to watch (the XGBoost hook's ``trees`` collection).
        depth: default 4.

    smdebug defines the depth as log2 of the largest node id in ``trees/Node``. That is exact
    only for complete trees, so where the hook saved ``trees/ID``, ``trees/Yes`` and
    ``trees/No`` (it saves the whole ``trees`` collection) mltrace walks the tree and takes the
    exact depth; otherwise it uses ``floor(log2(largest node id + 1))`` per ``trees/Tree``.
    Choice where smdebug is silent: the direction; its docs describe trees that "might not grow
    as deep as defined by the depth parameter", so shallower trees fire.
    """

    def __init__(self, base_trial: Trial, depth: Any = 4, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        self.depth = as_int(self.rule_name, "depth", depth)
        if self.depth < 0:
            raise MltraceValueError(f"{self.rule_name}: depth={depth!r} must not be negative")

    def _value(self, name: str, step: int) -> np.ndarray | None:
        trial = self.base_trial
        value = value_at(trial.tensor(name), step) if trial.has_tensor(name) else None
        return None if value is None or np.size(value) == 0 else np.asarray(value)

    def invoke_at_step(self, step: int) -> bool:
        ids, yes, no = (self._value(f"trees/{c}", step) for c in ("ID", "Yes", "No"))
        if ids is not None and yes is not None and no is not None and (
                ids.size == yes.size == no.size):
            depths = exact_depths(ids, yes, no)
        else:
            nodes = self._value(TREE_NODES, step)
            if nodes is None or nodes.dtype.kind not in "iuf":
                return False
            depths = log2_depths(nodes, self._value(TREE_IDS, step))
        for tree, depth in sorted(depths.items(), key=lambda kv: kv[1]):
            if depth < self.depth:
                self.last_message = (f"tree {tree} of {self.step_label(step)} has depth {depth} "
                                     f"< depth {self.depth}")
                return True
        return False
