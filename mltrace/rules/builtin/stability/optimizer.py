"""UpdateRatio, AdamEpsilonDominance, AdamStaleSecondMoment: what the optimizer did to each
parameter, and Adam's state after it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mltrace.exceptions import MltraceValueError
from mltrace.rules.builtin._params import as_bool, as_float
from mltrace.rules.builtin.stability._signals import (
    SignalNames,
    StabilityRule,
    fmt,
    int_param,
    require_collection,
    where,
)
from mltrace.stability.signals import OPTIMIZER_STATE, UPDATES, parse_signal, signal_name
from mltrace.trials import Trial


class UpdateRatio(StabilityRule):
    """Fires when the update the optimizer applied to a parameter is too large for it: the ratio
    ``||update|| / ||weight before the update||`` (``updates/<param>/ratio``) is above
    ``max_ratio``, or above ``jump_factor`` times its median over the trailing ``window`` steps;
    or the ratio is not finite because the update is not.

    Args:
        base_trial: the trial to watch.
        max_ratio: default 1.0, > 0: an update as large as the weight itself. The ~1e-3 rule
            of thumb for a healthy update holds for weight matrices, not for small biases and
            normalisation shifts, whose ratios reach 0.19 on SpikeBench's healthy runs just
            after the warm-up; a hundredfold learning rate moved every matrix by 20x its median
            ratio, which the jump test catches.
        jump_factor: default 20.0, > 1.
        window: default 50, >= 2.
        min_history: default 50, in [2, window]: finite ratios the window needs before either
            test judges. The warm-up is long on purpose: a parameter initialised at zero (biases,
            normalisation shifts) has ratios near 1 over its first updates, which is healthy.

    A ratio that is infinite or NaN while the update's L2 norm (``updates/<param>/l2``) is
    finite comes from a weight that was exactly zero and is skipped; a non-finite update fires
    from the first step.
    """

    def __init__(self, base_trial: Trial, max_ratio: Any = 1.0, jump_factor: Any = 20.0,
                 window: Any = 50, min_history: Any = 50, action_str: Any = None) -> None:
        name = type(self).__name__
        size = int_param(name, "window", window, 2)
        super().__init__(base_trial, action_str, size + 1)
        require_collection(name, base_trial, UPDATES, "update-to-weight ratios")
        self.max_ratio = as_float(name, "max_ratio", max_ratio, 0, inclusive=False)
        self.jump_factor = as_float(name, "jump_factor", jump_factor, 1, inclusive=False)
        self.set_window(size, min_history)
        self._names = SignalNames(UPDATES, "ratio")

    def _update_is_finite(self, name: str, step: int) -> bool:
        signal = parse_signal(name)
        if signal is None:
            return False
        l2 = self._history.scalar(signal_name(UPDATES, signal.subject, "l2"), step)
        return l2 is not None and math.isfinite(l2)

    def invoke_at_step(self, step: int) -> bool:
        findings = []
        for name in self.signal_tensors(self._names.names(self.base_trial), step):
            value = self._history.value(name, step)
            if value is None or value.size != 1:
                continue
            ratio, label = float(value[0]), where(name)
            if not math.isfinite(ratio):
                if not self._update_is_finite(name, step):
                    findings.append(f"{label}: the update ratio is {ratio} (the update is not "
                                    "finite)")
                continue
            _, median = self.trailing(name, step, value)
            med = float(median[0])
            if math.isnan(med):
                continue
            if ratio > self.max_ratio:
                findings.append(f"{label}: the update ratio {fmt(ratio)} is above max_ratio "
                                f"{self.max_ratio:g}")
            elif med > 0 and ratio > self.jump_factor * med:
                findings.append(
                    f"{label}: the update ratio {fmt(ratio)} is above jump_factor "
                    f"{self.jump_factor:g} x its median {fmt(med)} over the last {self.window} "
                    "steps")
        return self.report_findings(step, findings)


class AdamEpsilonDominance(StabilityRule):
    """Fires when Adam's epsilon dominates a parameter's update: the share of its elements whose
    sqrt(v_hat) is within 10x of epsilon (``optimizer_state/<param>/eps_fraction``) is above
    ``max_fraction`` on ``patience`` consecutive saved steps. There the update is no longer
    m / sqrt(v) but about m / epsilon: silently smaller, and no longer normalised. Gradients
    shrink towards epsilon as models grow (Wortsman et al. 2023); OLMo 2 lowered AdamW's epsilon
    from 1e-5 to 1e-8 for this reason.

    Args:
        base_trial: the trial to watch.
        max_fraction: default 0.5, in [0, 1).
        patience: default 3, >= 1: consecutive saved steps above max_fraction (the current
            one and the ones before it); it is also the warm-up.

    Elements with v = 0 (never given a gradient) are not counted in the share.
    """

    def __init__(self, base_trial: Trial, max_fraction: Any = 0.5, patience: Any = 3,
                 action_str: Any = None) -> None:
        name = type(self).__name__
        size = int_param(name, "patience", patience, 1)
        super().__init__(base_trial, action_str, size + 1)
        require_collection(name, base_trial, OPTIMIZER_STATE, "Adam's state statistics")
        self.max_fraction = as_float(name, "max_fraction", max_fraction, 0, 1)
        if self.max_fraction == 1:
            raise MltraceValueError(f"{name}: parameter max_fraction={self.max_fraction!r} must "
                                    "lie in [0, 1)")
        self.patience = size
        self._names = SignalNames(OPTIMIZER_STATE, "eps_fraction")

    def invoke_at_step(self, step: int) -> bool:
        findings = []
        for name in self.signal_tensors(self._names.names(self.base_trial), step):
            fraction = self._history.scalar(name, step)
            if fraction is None or not fraction > self.max_fraction:
                continue
            earlier = self._history.window(name, step, self.patience - 1)
            if self.patience > 1 and (earlier.shape[0] < self.patience - 1
                                      or not bool(np.all(earlier > self.max_fraction))):
                continue
            findings.append(
                f"{where(name)}: {fraction:.1%} of the elements have sqrt(v_hat) within 10x of "
                f"epsilon, above max_fraction {self.max_fraction:g} on {self.patience} "
                "consecutive saved steps")
        return self.report_findings(step, findings)


class AdamStaleSecondMoment(StabilityRule):
    """Fires when Adam's second moment had gone stale and a gradient then outgrew it: the ratio
    mean(g^2) / mean(v_hat) of a parameter (``optimizer_state/<param>/grad_sq_ratio``) had a
    median below ``stale_ratio`` over the trailing ``window`` steps (squared gradients far below
    what v remembers) and is now above ``spike_ratio``. Bai et al. 2026 ("Adaptive
    preconditioners trigger loss spikes in Adam") found this pattern before loss spikes: v
    decays slowly (beta2) while gradients shrink, so a sudden gradient is divided by a stale,
    too small sqrt(v) and the step is far too large. It also fires when the ratio has just gone
    stale: below stale_ratio on ``patience`` steps running after a window whose median was at
    or above it (beta2 raised, or the gradients collapsed: the state no longer follows them).
    With ``warn_stale``, a ratio that stayed below stale_ratio for ``window`` steps fires too.

    Args:
        base_trial: the trial to watch.
        stale_ratio: default 0.01, > 0.
        spike_ratio: default 10.0, above stale_ratio.
        window: default 50, >= 2.
        min_history: default 10, in [2, window]: finite values the window needs before judging
            (a warm-up).
        patience: default 3, >= 1: steps running below stale_ratio that make a fresh staleness.
        warn_stale: default False.

    A healthy Adam keeps the ratio near 1 (g^2 and v_hat estimate the same second moment; on
    SpikeBench's healthy runs it stays above 0.1 after the first 60 steps); beta2 raised from
    0.95 to 0.99999 drops it below 0.003 at once. A NaN ratio (a parameter without a gradient at
    that step) is skipped.
    """

    def __init__(self, base_trial: Trial, stale_ratio: Any = 0.01, spike_ratio: Any = 10.0,
                 window: Any = 50, min_history: Any = 10, patience: Any = 3, warn_stale: Any = False,
                 action_str: Any = None) -> None:
        name = type(self).__name__
        size = int_param(name, "window", window, 2)
        super().__init__(base_trial, action_str, size + 1)
        require_collection(name, base_trial, OPTIMIZER_STATE, "Adam's state statistics")
        self.stale_ratio = as_float(name, "stale_ratio", stale_ratio, 0, inclusive=False)
        self.spike_ratio = as_float(name, "spike_ratio", spike_ratio, self.stale_ratio,
                                       inclusive=False)
        self.set_window(size, min_history)
        self.patience = int_param(name, "patience", patience, 1)
        self.warn_stale = as_bool(name, "warn_stale", warn_stale)
        self._names = SignalNames(OPTIMIZER_STATE, "grad_sq_ratio")

    def invoke_at_step(self, step: int) -> bool:
        findings = []
        for name in self.signal_tensors(self._names.names(self.base_trial), step):
            value = self._history.value(name, step)
            if value is None or value.size != 1 or not math.isfinite(float(value[0])):
                continue
            ratio, label = float(value[0]), where(name)
            window, median = self.trailing(name, step, value)
            med = float(median[0])
            if math.isnan(med):
                continue
            if med < self.stale_ratio and ratio > self.spike_ratio:
                findings.append(
                    f"{label}: mean(g^2)/mean(v_hat) is {fmt(ratio)}, above spike_ratio "
                    f"{self.spike_ratio:g}, after a median of {fmt(med)} over the last "
                    f"{self.window} steps, below stale_ratio {self.stale_ratio:g}: v was stale")
            elif ratio < self.stale_ratio and self._fresh_staleness(window, med):
                findings.append(
                    f"{label}: mean(g^2)/mean(v_hat) is {fmt(ratio)}, below stale_ratio "
                    f"{self.stale_ratio:g} on {self.patience} steps running after a median of "
                    f"{fmt(med)} over the last {self.window} steps: v went stale")
            elif self.warn_stale and ratio < self.stale_ratio:
                recent = window[-(self.window - 1):] if self.window > 1 else window[:0]
                if recent.shape[0] == self.window - 1 and bool(np.all(recent < self.stale_ratio)):
                    findings.append(
                        f"{label}: mean(g^2)/mean(v_hat) stayed below stale_ratio "
                        f"{self.stale_ratio:g} for {self.window} steps (now {fmt(ratio)}): v is "
                        "stale")
        return self.report_findings(step, findings)

    def _fresh_staleness(self, window: np.ndarray, median: float) -> bool:
        """The ``patience - 1`` values before this one were below stale_ratio too, and the
        window's median (which they are part of) was still at or above it: fired once, when the
        ratio has just crossed (``patience`` steps in), not at every stale step after."""
        before = window[-(self.patience - 1):, 0] if self.patience > 1 else window[:0, 0]
        if before.shape[0] != self.patience - 1 or not bool(np.all(before < self.stale_ratio)):
            return False
        if window.shape[0] >= self.patience and float(window[-self.patience, 0]) < self.stale_ratio:
            return False  # stale for longer than patience steps: reported already
        return median >= self.stale_ratio
