"""UnchangedTensor: a tensor that stays the same over its last few saved steps."""

from __future__ import annotations

from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.rules.builtin._params import as_bool, as_float, as_int, as_mode
from mltrace.rules.builtin._reading import (
    SavedSteps,
    TensorSelection,
    has_value,
    mode_of,
    selection_from,
    value_at,
)
from mltrace.rules.rule import Rule
from mltrace.trials import Trial
from mltrace.trials.tensor import Tensor

#: Collections whose tensors cannot change outside training (skipped at EVAL/PREDICT steps).
PARAMETER_COLLECTIONS = ("weights", "biases")


class UnchangedTensor(Rule):
    """Fires when a tensor's values at its last ``num_steps`` saved steps (the current one
    included, not necessarily consecutive) are all ``numpy.allclose`` to each other.

    Args:
        base_trial: the trial to watch.
        collection_names: collections to inspect.
        tensor_regex: regexes of tensor names; one of the two is required (union when both).
        num_steps: default 3 (at least 2).
        rtol: default 1e-5, atol: default 1e-8, equal_nan: default False: passed to
            ``numpy.allclose``.
        mode: mltrace's addition, default None: each step is compared with earlier steps of its
            own mode; a mode name (train, eval, ...) checks that mode's steps only.

    Choices where smdebug is silent: each earlier value is compared with the current one (so a
    slow drift within tolerance over the window still counts as unchanged only if every value
    is close to the latest); different shapes count as changed; tensors of the ``weights`` and
    ``biases`` collections are not checked at EVAL/PREDICT steps, where they never change. The
    last ``num_steps`` values of each tensor are kept, so each value is read once.
    """

    def __init__(self, base_trial: Trial, collection_names: Any = None, tensor_regex: Any = None,
                 num_steps: Any = 3, rtol: Any = 1e-5, atol: Any = 1e-8, equal_nan: Any = False,
                 mode: Any = None, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.collection_names, self.tensor_regex, self._selection = selection_from(
            name, base_trial, collection_names, tensor_regex, required=True)
        self.num_steps = as_int(name, "num_steps", num_steps)
        if self.num_steps < 2:
            raise MltraceValueError(f"{name}: num_steps={num_steps!r} must be at least 2")
        self.rtol = as_float(name, "rtol", rtol, 0)
        self.atol = as_float(name, "atol", atol, 0)
        self.equal_nan = as_bool(name, "equal_nan", equal_nan)
        self._mode = as_mode(name, "mode", mode)
        self.mode = None if self._mode is None else self._mode.name
        self._parameters = TensorSelection(name, [], [], optional_collections=PARAMETER_COLLECTIONS)
        self._steps = SavedSteps()
        self._values: dict[tuple[str, ModeKeys], dict[int, np.ndarray]] = {}

    def _value(self, tensor: Tensor, mode: ModeKeys, mode_step: int) -> np.ndarray | None:
        cache = self._values.setdefault((tensor.name, mode), {})
        if mode_step not in cache:
            value = value_at(tensor, mode_step, mode)
            if value is None:
                return None
            cache[mode_step] = np.asarray(value)
        return cache[mode_step]

    def _same(self, a: np.ndarray, b: np.ndarray) -> bool:
        if a.shape != b.shape:
            return False
        if a.dtype.kind in "biufc" and b.dtype.kind in "biufc":
            return bool(np.allclose(a, b, rtol=self.rtol, atol=self.atol, equal_nan=self.equal_nan))
        return bool(np.array_equal(a, b))

    def invoke_at_step(self, step: int) -> bool:
        mode, mode_step = mode_of(self.base_trial, step)
        if self._mode is not None and mode is not self._mode and self._mode is not ModeKeys.GLOBAL:
            return False
        if self._mode is ModeKeys.GLOBAL:
            mode, mode_step = ModeKeys.GLOBAL, step
        frozen = (set(self._parameters.names(self.base_trial))
                  if mode in (ModeKeys.EVAL, ModeKeys.PREDICT) else set())
        for tensor in self._selection.tensors(self.base_trial, self):
            if tensor.name in frozen or not has_value(tensor, step):
                continue
            earlier = self._steps.before(tensor, mode, mode_step, self.num_steps - 1)
            if len(earlier) < self.num_steps - 1:
                continue
            window = [*earlier, mode_step]
            cache = self._values.setdefault((tensor.name, mode), {})
            for old in [s for s in cache if s < window[0]]:
                del cache[old]
            current = self._value(tensor, mode, mode_step)
            if current is None:
                continue
            values = [self._value(tensor, mode, s) for s in earlier]
            if any(v is None for v in values):
                continue
            if all(self._same(v, current) for v in values):  # type: ignore[arg-type]
                self.last_message = (f"{tensor.name} unchanged over {mode.name} steps "
                                     f"{', '.join(map(str, window))} (rtol={self.rtol:g}, "
                                     f"atol={self.atol:g})")
                return True
        return False
