"""VanishingGradient: gradients whose mean absolute value falls below a threshold."""

from __future__ import annotations

from typing import Any

from mltrace.exceptions import TensorUnavailableForStep
from mltrace.rules.builtin._params import as_float
from mltrace.rules.rule import Rule
from mltrace.trials import Trial


class VanishingGradient(Rule):
    """Fires when, for any tensor of the ``gradients`` collection, mean(|g|) < ``threshold``.

    Args:
        base_trial: the trial to watch.
        threshold: default 1e-7 (smdebug's).

    Reads the stored ``abs_mean`` reduction when the hook saved one, else computes it from the
    raw gradient (Tensor.reduction_value does either).
    """

    def __init__(self, base_trial: Trial, threshold: Any = 1e-7, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        self.threshold = as_float(self.rule_name, "threshold", threshold)

    def invoke_at_step(self, step: int) -> bool:
        for tensor in self.base_trial.tensors_in_collection("gradients"):
            try:
                abs_mean = float(tensor.reduction_value(step, "mean", abs=True))
            except TensorUnavailableForStep:
                continue
            if abs_mean < self.threshold:
                self.last_message = (
                    f"{tensor.name} has mean |gradient| {abs_mean:.3g} < threshold "
                    f"{self.threshold:g}"
                )
                self.logger.info("step %d: %s", step, self.last_message)
                return True
        return False
