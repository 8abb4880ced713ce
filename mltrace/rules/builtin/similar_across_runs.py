"""SimilarAcrossRuns: the same tensor at the same step differs between two runs."""

from __future__ import annotations

from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.rules.builtin._params import as_float, as_names, as_regex_list, as_trial
from mltrace.rules.builtin._reading import TensorSelection, other_global_step, value_at
from mltrace.rules.rule import Rule
from mltrace.trials import Trial


def describe_difference(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> str | None:
    """None when ``a`` and ``b`` are equal within tolerances, else how they differ."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shapes {a.shape} and {b.shape}"
    if a.dtype.kind in "biufc" and b.dtype.kind in "biufc":
        if np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            return None
        with np.errstate(all="ignore"):
            diff = np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64))) if a.size else 0.0
        return f"max |difference| {diff:.3g}"
    return None if np.array_equal(a, b) else "different values"


class SimilarAcrossRuns(Rule):
    """Fires when a tensor differs between ``base_trial`` and ``other_trial`` at the same global
    step (e.g. two runs that should be deterministic).

    Args:
        base_trial: the trial whose steps drive the rule.
        other_trial: the trial to compare with (a Trial or its path; CLI: ``--other-trials PATH``).
        include_regex: regexes of tensor names to compare (smdebug's third argument, ``include``).
        collection_names: collections to compare.
        tensor_regex: more regexes; the union of all three. With none, every tensor of the base
            trial is compared (smdebug's default).
        rtol, atol: default 0 and 0 (mltrace's addition): values are "the same" when
            ``numpy.allclose(a, b, rtol, atol, equal_nan=True)``, so by default exactly equal
            (NaN equals NaN). Loosen them for runs on nondeterministic kernels.

    Tensors or steps the other trial does not have (yet) are skipped; different shapes count as
    different values.
    """

    def __init__(self, base_trial: Trial, other_trial: Any = None, include_regex: Any = None,
                 collection_names: Any = None, tensor_regex: Any = None, rtol: Any = 0.0,
                 atol: Any = 0.0, action_str: Any = None) -> None:
        other = as_trial(type(self).__name__, "other_trial", other_trial)
        if other is None:
            raise MltraceValueError(
                f"{type(self).__name__} needs other_trial, the run to compare with "
                "(CLI: --other-trials PATH)"
            )
        super().__init__(base_trial, other_trials=[other], action_str=action_str)
        self.other_trial_path = other.path
        self.include_regex = as_regex_list(self.rule_name, "include_regex", include_regex)
        self.collection_names = as_names(collection_names)
        self.tensor_regex = as_regex_list(self.rule_name, "tensor_regex", tensor_regex)
        self.rtol = as_float(self.rule_name, "rtol", rtol, 0)
        self.atol = as_float(self.rule_name, "atol", atol, 0)
        self._selection = TensorSelection(self.rule_name, self.collection_names,
                                          self.include_regex + self.tensor_regex,
                                          everything_when_empty=True)
        self._selection.check(base_trial)

    def invoke_at_step(self, step: int) -> bool:
        other = self.other_trials[0]
        if other_global_step(other, ModeKeys.GLOBAL, step) is None:
            return False
        for tensor in self._selection.tensors(self.base_trial, self):
            if not other.has_tensor(tensor.name):
                continue
            mine = value_at(tensor, step)
            if mine is None:
                continue
            theirs = value_at(other.tensor(tensor.name), step)
            if theirs is None:
                continue
            difference = describe_difference(mine, theirs, self.rtol, self.atol)
            if difference is not None:
                self.last_message = (f"{tensor.name} differs from {other.name!r} at {self.step_label(step)}: "
                                     f"{difference}")
                return True
        return False
