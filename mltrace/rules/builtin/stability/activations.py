"""MassiveActivation and LinearOutputGrowth: module outputs with outliers, or growing without end."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.rules.builtin._params import as_float
from mltrace.rules.builtin.stability._signals import (
    SignalNames,
    StabilityRule,
    check_min_history,
    fmt,
    int_param,
    require_collection,
    where,
)
from mltrace.stability.signals import ACTIVATIONS, parse_signal, signal_name
from mltrace.stability.windows import rising_fraction, stack
from mltrace.trials import Trial


class MassiveActivation(StabilityRule):
    """Fires when a module's output holds a massive activation: its largest magnitude
    (``activations/<module>/abs_max``) is above ``min_abs`` and above ``ratio`` times the median
    magnitude (``max_over_median``), the criterion of Sun et al. 2024, "Massive activations in
    large language models"; or when abs_max is not finite.

    Args:
        base_trial: the trial to watch.
        min_abs: default 100.0, > 0.
        ratio: default 1000.0, > 1.

    Where ``max_over_median`` was not saved, it is computed from ``abs_max`` and
    ``abs_median``. The test needs no history, so it applies from the first step: a trained
    model that has massive activations (many large language models do, by design of their
    training) fires at every step; restrict the rule to the modules that matter, or raise
    ``ratio``, to watch for new ones.
    """

    def __init__(self, base_trial: Trial, min_abs: Any = 100.0, ratio: Any = 1000.0,
                 action_str: Any = None) -> None:
        super().__init__(base_trial, action_str, 2)
        name = self.rule_name
        require_collection(name, base_trial, ACTIVATIONS, "module-output outlier statistics")
        self.min_abs = as_float(name, "min_abs", min_abs, 0, inclusive=False)
        self.ratio = as_float(name, "ratio", ratio, 1, inclusive=False)
        self._names = SignalNames(ACTIVATIONS, "abs_max")

    def _ratio(self, subject: str, step: int, abs_max: float) -> float | None:
        ratio = self._history.scalar(signal_name(ACTIVATIONS, subject, "max_over_median"), step)
        if ratio is not None:
            return ratio
        median = self._history.scalar(signal_name(ACTIVATIONS, subject, "abs_median"), step)
        if median is None:
            return None
        return abs_max / median if median > 0 else math.inf

    def invoke_at_step(self, step: int) -> bool:
        findings = []
        for name in self.signal_tensors(self._names.names(self.base_trial), step):
            abs_max = self._history.scalar(name, step)
            signal = parse_signal(name)
            if abs_max is None or signal is None:
                continue
            label = where(name)
            if not math.isfinite(abs_max):
                findings.append(f"{label}: the largest |activation| is {abs_max}")
                continue
            if abs_max <= self.min_abs:
                continue
            ratio = self._ratio(signal.subject, step, abs_max)
            if ratio is not None and ratio > self.ratio:
                findings.append(
                    f"{label}: the largest |activation| {fmt(abs_max)} is above min_abs "
                    f"{self.min_abs:g} and {fmt(ratio)} x the median |activation| (ratio "
                    f"{self.ratio:g})")
        return self.report_findings(step, findings)


class LinearOutputGrowth(StabilityRule):
    """Fires when the L2 norm of a module's output (``activations/<module>/l2``, saved for
    ``nn.Linear`` modules) jumps above ``jump_factor`` times its median over the trailing
    ``window`` steps, or grows steadily: it rose from one step to the next in at least
    ``growth_fraction`` of the last ``window`` steps and by at least ``growth_factor`` overall.
    Rybakov et al. 2024 ("Methods of improving LLM training stability") saw the outputs of the
    linear layers (QKV, projection, FC2 most) grow step after step before training diverged.

    Args:
        base_trial: the trial to watch.
        jump_factor: default 10.0, > 1.
        window: default 100, >= 2.
        growth_fraction: default 0.9, in (0, 1].
        growth_factor: default 3.0, > 1: the growth over the window, current value over the
            window's first.
        min_history: default 100, in [2, window]: finite values the window needs before the
            jump test judges (a warm-up); the growth test needs a full window. A non-finite norm
            fires from the first step. Early in training every output norm grows steadily (on
            SpikeBench's healthy runs 6x over the 50 warm-up steps): a window of 50 fired there
            on every healthy run, one of 100 never.
    """

    def __init__(self, base_trial: Trial, jump_factor: Any = 10.0, window: Any = 100,
                 growth_fraction: Any = 0.9, growth_factor: Any = 3.0, min_history: Any = 100,
                 action_str: Any = None) -> None:
        name = type(self).__name__
        size = int_param(name, "window", window, 2)
        super().__init__(base_trial, action_str, size + 1)
        require_collection(name, base_trial, ACTIVATIONS, "module-output L2 norms")
        self.jump_factor = as_float(name, "jump_factor", jump_factor, 1, inclusive=False)
        self.window = size
        self.growth_fraction = as_float(name, "growth_fraction", growth_fraction, 0, 1)
        if self.growth_fraction == 0:
            raise MltraceValueError(f"{name}: parameter growth_fraction={self.growth_fraction!r} "
                                    "must lie in (0, 1]")
        self.growth_factor = as_float(name, "growth_factor", growth_factor, 1, inclusive=False)
        self.min_history = int_param(name, "min_history", min_history, 2)
        check_min_history(name, self.min_history, self.window)
        self._names = SignalNames(ACTIVATIONS, "l2")

    def invoke_at_step(self, step: int) -> bool:
        findings = []
        for name in self.signal_tensors(self._names.names(self.base_trial), step):
            value = self._history.value(name, step)
            if value is None or value.size != 1:
                continue
            norm, label = float(value[0]), where(name)
            if not math.isfinite(norm):
                findings.append(f"{label}: the output's L2 norm is {norm}")
                continue
            window, median = self.trailing(name, step, value)
            med = float(median[0])
            if med > 0 and norm > self.jump_factor * med:
                findings.append(
                    f"{label}: the output's L2 norm {fmt(norm)} is above jump_factor "
                    f"{self.jump_factor:g} x its median {fmt(med)} over the last {self.window} "
                    "steps")
                continue
            if window.shape[0] < self.window or not np.isfinite(window).all():
                continue
            first = float(window[0, 0])
            rising = float(rising_fraction(stack([*window, value]))[0])
            if first > 0 and rising >= self.growth_fraction and norm >= self.growth_factor * first:
                findings.append(
                    f"{label}: the output's L2 norm rose in {rising:.0%} of the last "
                    f"{self.window} steps (growth_fraction {self.growth_fraction:g}), from "
                    f"{fmt(first)} to {fmt(norm)}: {fmt(norm / first)}x (growth_factor "
                    f"{self.growth_factor:g})")
        return self.report_findings(step, findings)


__all__ = ["LinearOutputGrowth", "MassiveActivation"]
