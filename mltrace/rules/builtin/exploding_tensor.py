"""ExplodingTensor (smdebug's) and NaNInfDetected (mltrace's): tensors holding NaN or infinity."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mltrace.exceptions import VALUE_UNAVAILABLE
from mltrace.rules.builtin._params import as_bool
from mltrace.rules.builtin._reading import (
    has_value,
    selection_from,
    stored_reduction,
    value_at,
)
from mltrace.rules.rule import Rule
from mltrace.trials import Trial
from mltrace.trials.tensor import Tensor


def nonfinite_counts(tensor: Tensor, step: int, use_raw: bool = True,
                     infer: bool = True) -> tuple[int | None, int | None]:
    """(NaN count, Inf count) of ``tensor`` at global ``step``; None where unknown.

    Exact from the stored ``nan_count``/``inf_count`` reductions, else (``use_raw``) from the
    raw value, read once. Else (``infer``) other stored reductions tell whether there is at
    least one (the count is then 1): a NaN min or max means a NaN; an infinite min or max an Inf;
    a NaN mean, sum, std, variance or norm a NaN or an Inf (reported as a NaN).
    """
    nan = stored_reduction(tensor, step, "nan_count")
    inf = stored_reduction(tensor, step, "inf_count")
    if nan is not None and inf is not None:
        return int(nan), int(inf)
    if use_raw and has_value(tensor, step):
        value = value_at(tensor, step)
        arr = None if value is None else np.asarray(value)
        if arr is not None and arr.dtype.kind in "fc":
            return int(np.count_nonzero(np.isnan(arr))), int(np.count_nonzero(np.isinf(arr)))
        if arr is not None and arr.dtype.kind in "biu":
            return 0, 0
    if not infer:
        return (None if nan is None else int(nan)), (None if inf is None else int(inf))
    try:
        stored = tensor.reduction_values(step)
    except VALUE_UNAVAILABLE:
        stored = {}
    for (name, _abs), reduced in stored.items():
        v = float(reduced)
        if name in ("min", "max") and math.isnan(v) and nan is None:
            nan = 1
        if name in ("min", "max") and math.isinf(v) and inf is None:
            inf = 1
        if name in ("mean", "sum", "std", "variance", "l1", "l2") and math.isnan(v) and nan is None:
            nan = 1
    return (None if nan is None else int(nan)), (None if inf is None else int(inf))


class ExplodingTensor(Rule):
    """Fires when an inspected tensor holds a NaN, or (unless ``only_nan``) +inf or -inf.

    Args:
        base_trial: the trial to watch.
        collection_names: collections to inspect (list or comma-separated string).
        tensor_regex: regexes of tensor names to inspect; with collection_names, the union.
            With neither, every tensor is inspected (smdebug's default).
        only_nan: default False; True ignores infinities.

    Reads the stored ``nan_count``/``inf_count`` reductions when the hook saved them (no raw
    tensor needed), else the raw value, else infers from other stored reductions (see
    ``nonfinite_counts``); a tensor with none of these at a step is skipped.
    """

    def __init__(self, base_trial: Trial, collection_names: Any = None, tensor_regex: Any = None,
                 only_nan: Any = False, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        self.collection_names, self.tensor_regex, self._selection = selection_from(
            self.rule_name, base_trial, collection_names, tensor_regex, everything_when_empty=True)
        self.only_nan = as_bool(self.rule_name, "only_nan", only_nan)

    def invoke_at_step(self, step: int) -> bool:
        for tensor in self._selection.tensors(self.base_trial, self):
            nan, inf = nonfinite_counts(tensor, step)
            if nan:
                self.last_message = f"{tensor.name} holds NaN at {self.step_label(step)}"
                return True
            if inf and not self.only_nan:
                self.last_message = f"{tensor.name} holds infinite values at {self.step_label(step)}"
                return True
        return False


class NaNInfDetected(Rule):
    """mltrace's NaN/Inf detector: fires when a tensor's ``nan_count`` (or, unless ``only_nan``,
    ``inf_count``) reduction is above zero; the message names every such tensor of the step with
    its counts, so the first layer that went non-finite can be told from the ones it poisoned.

    Unlike ExplodingTensor it is built on mltrace's count reductions, which a hook saves for
    a few bytes per tensor and step (``ReductionConfig(reductions=["nan_count", "inf_count"])``)
    without saving the tensors themselves.

    Args:
        base_trial: the trial to watch.
        collection_names: collections to inspect.
        tensor_regex: regexes of tensor names to inspect; with neither, every tensor.
        only_nan: default False; True ignores infinities.
        use_raw_tensors: default True: a tensor saved raw without count reductions is counted
            from its value; False reads stored reductions only (never a raw tensor).
    """

    def __init__(self, base_trial: Trial, collection_names: Any = None, tensor_regex: Any = None,
                 only_nan: Any = False, use_raw_tensors: Any = True,
                 action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        self.collection_names, self.tensor_regex, self._selection = selection_from(
            self.rule_name, base_trial, collection_names, tensor_regex, everything_when_empty=True)
        self.only_nan = as_bool(self.rule_name, "only_nan", only_nan)
        self.use_raw_tensors = as_bool(self.rule_name, "use_raw_tensors", use_raw_tensors)
        #: Per tensor, the first global step where it held NaN/Inf.
        self.first_nonfinite_step: dict[str, int] = {}

    def invoke_at_step(self, step: int) -> bool:
        found = []
        for tensor in self._selection.tensors(self.base_trial, self):
            nan, inf = nonfinite_counts(tensor, step, self.use_raw_tensors, infer=False)
            nan, inf = nan or 0, 0 if self.only_nan else (inf or 0)
            if nan > 0 or inf > 0:
                found.append((nan + inf, tensor.name, int(nan), int(inf)))
                self.first_nonfinite_step.setdefault(tensor.name, step)
        if not found:
            return False
        found.sort(key=lambda f: (-f[0], f[1]))
        parts = [f"{name} ({nan} NaN" + ("" if self.only_nan else f", {inf} Inf") + ")"
                 for _, name, nan, inf in found[:5]]
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        self.last_message = (f"{len(found)} tensor(s) non-finite at {self.step_label(step)}: "
                             f"{', '.join(parts)}{more}")
        return True
