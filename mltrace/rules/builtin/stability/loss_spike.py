"""LossSpike: a loss far above its recent values, far above anything seen before, or not finite."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.rules.builtin._params import as_bool, as_float
from mltrace.rules.builtin._reading import TensorSelection
from mltrace.rules.builtin.loss_not_decreasing import loss_selection
from mltrace.rules.builtin.stability._signals import (
    Running,
    StabilityRule,
    check_min_history,
    fmt,
    int_param,
    step_mode,
)
from mltrace.stability.windows import window_mean_std
from mltrace.trials import Trial

#: An increase smaller than this fraction of the window's mean is never a spike, so that a loss
#: constant to its last digits (a standard deviation of 0) does not fire on rounding.
MIN_RELATIVE_RISE = 1e-3


def loss_tensors(rule: str, trial: Trial, collection_names: Any, tensor_regex: Any,
                 use_losses_collection: bool) -> tuple[list[str], list[str], TensorSelection]:
    """LossNotDecreasing's choice of losses (``loss_selection``), with an error when the trial
    holds nothing that could be one.

    Raises:
        MltraceValueError: no collection or regex given, no ``losses`` collection, and no tensor
            whose name holds "loss"; the message says to record the losses collection.
    """
    names, regexes, selection = loss_selection(rule, trial, collection_names, tensor_regex,
                                               use_losses_collection)
    has_losses = use_losses_collection and "losses" in trial.collections()
    if not names and not regexes and not has_losses and not selection.names(trial):
        raise MltraceValueError(
            f"{rule} needs a loss and trial {trial.name!r} has no losses collection and no tensor "
            "named like 'loss': record the losses with include_collections=['stability'] (or "
            "['losses']) on the hook (hook.record_tensor_value for a loss the framework does not "
            "see), or name the loss tensors with tensor_regex"
        )
    return names, regexes, selection


def mode_label(name: str, mode: ModeKeys) -> str:
    """A loss tensor's name with the mode its series belongs to."""
    return name if mode is ModeKeys.GLOBAL else f"{name} ({mode.name})"


class LossSpike(StabilityRule):
    """Fires when a loss spikes: it is above the mean plus ``sigmas`` standard deviations of its
    last ``window`` values (OLMo-core's StabilityMonitorCallback: 6 sigma over 128 values), or
    above ``max_factor`` times the largest loss seen before it (Megatron-LM's spiky-loss check,
    SPIKY_LOSS_FACTOR 10), or is not finite (NaN or infinite).

    Args:
        base_trial: the trial to watch.
        collection_names: collections of loss tensors.
        tensor_regex: regexes of loss tensor names.
        use_losses_collection: default True: also the ``losses`` collection when present. With
            nothing selected, tensors whose name contains "loss" (LossNotDecreasing's choice).
        sigmas: default 6.0 (OLMo-core), > 0.
        window: default 128 (OLMo-core), at least 2: how many earlier values the mean and
            standard deviation run over.
        max_factor: default 10.0 (Megatron-LM), >= 1; checked only while the largest earlier
            loss is positive.
        min_history: default 16, in [2, window]: the window must hold this many finite values
            before the two spike tests judge a step (a warm-up: the first steps' statistics are
            too noisy to judge by). A non-finite loss fires from the first step.

    Each loss and each mode (TRAIN, EVAL...) is a series of its own: an EVAL loss is compared
    with the EVAL losses before it. The standard deviation is the sample one (ddof 1); a rise
    below 0.1% of the window's mean never fires, so a loss constant to its last digits does not
    fire on rounding. Each loss is read once per step; the largest earlier loss is kept as a
    running maximum (a rule invoked on an earlier step recomputes it from the trial).
    """

    def __init__(self, base_trial: Trial, collection_names: Any = None, tensor_regex: Any = None,
                 use_losses_collection: Any = True, sigmas: Any = 6.0, window: Any = 128,
                 max_factor: Any = 10.0, min_history: Any = 16, action_str: Any = None) -> None:
        name = type(self).__name__
        size = int_param(name, "window", window, 2)
        super().__init__(base_trial, action_str, size + 1)
        self.use_losses_collection = as_bool(name, "use_losses_collection", use_losses_collection)
        self.collection_names, self.tensor_regex, self._selection = loss_tensors(
            name, base_trial, collection_names, tensor_regex, self.use_losses_collection)
        self.sigmas = as_float(name, "sigmas", sigmas, 0, inclusive=False)
        self.window = size
        self.max_factor = as_float(name, "max_factor", max_factor, 1)
        self.min_history = int_param(name, "min_history", min_history, 2)
        check_min_history(name, self.min_history, self.window)
        self._largest = Running(self._history, lambda: -math.inf, _running_max)

    def invoke_at_step(self, step: int) -> bool:
        mode = step_mode(self.base_trial, step)
        findings = []
        for name in self.signal_tensors(self._selection.names(self.base_trial), step):
            loss = self._history.scalar(name, step)
            if loss is None:
                continue
            label = mode_label(name, mode)
            if not math.isfinite(loss):
                findings.append(f"{label}: the loss is {loss}")
                continue
            window = self._history.window(name, step, self.window)
            count = int(np.isfinite(window).sum())
            if count < self.min_history:
                continue
            mean_a, std_a = window_mean_std(window)
            mean, std = float(mean_a[0]), float(std_a[0])
            limit = mean + self.sigmas * std
            if loss > limit and loss - mean > MIN_RELATIVE_RISE * abs(mean):
                findings.append(
                    f"{label}: the loss {fmt(loss)} is above the mean {fmt(mean)} + sigmas "
                    f"{self.sigmas:g} x std {fmt(std)} = {fmt(limit)} of its last {count} values")
                continue
            largest = self._largest.before(name, step)
            if largest > 0 and loss > self.max_factor * largest:
                findings.append(
                    f"{label}: the loss {fmt(loss)} is above max_factor {self.max_factor:g} x "
                    f"the largest earlier loss {fmt(largest)}")
        return self.report_findings(step, findings)


def _running_max(state: float, name: str, step: int, value: np.ndarray) -> float:
    """The running maximum of a scalar series (non-finite values left out)."""
    if value.size == 1 and math.isfinite(float(value[0])):
        return max(state, float(value[0]))
    return state


__all__ = ["LossSpike", "loss_tensors", "mode_label"]
