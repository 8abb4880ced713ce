"""GradientNormVsBaseline (mltrace's): a layer's gradient norm far from a baseline run's."""

from __future__ import annotations

import math
from typing import Any

from mltrace.exceptions import MltraceValueError
from mltrace.rules.builtin._params import as_float, as_names, as_regex_list, as_trial
from mltrace.rules.builtin._reading import TensorSelection, mode_of, other_global_step, reduction_at
from mltrace.rules.rule import Rule
from mltrace.trials import Trial

NORMS = ("l1", "l2")


class GradientNormVsBaseline(Rule):
    """Fires when a tensor's norm is more than ``max_ratio`` times (or, with ``min_ratio``, less
    than ``min_ratio`` times) the same tensor's norm in a baseline run at the same step: a
    regression test for training dynamics ("this change made fc1's gradients 10x larger").

    Args:
        base_trial: the run under test.
        other_trial: the baseline run (a Trial or its path; CLI: ``--other-trials PATH``).
        max_ratio: default 10.0; fires when norm / baseline norm > max_ratio.
        min_ratio: default 0.0 (off); fires when norm / baseline norm < min_ratio.
        collection_names: default "gradients".
        tensor_regex: regexes of tensor names (union with the collections).
        norm: "l2" (default) or "l1", over the flattened tensor.

    Steps are matched by mode and mode step (TRAIN step 40 with the baseline's TRAIN step 40),
    so runs that evaluate at different times still line up; trials saved without modes match by
    global step. Reads stored norm reductions when present (no raw tensor needed), else computes
    them from the raw tensors. A baseline norm of 0 gives an infinite ratio when the run's norm
    is not 0 (and 1 when both are). Steps and tensors the baseline lacks are skipped.
    """

    def __init__(self, base_trial: Trial, other_trial: Any = None, max_ratio: Any = 10.0,
                 min_ratio: Any = 0.0, collection_names: Any = "gradients",
                 tensor_regex: Any = None, norm: Any = "l2", action_str: Any = None) -> None:
        name = type(self).__name__
        baseline = as_trial(name, "other_trial", other_trial)
        if baseline is None:
            raise MltraceValueError(
                f"{name} needs other_trial, the baseline run (CLI: --other-trials PATH)")
        super().__init__(base_trial, other_trials=[baseline], action_str=action_str)
        self.baseline_path = baseline.path
        self.max_ratio = as_float(name, "max_ratio", max_ratio, 0, inclusive=False)
        self.min_ratio = as_float(name, "min_ratio", min_ratio, 0)
        if self.min_ratio >= self.max_ratio:
            raise MltraceValueError(f"{name}: min_ratio={self.min_ratio:g} must be below "
                                    f"max_ratio={self.max_ratio:g}")
        self.collection_names = as_names(collection_names)
        self.tensor_regex = as_regex_list(name, "tensor_regex", tensor_regex)
        self.norm = str(norm).strip().lower()
        if self.norm not in NORMS:
            raise MltraceValueError(f"{name}: norm={norm!r} must be one of {', '.join(NORMS)}")
        if not self.collection_names and not self.tensor_regex:
            raise MltraceValueError(f"{name}: pass collection_names or tensor_regex")
        self._selection = TensorSelection(name, [], self.tensor_regex,
                                          optional_collections=tuple(self.collection_names))

    def invoke_at_step(self, step: int) -> bool:
        baseline = self.other_trials[0]
        mode, mode_step = mode_of(self.base_trial, step)
        base_step = other_global_step(baseline, mode, mode_step)
        if base_step is None:
            return False
        for tensor in self._selection.tensors(self.base_trial, self):
            if not baseline.has_tensor(tensor.name):
                continue
            norm = reduction_at(tensor, step, self.norm)
            reference = reduction_at(baseline.tensor(tensor.name), base_step, self.norm)
            if norm is None or reference is None or math.isnan(reference):
                continue
            if math.isnan(norm):
                self.last_message = (f"{tensor.name} {self.norm} norm is NaN at "
                                     f"{self.step_label(mode_step, mode)}; the baseline's is {reference:.3g}")
                return True
            ratio = norm / reference if reference > 0 else (math.inf if norm > 0 else 1.0)
            if ratio > self.max_ratio or ratio < self.min_ratio:
                self.last_message = (
                    f"{tensor.name} {self.norm} norm {norm:.3g} is {ratio:.3g}x the baseline's "
                    f"{reference:.3g} at {self.step_label(mode_step, mode)}"
                )
                return True
        return False
