"""WeightUpdateRatio: updates that are too large or too small for the weights they change."""

from __future__ import annotations

from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.rules.builtin._params import as_float, as_optional_int
from mltrace.rules.builtin._reading import SavedSteps, TensorSelection, mode_of, value_at
from mltrace.rules.rule import Rule
from mltrace.trials import Trial
from mltrace.trials.tensor import Tensor


class WeightUpdateRatio(Rule):
    """Fires when, for a tensor of the ``weights`` collection,
    ``ratio = ||W_s - W_p||_2 / (||W_p||_2 + epsilon)`` is above ``large_threshold`` or below
    ``small_threshold``, where ``W_p`` is the weight at the previous saved step.

    Args:
        base_trial: the trial to watch.
        num_steps: default None: ``p`` is the previous step where the weight was saved; an
            integer compares with exactly ``num_steps`` steps earlier (skipped where that step was
            not saved). smdebug's advice stands: save weights every step (save_interval=1), as
            the thresholds are meant for one update.
        large_threshold: default 10.0.
        small_threshold: default 1e-8 (a frozen or never-updated weight fires).
        epsilon: default 1e-9, added to the denominator.

    Choices where smdebug is silent: the norm is the L2 norm over the flattened tensor (the
    "update-to-weight ratio" rule of thumb); steps are TRAIN mode steps (weights do not change
    in EVAL or PREDICT, whose steps are skipped), or global steps in a trial saved without
    modes. The last value read per weight is kept, so each weight is read once per step.
    """

    def __init__(self, base_trial: Trial, num_steps: Any = None, large_threshold: Any = 10.0,
                 small_threshold: Any = 1e-8, epsilon: Any = 1e-9, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.num_steps = as_optional_int(name, "num_steps", num_steps)
        if self.num_steps is not None and self.num_steps < 1:
            raise MltraceValueError(
                f"{name}: num_steps={num_steps!r} must be a positive integer or None")
        self.large_threshold = as_float(name, "large_threshold", large_threshold)
        self.small_threshold = as_float(name, "small_threshold", small_threshold)
        if not self.small_threshold < self.large_threshold:
            raise MltraceValueError(f"{name}: small_threshold must be below large_threshold")
        self.epsilon = as_float(name, "epsilon", epsilon, 0)
        self._selection = TensorSelection(name, [], [], optional_collections=("weights",))
        self._steps = SavedSteps()
        self._last: dict[str, tuple[ModeKeys, int, np.ndarray]] = {}

    def _previous(self, tensor: Tensor, mode: ModeKeys, mode_step: int) -> np.ndarray | None:
        if self.num_steps is None:
            earlier = self._steps.before(tensor, mode, mode_step, 1)
            if not earlier:
                return None
            wanted = earlier[0]
        else:
            wanted = mode_step - self.num_steps
        cached = self._last.get(tensor.name)
        if cached is not None and cached[0] is mode and cached[1] == wanted:
            return cached[2]
        return value_at(tensor, wanted, mode)

    def invoke_at_step(self, step: int) -> bool:
        mode, mode_step = mode_of(self.base_trial, step)
        if mode in (ModeKeys.EVAL, ModeKeys.PREDICT):
            return False
        for tensor in self._selection.tensors(self.base_trial, self):
            current = value_at(tensor, step)
            if current is None:
                continue
            previous = self._previous(tensor, mode, mode_step)
            current = np.asarray(current, dtype=np.float64)
            self._last[tensor.name] = (mode, mode_step, current)
            if previous is None or np.shape(previous) != current.shape:
                continue
            previous = np.asarray(previous, dtype=np.float64)
            update = float(np.linalg.norm((current - previous).ravel()))
            ratio = update / (float(np.linalg.norm(previous.ravel())) + self.epsilon)
            if ratio > self.large_threshold or ratio < self.small_threshold:
                bound = (f"> large_threshold {self.large_threshold:g}"
                         if ratio > self.large_threshold
                         else f"< small_threshold {self.small_threshold:g}")
                self.last_message = (f"{tensor.name}: update/weight ratio {ratio:.3g} {bound} "
                                     f"at {self.step_label(mode_step, mode)}")
                return True
        return False
