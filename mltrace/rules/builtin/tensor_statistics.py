"""AllZero and TensorVariance: conditions on one statistic of each inspected tensor."""

from __future__ import annotations

from typing import Any

from mltrace.exceptions import VALUE_UNAVAILABLE, MltraceValueError
from mltrace.rules.builtin._params import as_float, as_optional_float
from mltrace.rules.builtin._reading import reduction_at, selection_from
from mltrace.rules.rule import Rule
from mltrace.trials import Trial
from mltrace.trials.tensor import Tensor


def zero_fraction(tensor: Tensor, step: int) -> tuple[float | None, bool]:
    """(fraction of zeros, exact) at ``step``: from the stored ``zero_fraction`` reduction or the
    raw value (exact); else from stored reductions that can only tell "all zero" (1.0) or "not
    all zero" (returned as 0.0 with exact=False); (None, False) when unknown."""
    fraction = reduction_at(tensor, step, "zero_fraction")
    if fraction is not None:
        return fraction, True
    try:
        stored = tensor.reduction_values(step)
    except VALUE_UNAVAILABLE:
        return None, False
    by_name = {(n, a): float(v) for (n, a), v in stored.items()}
    for key in (("max", True), ("l1", False), ("l1", True), ("l2", False), ("sum", True)):
        if key in by_name:
            return (1.0, True) if by_name[key] == 0 else (0.0, False)
    if ("max", False) in by_name and ("min", False) in by_name:
        all_zero = by_name[("max", False)] == 0 and by_name[("min", False)] == 0
        return (1.0, True) if all_zero else (0.0, False)
    return None, False


class AllZero(Rule):
    """Fires when at least ``threshold`` percent of a tensor's values are zero.

    Args:
        base_trial: the trial to watch.
        collection_names: collections to inspect.
        tensor_regex: regexes of tensor names; one of the two is required (union when both).
        threshold: default 100 (percent of values equal to zero).

    Reads mltrace's ``zero_fraction`` reduction when stored, else the raw value; a tensor saved
    only with smdebug's reductions is all-zero when its abs max, L1 norm or (min, max) is 0, which
    decides the default threshold of 100 % (lower thresholds need the fraction and skip it).
    """

    def __init__(self, base_trial: Trial, collection_names: Any = None, tensor_regex: Any = None,
                 threshold: Any = 100, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        self.collection_names, self.tensor_regex, self._selection = selection_from(
            self.rule_name, base_trial, collection_names, tensor_regex, required=True)
        self.threshold = as_float(self.rule_name, "threshold", threshold, 0, 100)

    def invoke_at_step(self, step: int) -> bool:
        for tensor in self._selection.tensors(self.base_trial, self):
            fraction, exact = zero_fraction(tensor, step)
            if fraction is None or (not exact and self.threshold < 100):
                continue
            percent = 100.0 * fraction
            if percent >= self.threshold:
                self.last_message = (f"{tensor.name}: {percent:.4g}% of values are zero at "
                                     f"{self.step_label(step)} (threshold {self.threshold:g}%)")
                return True
        return False


class TensorVariance(Rule):
    """Fires when a tensor's variance is above ``max_threshold`` or below ``min_threshold``.

    Args:
        base_trial: the trial to watch.
        collection_names: collections to inspect.
        tensor_regex: regexes of tensor names; one of the two is required (union when both).
        max_threshold: default None (no upper bound).
        min_threshold: default None (no lower bound); at least one bound is required.

    The variance is mltrace's ``variance`` reduction (population variance, ddof=0, over the
    flattened tensor), stored by the hook or computed from the raw value.
    """

    def __init__(self, base_trial: Trial, collection_names: Any = None, tensor_regex: Any = None,
                 max_threshold: Any = None, min_threshold: Any = None,
                 action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        self.collection_names, self.tensor_regex, self._selection = selection_from(
            self.rule_name, base_trial, collection_names, tensor_regex, required=True)
        self.max_threshold = as_optional_float(self.rule_name, "max_threshold", max_threshold)
        self.min_threshold = as_optional_float(self.rule_name, "min_threshold", min_threshold)
        if self.max_threshold is None and self.min_threshold is None:
            raise MltraceValueError(f"{self.rule_name}: pass max_threshold, min_threshold or both")
        if (self.max_threshold is not None and self.min_threshold is not None
                and self.min_threshold > self.max_threshold):
            raise MltraceValueError(
                f"{self.rule_name}: min_threshold must not exceed max_threshold")

    def invoke_at_step(self, step: int) -> bool:
        for tensor in self._selection.tensors(self.base_trial, self):
            variance = reduction_at(tensor, step, "variance")
            if variance is None:
                continue
            if self.max_threshold is not None and variance > self.max_threshold:
                bound = f"> max_threshold {self.max_threshold:g}"
            elif self.min_threshold is not None and variance < self.min_threshold:
                bound = f"< min_threshold {self.min_threshold:g}"
            else:
                continue
            self.last_message = f"{tensor.name}: variance {variance:.3g} {bound} at {self.step_label(step)}"
            return True
        return False
