"""LossNotDecreasing: a loss that is not lower than it was ``num_steps`` steps before."""

from __future__ import annotations

from bisect import bisect_right
from statistics import median
from typing import Any

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.rules.builtin._params import (
    as_bool,
    as_float,
    as_int,
    as_mode,
    as_optional_int,
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
        noise_aware: default False (smdebug's behaviour: one loss against one loss). True
            compares medians instead: the median of the ``window`` losses saved up to ``s``
            with the median of the ``window`` losses saved up to the compared earlier step.
            A single noisy loss, ordinary in a healthy run whose losses jitter by a few percent
            from batch to batch, then moves neither median far, while a loss that has stopped
            going down still fires. A check needs ``window`` saved losses ending at the earlier
            step (the first checks come ``window`` steps later than without it).
        window: default None: ``num_steps``; the losses in each median with noise_aware
            (at least 1; ignored without noise_aware).

    Only scalar tensors are checked. Each loss is tracked separately. Note: an old smdebug unit
    test (pre-2019, test_min_diff) implied that diff_percent=20 lets a flat loss pass; mltrace
    follows the documented meaning ("the minimum percentage by which the loss should be lower").
    """

    def __init__(self, base_trial: Trial, collection_names: Any = None, tensor_regex: Any = None,
                 use_losses_collection: Any = True, num_steps: Any = 10, diff_percent: Any = 0.0,
                 mode: Any = None, noise_aware: Any = False, window: Any = None,
                 action_str: Any = None) -> None:
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
        self.noise_aware = as_bool(name, "noise_aware", noise_aware)
        given_window = as_optional_int(name, "window", window)
        self.window = self.num_steps if given_window is None else given_window
        if self.window < 1:
            raise MltraceValueError(f"{name}: parameter window={window!r} must lie in [1, inf]")
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

    def _median_loss(self, tensor: Tensor, mode: ModeKeys,
                     mode_step: int) -> tuple[float | None, int]:
        """The median of the ``window`` losses saved up to ``mode_step`` (None when fewer were
        saved or one cannot be read), and the first of their steps."""
        steps = self._steps.steps(tensor, mode)
        end = bisect_right(steps, mode_step)
        if end < self.window:
            return None, mode_step
        chosen = steps[end - self.window:end]
        losses = [self._loss(tensor, mode, s) for s in chosen]
        if any(v is None for v in losses):
            return None, chosen[0]
        return median(v for v in losses if v is not None), chosen[0]

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
            if self.noise_aware:
                current, _ = self._median_loss(tensor, mode, current_step)
                previous, oldest = self._median_loss(tensor, mode, previous_step)
            else:
                current = self._loss(tensor, mode, current_step)
                previous = self._loss(tensor, mode, previous_step)
                oldest = previous_step
            if current is None or previous is None:
                continue
            self._last_check[key] = current_step
            cache = self._losses[key]
            for old in [s for s in cache if s < oldest]:
                del cache[old]
            decrease = previous - current
            required = abs(previous) * self.diff_percent / 100
            if fired is None and (decrease <= 0 or decrease < required):
                how = ("not decreasing" if decrease <= 0 else
                       f"decreased by {100 * decrease / abs(previous):.3g}% "
                       f"< diff_percent {self.diff_percent:g}%")
                what = (f"the median of its last {self.window} values is " if self.noise_aware
                        else "is ")
                fired = (f"{tensor.name} ({mode.name}) {what}{current:.6g} at "
                         f"{self.step_label(current_step, mode)}, {previous:.6g} at "
                         f"{self.step_label(previous_step, mode)}: {how}")
        if fired is not None:
            self.last_message = fired
            return True
        return False
