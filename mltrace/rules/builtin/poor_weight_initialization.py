"""PoorWeightInitialization: signs in the first steps that the initial weights are badly scaled."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.rules.builtin._params import as_float, as_int, as_regex_list
from mltrace.rules.builtin._reading import (
    LOSS_REGEX,
    TensorSelection,
    mode_of,
    reduction_at,
    scalar_at,
    value_at,
)
from mltrace.rules.rule import Rule
from mltrace.trials import Trial


class PoorWeightInitialization(Rule):
    """During the first ``steps`` training steps, fires when any of:

    1. the variances of the activation inputs of different layers differ too much:
       max variance / min variance > ``threshold`` (needs two or more matching layers);
    2. a gradient is too narrowly distributed: for some tensor of the ``gradients`` collection,
       its 95th minus 5th percentile < ``distribution_range``;
    3. the loss has not reached a new minimum for ``patience`` steps.

    Args:
        base_trial: the trial to watch.
        activation_inputs_regex: default ".*relu_input".
        threshold: default 10.0.
        distribution_range: default 0.001.
        patience: default 5 (steps).
        steps: default 10: only TRAIN mode steps 0 .. steps-1 are checked (global steps in a
            trial saved without modes; EVAL and PREDICT steps are skipped).

    Choices where smdebug is silent: a variance of 0 next to a positive one is an infinite
    ratio; the variance is the ``variance`` reduction (stored, or computed from the raw value);
    the percentiles need raw gradients (tensors saved only as reductions are skipped); the loss
    tensors are the ``losses`` collection, else names containing "loss", each tracked on its own.
    """

    def __init__(self, base_trial: Trial, activation_inputs_regex: Any = ".*relu_input",
                 threshold: Any = 10.0, distribution_range: Any = 0.001, patience: Any = 5,
                 steps: Any = 10, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.activation_inputs_regex = as_regex_list(name, "activation_inputs_regex",
                                                     activation_inputs_regex)
        self.threshold = as_float(name, "threshold", threshold, 1)
        self.distribution_range = as_float(name, "distribution_range", distribution_range, 0)
        self.patience = as_int(name, "patience", patience)
        self.steps = as_int(name, "steps", steps)
        if self.patience < 1 or self.steps < 1:
            raise MltraceValueError(f"{name}: patience and steps must be positive integers")
        self._activations = TensorSelection(name, [], self.activation_inputs_regex)
        self._gradients = TensorSelection(name, [], [], optional_collections=("gradients",))
        self._losses = TensorSelection(name, [], [], optional_collections=("losses",),
                                       fallback_regex=[LOSS_REGEX])
        self._best: dict[str, tuple[float, int]] = {}

    def invoke_at_step(self, step: int) -> bool:
        mode, mode_step = mode_of(self.base_trial, step)
        if mode in (ModeKeys.EVAL, ModeKeys.PREDICT) or mode_step >= self.steps:
            return False
        loss_message = self._loss(step, mode_step)  # always: it keeps the best loss up to date
        message = self._variances(step) or self._gradient_spread(step) or loss_message
        if message:
            self.last_message = f"{self.step_label(mode_step, mode)}: {message}"
            return True
        return False

    def _variances(self, step: int) -> str | None:
        variances = {}
        for tensor in self._activations.tensors(self.base_trial):
            variance = reduction_at(tensor, step, "variance")
            if variance is not None and not math.isnan(variance):
                variances[tensor.name] = variance
        if len(variances) < 2:
            return None
        high = max(variances, key=variances.__getitem__)
        low = min(variances, key=variances.__getitem__)
        if variances[high] == 0:
            return None
        ratio = variances[high] / variances[low] if variances[low] > 0 else math.inf
        if ratio > self.threshold:
            return (f"activation input variances differ {ratio:.3g}x ({high} "
                    f"{variances[high]:.3g}, {low} {variances[low]:.3g}) > threshold "
                    f"{self.threshold:g}")
        return None

    def _gradient_spread(self, step: int) -> str | None:
        for tensor in self._gradients.tensors(self.base_trial):
            value = value_at(tensor, step)
            if value is None or np.size(value) < 2 or np.asarray(value).dtype.kind not in "fiu":
                continue
            p5, p95 = np.percentile(np.asarray(value, dtype=np.float64), [5, 95])
            if p95 - p5 < self.distribution_range:
                return (f"{tensor.name} spans only {p95 - p5:.3g} between its 5th and 95th "
                        f"percentiles (< distribution_range {self.distribution_range:g})")
        return None

    def _loss(self, step: int, mode_step: int) -> str | None:
        message = None
        for tensor in self._losses.tensors(self.base_trial):
            loss = scalar_at(tensor, step)
            if loss is None or math.isnan(loss):
                continue
            best = self._best.get(tensor.name)
            if best is None or loss < best[0]:
                self._best[tensor.name] = (loss, mode_step)
            elif message is None and mode_step - best[1] >= self.patience:
                message = (f"{tensor.name} has not improved on {best[0]:.6g} (step {best[1]}) for "
                           f"{mode_step - best[1]} steps (patience {self.patience})")
        return message
