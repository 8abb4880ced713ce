"""DeadRelu and SaturatedActivation: layers whose units have stopped passing signal."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from mltrace.rules.builtin._params import as_float, as_range, as_regex_list
from mltrace.rules.builtin._reading import TensorSelection, selection_from, units_fraction, value_at
from mltrace.rules.rule import Rule
from mltrace.trials import Trial


def _percentages(name: str, inactivity: Any, layer: Any) -> tuple[float, float]:
    return (as_float(name, "threshold_inactivity", inactivity, 0, 100),
            as_float(name, "threshold_layer", layer, 0, 100))


class _UnitActivityRule(Rule):
    """A rule that fires when more than ``threshold_layer`` percent of a layer's units are active
    in fewer than ``threshold_inactivity`` percent of the samples; subclasses say what "active"
    means and how to word the finding."""

    threshold_inactivity: float
    threshold_layer: float
    _selection: TensorSelection

    def _active(self, tensor_name: str, value: NDArray[Any]) -> NDArray[np.bool_]:
        """Where the units of ``value`` are active (same shape as ``value``)."""
        raise NotImplementedError

    def _finding(self, tensor_name: str, share: float, units: int, step: int) -> str:
        """The message for ``share`` percent of ``units`` units being inactive at ``step``."""
        raise NotImplementedError

    def invoke_at_step(self, step: int) -> bool:
        for tensor in self._selection.tensors(self.base_trial, self):
            value = value_at(tensor, step)
            if value is None or np.asarray(value).dtype.kind not in "biuf":
                continue
            activity = units_fraction(self._active(tensor.name, np.asarray(value)))
            if activity is None:
                continue
            share = 100.0 * float(np.mean(100.0 * activity < self.threshold_inactivity))
            if share > self.threshold_layer:
                self.last_message = self._finding(tensor.name, share, activity.size, step)
                return True
        return False


class DeadRelu(_UnitActivityRule):
    """Fires when more than ``threshold_layer`` percent of a ReLU layer's units are dead: active
    (output > 0) in fewer than ``threshold_inactivity`` percent of the samples.

    Args:
        base_trial: the trial to watch.
        tensor_regex: regexes of ReLU output tensors; default None: the ``relu_output``
            collection when the trial has it, else names matching ".*relu_output" (the
            collection SageMaker configured for this rule).
        threshold_inactivity: default 1.0 (percent of samples).
        threshold_layer: default 50.0 (percent of units).

    A unit is a position of axis 1 (a neuron of a dense layer, a channel of a convolution in
    NCHW); its activity is the percentage of samples (axis 0, and every remaining position) where
    it is active, over the batch saved at that step (smdebug does not document this). Needs the
    raw tensor.
    """

    def __init__(self, base_trial: Trial, tensor_regex: Any = None, threshold_inactivity: Any = 1.0,
                 threshold_layer: Any = 50.0, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        self.tensor_regex = as_regex_list(self.rule_name, "tensor_regex", tensor_regex)
        self.threshold_inactivity, self.threshold_layer = _percentages(
            self.rule_name, threshold_inactivity, threshold_layer)
        if self.tensor_regex:
            self._selection = TensorSelection(self.rule_name, [], self.tensor_regex)
        else:
            self._selection = TensorSelection(self.rule_name, [], [],
                                              optional_collections=("relu_output",),
                                              fallback_regex=[".*relu_output"])

    def _active(self, tensor_name: str, value: NDArray[Any]) -> NDArray[np.bool_]:
        return value > 0

    def _finding(self, tensor_name: str, share: float, units: int, step: int) -> str:
        return (f"{tensor_name}: {share:.3g}% of {units} units are dead at {self.step_label(step)} "
                f"(active in < {self.threshold_inactivity:g}% of samples; "
                f"threshold_layer {self.threshold_layer:g}%)")


class SaturatedActivation(_UnitActivityRule):
    """Fires when more than ``threshold_layer`` percent of a tanh or sigmoid layer's units are
    saturated: their input lies inside the non-saturated range in fewer than
    ``threshold_inactivity`` percent of the samples.

    Args:
        base_trial: the trial to watch.
        collection_names: collections of activation-input tensors.
        tensor_regex: default ".*tanh_input, .*sigmoid_input" (union with the collections).
        threshold_tanh: default (-9.4999, 9.4999): beyond it tanh's gradient is below 1e-7.
        threshold_sigmoid: default (-23, 16.99999): likewise for the sigmoid.
        threshold_inactivity: default 1.0 (percent of samples).
        threshold_layer: default 50.0 (percent of units).

    Choice where smdebug is silent: a tensor whose name contains "sigmoid" (any case) uses the
    sigmoid range, any other the tanh range. The ranges are open intervals.

    A unit is a position of axis 1 (a neuron of a dense layer, a channel of a convolution in
    NCHW); its activity is the percentage of samples (axis 0, and every remaining position) where
    it is active, over the batch saved at that step (smdebug does not document this). Needs the
    raw tensor.
    """

    def __init__(self, base_trial: Trial, collection_names: Any = None,
                 tensor_regex: Any = ".*tanh_input, .*sigmoid_input",
                 threshold_tanh: Any = (-9.4999, 9.4999), threshold_sigmoid: Any = (-23, 16.99999),
                 threshold_inactivity: Any = 1.0, threshold_layer: Any = 50.0,
                 action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.collection_names, self.tensor_regex, self._selection = selection_from(
            name, base_trial, collection_names, tensor_regex)
        self.threshold_tanh = as_range(name, "threshold_tanh", threshold_tanh)
        self.threshold_sigmoid = as_range(name, "threshold_sigmoid", threshold_sigmoid)
        self.threshold_inactivity, self.threshold_layer = _percentages(
            name, threshold_inactivity, threshold_layer)

    def _range(self, tensor_name: str) -> tuple[float, float]:
        return self.threshold_sigmoid if "sigmoid" in tensor_name.lower() else self.threshold_tanh

    def _active(self, tensor_name: str, value: NDArray[Any]) -> NDArray[np.bool_]:
        low, high = self._range(tensor_name)
        arr = value.astype(np.float64)
        return (arr > low) & (arr < high)

    def _finding(self, tensor_name: str, share: float, units: int, step: int) -> str:
        low, high = self._range(tensor_name)
        return (f"{tensor_name}: {share:.3g}% of {units} units are saturated at {self.step_label(step)} "
                f"(input outside ({low:g}, {high:g}) in > "
                f"{100 - self.threshold_inactivity:g}% of samples)")
