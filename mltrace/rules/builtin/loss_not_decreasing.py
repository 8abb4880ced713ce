"""LossNotDecreasing: a loss that is not lower than it was ``num_steps`` steps before."""

from __future__ import annotations

from typing import Any

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.rules.builtin._params import (
    as_bool,
    as_float,
    as_int,
    as_mode,
)
from mltrace.rules.builtin._reading import (
    LOSS_REGEX,
    SavedSteps,
    TensorSelection,
    has_value,
    mode_of,
    scalar_at,
    selection_from,
)
from mltrace.rules.rule import Rule
from mltrace.trials import Trial
from mltrace.trials.tensor import Tensor

#: Without a ``mode`` parameter, the first of these in which a loss was saved is used.
MODE_PREFERENCE = (ModeKeys.EVAL, ModeKeys.TRAIN, ModeKeys.GLOBAL)


def loss_selection(rule: str, trial: Trial, collection_names: Any, tensor_regex: Any,
                   use_losses_collection: bool) -> tuple[list[str], list[str], TensorSelection]:
    """Loss tensors: the ``losses`` collection (when wanted and present), the given collections
    and regexes; when none of these is configured or they select nothing, names matching
    ``loss`` (any case), as smdebug's rules found ``loss_0``-style tensors. Returns the parsed
    collection names and regexes with the selection (see selection_from)."""
    return selection_from(rule, trial, collection_names, tensor_regex,
                          optional_collections=("losses",) if use_losses_collection else (),
                          fallback_regex=[LOSS_REGEX])


class LossNotDecreasing(Rule):
    """Fires when a loss is not lower than its value ``num_steps`` (or more) steps before by at
    least ``diff_percent`` percent.

    Evaluated every ``num_steps`` or more steps: at a saved step ``s`` (at least ``num_steps``
    after the previous check), the loss at ``s`` is compared with the loss at the newest saved
    step ``<= s - num_steps``. With losses saved every 3 steps and num_steps 10, step 21 is
    compared with step 9 and the next check is at 33. A step with no saved step far enough back
    is not a check.

    Args:
        base_trial: the trial to watch.
        collection_names: collections of loss tensors.
        tensor_regex: regexes of loss tensor names.
        use_losses_collection: default True: also the ``losses`` collection when present.
            With nothing selected, tensors whose name contains "loss" (any case).
        num_steps: default 10.
        diff_percent: default 0.0 (0 <= x < 100): fires when
            ``previous - current < |previous| * diff_percent / 100``, or when the loss did not
            go down at all; so 0 means "fires unless the loss decreased".
        mode: train, eval, predict or global; default None: EVAL if the loss was saved in EVAL
            steps, else TRAIN, else GLOBAL. Steps and ``num_steps`` count in that mode's steps.

    Only scalar tensors are checked. Each loss is tracked separately. Note: an old smdebug unit
    test (pre-2019, test_min_diff) implied that diff_percent=20 lets a flat loss pass; mltrace
    follows the documented meaning ("the minimum percentage by which the loss should be lower").
    """

    def __init__(self, base_trial: Trial, collection_names: Any = None, tensor_regex: Any = None,
                 use_losses_collection: Any = True, num_steps: Any = 10, diff_percent: Any = 0.0,
                 mode: Any = None, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.use_losses_collection = as_bool(name, "use_losses_collection", use_losses_collection)
        self.collection_names, self.tensor_regex, self._selection = loss_selection(
            name, base_trial, collection_names, tensor_regex, self.use_losses_collection)
        self.num_steps = as_int(name, "num_steps", num_steps)
        if self.num_steps < 1:
            raise MltraceValueError(f"{name}: num_steps={num_steps!r} must be a positive integer")
        self.diff_percent = as_float(name, "diff_percent", diff_percent, 0)
        if self.diff_percent >= 100:
            raise MltraceValueError(f"{name}: diff_percent={diff_percent!r} must be below 100")
        self._mode = as_mode(name, "mode", mode)
        self.mode = None if self._mode is None else self._mode.name
        self._steps = SavedSteps()
        self._chosen: dict[str, ModeKeys] = {}
        self._last_check: dict[tuple[str, ModeKeys], int] = {}
        self._losses: dict[tuple[str, ModeKeys], dict[int, float]] = {}

    def _mode_for(self, tensor: Tensor, step_mode: ModeKeys) -> ModeKeys:
        if self._mode is not None:
            return self._mode
        chosen = self._chosen.get(tensor.name)
        if chosen is None or (step_mode in MODE_PREFERENCE
                              and MODE_PREFERENCE.index(step_mode) < MODE_PREFERENCE.index(chosen)):
            # Decided once, revised only when a preferred mode shows up in a live trial.
            chosen = next((m for m in MODE_PREFERENCE if self._steps.steps(tensor, m)),
                          ModeKeys.GLOBAL)
            self._chosen[tensor.name] = chosen
        return chosen

    def _loss(self, tensor: Tensor, mode: ModeKeys, mode_step: int) -> float | None:
        cache = self._losses.setdefault((tensor.name, mode), {})
        if mode_step not in cache:
            value = scalar_at(tensor, mode_step, mode)
            if value is None:
                return None
            cache[mode_step] = value
        return cache[mode_step]

    def invoke_at_step(self, step: int) -> bool:
        step_mode, step_mode_step = mode_of(self.base_trial, step)
        fired = None
        for tensor in self._selection.tensors(self.base_trial, self):
            if not has_value(tensor, step):
                continue
            mode = self._mode_for(tensor, step_mode)
            if mode is ModeKeys.GLOBAL:
                current_step = step
            elif mode is step_mode:
                current_step = step_mode_step
            else:
                continue
            key = (tensor.name, mode)
            last = self._last_check.get(key)
            if last is not None and current_step < last + self.num_steps:
                continue
            previous_step = self._steps.at_or_before(tensor, mode, current_step - self.num_steps)
            if previous_step is None:
                continue
            current = self._loss(tensor, mode, current_step)
            previous = self._loss(tensor, mode, previous_step)
            if current is None or previous is None:
                continue
            self._last_check[key] = current_step
            cache = self._losses[key]
            for old in [s for s in cache if s < previous_step]:
                del cache[old]
            decrease = previous - current
            required = abs(previous) * self.diff_percent / 100
            if fired is None and (decrease <= 0 or decrease < required):
                how = ("not decreasing" if decrease <= 0 else
                       f"decreased by {100 * decrease / abs(previous):.3g}% "
                       f"< diff_percent {self.diff_percent:g}%")
                fired = (f"{tensor.name} ({mode.name}) is {current:.6g} at "
                         f"{self.step_label(current_step, mode)}, {previous:.6g} at "
                         f"{self.step_label(previous_step, mode)}: {how}")
        if fired is not None:
            self.last_message = fired
            return True
        return False
