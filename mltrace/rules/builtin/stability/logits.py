"""OutputLogitDrift: the output logits' log-partition function drifting away (what z-loss stops)."""

from __future__ import annotations

import math
from typing import Any

from mltrace.rules.builtin._params import as_float
from mltrace.rules.builtin.stability._signals import (
    SignalNames,
    StabilityRule,
    fmt,
    int_param,
    require_collection,
    where,
)
from mltrace.stability.signals import LOGITS
from mltrace.trials import Trial


class OutputLogitDrift(StabilityRule):
    """Fires when a model's output logits drift: the mean log-partition function
    (``logits/<model>/log_z_mean``, log Z = logsumexp of a position's logits) moved more than
    ``max_drift`` nats away from its median over the trailing ``window`` steps, or the largest
    log Z (``log_z_max``) is beyond +-``max_log_z``; or when log Z or the largest logit
    (``logits/<model>/max``) is not finite.

    Output-logit divergence (logits drifting far from log Z = 0, a softmax that saturates) is
    one of the two instabilities of Wortsman et al. 2023; it is what PaLM's z-loss
    (1e-4 x log^2 Z) keeps in check.

    Args:
        base_trial: the trial to watch.
        max_drift: default 5.0 nats, > 0 (a factor of about 150 in the partition function).
        max_log_z: default 50.0, > 0 (a healthy model's log Z stays near log of the vocabulary
            size, about 11 for 50,000 tokens, at initialisation and shrinks with z-loss).
        window: default 100, >= 2.
        min_history: default 10, in [2, window]: finite values the window needs before the drift
            test judges (a warm-up). The max_log_z test and non-finite values fire from the
            first step.
    """

    def __init__(self, base_trial: Trial, max_drift: Any = 5.0, max_log_z: Any = 50.0,
                 window: Any = 100, min_history: Any = 10, action_str: Any = None) -> None:
        name = type(self).__name__
        size = int_param(name, "window", window, 2)
        super().__init__(base_trial, action_str, size + 1)
        require_collection(name, base_trial, LOGITS, "output-logit statistics")
        self.max_drift = as_float(name, "max_drift", max_drift, 0, inclusive=False)
        self.max_log_z = as_float(name, "max_log_z", max_log_z, 0, inclusive=False)
        self.set_window(size, min_history)
        self._means = SignalNames(LOGITS, "log_z_mean")
        self._maxima = SignalNames(LOGITS, "log_z_max")
        self._largest = SignalNames(LOGITS, "max")

    def invoke_at_step(self, step: int) -> bool:
        trial = self.base_trial
        means, maxima = set(self._means.names(trial)), set(self._maxima.names(trial))
        largest = self._largest.names(trial)
        findings = []
        for name in self.signal_tensors(sorted([*means, *maxima, *largest]), step):
            value = self._history.value(name, step)
            if value is None or value.size != 1:
                continue
            x = float(value[0])
            label = where(name)
            if not math.isfinite(x):
                findings.append(f"{label}: the value is {x}")
            elif name in maxima and abs(x) > self.max_log_z:
                findings.append(f"{label}: the largest log Z {fmt(x)} is beyond +-max_log_z "
                                f"{self.max_log_z:g}")
            elif name in means:
                _, median = self.trailing(name, step, value)
                med = float(median[0])
                if not math.isnan(med) and abs(x - med) > self.max_drift:
                    findings.append(
                        f"{label}: the mean log Z {fmt(x)} is {fmt(abs(x - med))} nats from its "
                        f"median {fmt(med)} over the last {self.window} steps (max_drift "
                        f"{self.max_drift:g})")
        return self.report_findings(step, findings)


__all__ = ["OutputLogitDrift"]
