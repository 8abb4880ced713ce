"""CheckInputImages and NLPSequenceRatio: problems in the data a model is fed."""

from __future__ import annotations

from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.rules.builtin._params import (
    as_float,
    as_float_list,
    as_int,
    as_regex_list,
    check_range,
)
from mltrace.rules.builtin._reading import TensorSelection, value_at
from mltrace.rules.rule import Rule
from mltrace.trials import Trial


class CheckInputImages(Rule):
    """Fires when, after at least ``threshold_samples`` images were seen, the mean of an input
    channel deviates from 0 by more than ``threshold_mean`` (inputs are expected normalized to
    zero mean and unit variance).

    Args:
        base_trial: the trial to watch.
        threshold_mean: default 0.2.
        threshold_samples: default 500 images.
        regex: default ".*hybridsequential0_input_0" (MXNet Gluon's model input; for PyTorch the
            model input is ``<RootClass>_input_0``); a list or comma-separated regexes.
        channel: default 1: the axis of the colour channels (NCHW); 3 for NHWC.

    Choices where smdebug is silent: the mean runs over every image seen so far (all saved steps,
    a running sum per channel, so each step's tensor is read once); a sample is one entry of
    axis 0; tensors of fewer than 3 dimensions, or without the channel axis, count as one
    channel. Needs the raw input tensor.
    """

    def __init__(self, base_trial: Trial, threshold_mean: Any = 0.2, threshold_samples: Any = 500,
                 regex: Any = ".*hybridsequential0_input_0", channel: Any = 1,
                 action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.threshold_mean = as_float(name, "threshold_mean", threshold_mean, 0)
        self.threshold_samples = as_int(name, "threshold_samples", threshold_samples)
        self.regex = as_regex_list(name, "regex", regex)
        if not self.regex:
            raise MltraceValueError(f"{name}: regex must name the input tensors")
        self.channel = as_int(name, "channel", channel)
        self._selection = TensorSelection(name, [], self.regex)
        self._samples: dict[str, int] = {}
        self._sums: dict[str, np.ndarray] = {}
        self._counts: dict[str, np.ndarray] = {}

    def _accumulate(self, tensor_name: str, value: np.ndarray) -> None:
        arr = np.asarray(value, dtype=np.float64)
        if arr.ndim >= 3 and -arr.ndim <= self.channel < arr.ndim and self.channel % arr.ndim != 0:
            per_channel = np.moveaxis(arr, self.channel, 0).reshape(arr.shape[self.channel], -1)
        else:
            per_channel = arr.reshape(1, -1)
        sums = per_channel.sum(axis=1)
        counts = np.full(per_channel.shape[0], per_channel.shape[1], np.float64)
        if tensor_name in self._sums and self._sums[tensor_name].shape == sums.shape:
            self._sums[tensor_name] += sums
            self._counts[tensor_name] += counts
        else:
            self._sums[tensor_name], self._counts[tensor_name] = sums, counts
        samples = arr.shape[0] if arr.ndim else 1
        self._samples[tensor_name] = self._samples.get(tensor_name, 0) + samples

    def invoke_at_step(self, step: int) -> bool:
        for tensor in self._selection.tensors(self.base_trial, self):
            value = value_at(tensor, step)
            if value is None or np.asarray(value).dtype.kind not in "biuf" or np.size(value) == 0:
                continue
            self._accumulate(tensor.name, value)
            samples = self._samples[tensor.name]
            if samples < self.threshold_samples:
                continue
            means = self._sums[tensor.name] / self._counts[tensor.name]
            worst = int(np.argmax(np.abs(means)))
            if abs(means[worst]) > self.threshold_mean:
                self.last_message = (
                    f"{tensor.name}: mean of channel {worst} over {samples} samples is "
                    f"{means[worst]:.3g}, |mean| > threshold_mean {self.threshold_mean:g} "
                    "(inputs not normalized?)")
                return True
        return False


class NLPSequenceRatio(Rule):
    """Fires when, in an input sequence tensor at a step, the percentage of tokens equal to one of
    ``token_values`` exceeds its threshold (too much padding or too many unknown words).

    Args:
        base_trial: the trial to watch.
        tensor_regex: default ".*embedding0_input_0" (the token ids fed to an embedding).
        token_values: default "0"; token ids, a list or comma-separated string.
        token_thresholds_percent: default "50"; one percentage per token value, or one for all.

    Choice where smdebug is silent: the ratio is taken per saved step (that step's batch), over
    every element of the tensor. Needs the raw input tensor.
    """

    def __init__(self, base_trial: Trial, tensor_regex: Any = ".*embedding0_input_0",
                 token_values: Any = "0", token_thresholds_percent: Any = "50",
                 action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.tensor_regex = as_regex_list(name, "tensor_regex", tensor_regex)
        if not self.tensor_regex:
            raise MltraceValueError(f"{name}: tensor_regex must name the input sequence tensors")
        self.token_values = as_float_list(name, "token_values", token_values)
        thresholds = as_float_list(name, "token_thresholds_percent", token_thresholds_percent)
        if not self.token_values:
            raise MltraceValueError(f"{name}: token_values must list at least one token id")
        if len(thresholds) == 1:
            thresholds = thresholds * len(self.token_values)
        if len(thresholds) != len(self.token_values):
            raise MltraceValueError(
                f"{name}: token_thresholds_percent has {len(thresholds)} values for "
                f"{len(self.token_values)} token_values; give one per token or one for all"
            )
        self.token_thresholds_percent = [check_range(name, "token_thresholds_percent", t, 0, 100)
                                         for t in thresholds]
        self._selection = TensorSelection(name, [], self.tensor_regex)

    def invoke_at_step(self, step: int) -> bool:
        for tensor in self._selection.tensors(self.base_trial, self):
            value = value_at(tensor, step)
            if value is None or np.size(value) == 0 or np.asarray(value).dtype.kind not in "biuf":
                continue
            arr = np.asarray(value)
            for token, threshold in zip(self.token_values, self.token_thresholds_percent):
                percent = 100.0 * np.count_nonzero(arr == token) / arr.size
                if percent > threshold:
                    self.last_message = (
                        f"{tensor.name}: {percent:.3g}% of tokens are {token:g} at {self.step_label(step)} "
                        f"(threshold {threshold:g}%)")
                    return True
        return False
