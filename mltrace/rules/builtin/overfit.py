"""Overfit and Overtraining: training and validation losses that part ways or stop improving."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.rules.builtin._params import as_float, as_int, as_regex_list
from mltrace.rules.builtin._reading import LOSS_REGEX, TensorSelection, mode_of, scalar_at
from mltrace.rules.rule import Rule
from mltrace.trials import Trial


@dataclass
class _Phases:
    """Running means of one loss over the current training phase and evaluation phase."""

    last_mode: ModeKeys | None = None
    train_sum: float = 0.0
    train_n: int = 0
    val_sum: float = 0.0
    val_n: int = 0
    over: int = 0


class Overfit(Rule):
    """Fires when the validation loss exceeds the training loss by more than ``ratio_threshold``
    (relatively) at ``patience`` consecutive EVAL steps:
    ``(mean validation loss - mean training loss) / |mean training loss| > ratio_threshold``.

    Args:
        base_trial: the trial to watch (saved with TRAIN and EVAL modes).
        tensor_regex: regexes of loss tensors; default None: the ``losses`` collection, else
            names containing "loss" (any case). Each loss is compared with itself across modes.
        start_step: default 0: global steps before it are ignored.
        patience: default 1 (EVAL steps).
        ratio_threshold: default 0.1.

    Choices where smdebug is silent: the training mean is over the latest training phase (the
    TRAIN steps since the previous evaluation); the validation mean is a running mean over the
    current evaluation phase (consecutive EVAL steps), checked at each EVAL step, so one noisy
    batch weighs less as the phase goes on. Trials without both modes never fire.
    """

    def __init__(self, base_trial: Trial, tensor_regex: Any = None, start_step: Any = 0,
                 patience: Any = 1, ratio_threshold: Any = 0.1, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.tensor_regex = as_regex_list(name, "tensor_regex", tensor_regex)
        self.start_step = as_int(name, "start_step", start_step)
        self.patience = as_int(name, "patience", patience)
        if self.patience < 1:
            raise MltraceValueError(f"{name}: patience={patience!r} must be a positive integer")
        self.ratio_threshold = as_float(name, "ratio_threshold", ratio_threshold)
        if self.tensor_regex:
            self._selection = TensorSelection(name, [], self.tensor_regex)
        else:
            self._selection = TensorSelection(name, [], [], optional_collections=("losses",),
                                              fallback_regex=[LOSS_REGEX])
        self._phases: dict[str, _Phases] = {}

    def invoke_at_step(self, step: int) -> bool:
        if step < self.start_step:
            return False
        mode, mode_step = mode_of(self.base_trial, step)
        if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL):
            return False
        message = None
        for tensor in self._selection.tensors(self.base_trial, self):
            loss = scalar_at(tensor, step)
            if loss is None or math.isnan(loss):
                continue
            p = self._phases.setdefault(tensor.name, _Phases())
            if mode is ModeKeys.TRAIN:
                if p.last_mode is not ModeKeys.TRAIN:
                    p.train_sum, p.train_n = 0.0, 0
                p.train_sum, p.train_n, p.last_mode = p.train_sum + loss, p.train_n + 1, mode
                continue
            if p.last_mode is not ModeKeys.EVAL:
                p.val_sum, p.val_n = 0.0, 0
            p.val_sum, p.val_n, p.last_mode = p.val_sum + loss, p.val_n + 1, mode
            if p.train_n == 0:
                continue
            train, val = p.train_sum / p.train_n, p.val_sum / p.val_n
            if train == 0:
                continue
            ratio = (val - train) / abs(train)
            p.over = p.over + 1 if ratio > self.ratio_threshold else 0
            if message is None and p.over >= self.patience:
                message = (
                    f"{tensor.name}: validation loss {val:.6g} vs training loss {train:.6g} at "
                    f"{self.step_label(mode_step, ModeKeys.EVAL)}: ratio {ratio:.3g} > ratio_threshold "
                    f"{self.ratio_threshold:g} for {p.over} EVAL step(s)")
        if message:
            self.last_message = message
            return True
        return False


class Overtraining(Rule):
    """Fires when the training loss has not improved by at least ``delta`` for
    ``patience_train`` steps, or the validation loss for ``patience_validation`` steps.

    Args:
        base_trial: the trial to watch.
        patience_train: default 5 (TRAIN mode steps).
        patience_validation: default 10 (EVAL mode steps).
        delta: default 0.1: an improvement is a loss below the best so far by at least
            ``delta`` (absolute, like Keras' EarlyStopping ``min_delta``; 0.6 -> 0.5 counts as
            an improvement of 0.1 despite floating point).

    Choices where smdebug is silent: patience counts mode steps since the last improvement;
    steps of a trial saved without modes count as training; each loss tensor (the ``losses``
    collection, else names containing "loss") is tracked on its own, per mode.
    """

    def __init__(self, base_trial: Trial, patience_train: Any = 5, patience_validation: Any = 10,
                 delta: Any = 0.1, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str=action_str)
        name = self.rule_name
        self.patience_train = as_int(name, "patience_train", patience_train)
        self.patience_validation = as_int(name, "patience_validation", patience_validation)
        if self.patience_train < 1 or self.patience_validation < 1:
            raise MltraceValueError(
                f"{name}: patience_train and patience_validation must be positive integers")
        self.delta = as_float(name, "delta", delta, 0)
        self._selection = TensorSelection(name, [], [], optional_collections=("losses",),
                                          fallback_regex=[LOSS_REGEX])
        self._best: dict[tuple[str, ModeKeys], tuple[float, int]] = {}

    def invoke_at_step(self, step: int) -> bool:
        mode, mode_step = mode_of(self.base_trial, step)
        if mode is ModeKeys.PREDICT:
            return False
        patience = self.patience_validation if mode is ModeKeys.EVAL else self.patience_train
        which = "validation" if mode is ModeKeys.EVAL else "training"
        message = None
        for tensor in self._selection.tensors(self.base_trial, self):
            loss = scalar_at(tensor, step)
            if loss is None or math.isnan(loss):
                continue
            key = (tensor.name, mode)
            best = self._best.get(key)
            slack = 1e-12 * max(1.0, abs(best[0])) if best else 0.0  # 0.6 - 0.5 < 0.1 in floats
            if best is None or (loss < best[0] and best[0] - loss >= self.delta - slack):
                self._best[key] = (loss, mode_step)
            elif message is None and mode_step - best[1] >= patience:
                message = (
                    f"{which} loss {tensor.name} has not improved by {self.delta:g} on "
                    f"{best[0]:.6g} (at {self.step_label(best[1], mode)}) for {mode_step - best[1]} steps "
                    f"(patience {patience})")
        if message:
            self.last_message = message
            return True
        return False
