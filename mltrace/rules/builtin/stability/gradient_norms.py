"""GradNormSpike: a gradient norm far above its exponential moving average (ZClip's test)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mltrace.rules.builtin._params import as_bool, as_float
from mltrace.rules.builtin.stability._signals import (
    Running,
    SignalNames,
    StabilityRule,
    fmt,
    grad_norm_names,
    int_param,
    require_collection,
    where,
)
from mltrace.stability.signals import GRAD_NORMS
from mltrace.stability.windows import EmaZScore
from mltrace.trials import Trial


class GradNormSpike(StabilityRule):
    """Fires when a gradient norm spikes: its z-score against an exponential moving mean and
    variance (ZClip) is above ``z_threshold`` and it is above ``min_ratio`` times that mean; or
    when it is not finite. Checked on each model's global norm (``grad_norm/<model>``) and, with
    ``per_layer``, on each parameter's (``grad_norm/<model>_<param>``; the finding names the
    parameter and its layer).

    ZClip clips at z > 2.5 (alpha 0.97): a clipping threshold is meant to act on ordinary steps,
    a few percent of them. As an alarm, which must stay silent on a healthy run, the defaults
    are higher: z > 6 (OLMo-core's spike test uses 6 sigma too) and a norm at least 4 times the
    EMA mean (20 times for one parameter's norm). The ratio matters where the norm has been very
    steady: its EMA deviation is then tiny and a harmless 20% rise would score a z of 6. The
    ratios come from SpikeBench's healthy runs: after the warm-up the model's norm reached 2.9x
    its EMA mean (z 6.5), and single parameters' norms, LayerNorm's most of all, up to 15.5x
    (z 18.6, a LayerNorm weight just after the learning-rate warm-up), while a poisoned batch
    took the model's norm to 20x and a parameter's to 67x.

    Args:
        base_trial: the trial to watch.
        z_threshold: default 6.0, > 0.
        min_ratio: default 4.0, >= 1: the model's norm must also be this many times the EMA mean.
        layer_min_ratio: default 20.0, >= 1: the same for one parameter's norm.
        alpha: default 0.97 (ZClip), in (0, 1): the EMA's weight of the past.
        per_layer: default True: also each parameter's norm; False: the global norms only.
        min_history: default 25 (ZClip's warm-up), >= 2: the first min_history finite norms
            of a series set the mean and variance, and nothing fires before (non-finite norms
            fire from the first step).

    As ZClip does, a spike is left out of the EMA (so that it does not inflate the variance
    the next one is judged by); every other finite norm updates it. Each series (a tensor in
    one mode) has its own EMA; the EMA is carried from step to step, and a rule invoked on an
    earlier step rebuilds it from the series' first step.
    """

    def __init__(self, base_trial: Trial, z_threshold: Any = 6.0, min_ratio: Any = 4.0,
                 alpha: Any = 0.97, per_layer: Any = True, min_history: Any = 25,
                 layer_min_ratio: Any = 20.0, action_str: Any = None) -> None:
        super().__init__(base_trial, action_str, 2)
        name = self.rule_name
        require_collection(name, base_trial, GRAD_NORMS, "gradient norms")
        self.z_threshold = as_float(name, "z_threshold", z_threshold, 0, inclusive=False)
        self.min_ratio = as_float(name, "min_ratio", min_ratio, 1)
        self.layer_min_ratio = as_float(name, "layer_min_ratio", layer_min_ratio, 1)
        self.alpha = as_float(name, "alpha", alpha, 0, 1, inclusive=False)
        self.per_layer = as_bool(name, "per_layer", per_layer)
        self.min_history = int_param(name, "min_history", min_history, 2)
        self._names = SignalNames(GRAD_NORMS, None)
        self._ema = Running(self._history, lambda: EmaZScore(self.alpha, self.min_history),
                            self._fold)
        self._model_wide: set[str] = set()

    def _ratio_for(self, name: str) -> float:
        return self.min_ratio if name in self._model_wide else self.layer_min_ratio

    def _is_spike(self, ema: EmaZScore, norm: float, ratio: float) -> bool:
        if not math.isfinite(norm):
            return True
        return ema.z(norm) > self.z_threshold and norm > ratio * ema.mean

    def _fold(self, ema: EmaZScore, name: str, step: int, value: np.ndarray) -> EmaZScore:
        norm = float(value[0]) if value.size == 1 else math.nan
        if not ema.ready or not self._is_spike(ema, norm, self._ratio_for(name)):
            ema.update(norm)
        return ema

    def invoke_at_step(self, step: int) -> bool:
        names, model_wide = grad_norm_names(self.base_trial, self._names)
        self._model_wide = set(model_wide)
        if not self.per_layer:
            names = [n for n in names if n in model_wide]
        names = sorted(names, key=lambda n: (n not in model_wide, n))
        findings = []
        for name in self.signal_tensors(names, step):
            norm = self._history.scalar(name, step)
            if norm is None:
                continue
            label = where(name, model_wide=name in model_wide)
            if not math.isfinite(norm):
                findings.append(f"{label}: the gradient norm is {norm}")
                continue
            ema = self._ema.before(name, step)
            ratio = self._ratio_for(name)
            if not ema.ready or not self._is_spike(ema, norm, ratio):
                continue
            findings.append(
                f"{label}: the gradient norm {fmt(norm)} has z-score {fmt(ema.z(norm))} > "
                f"z_threshold {self.z_threshold:g} against its EMA (mean {fmt(ema.mean)}, std "
                f"{fmt(ema.std)}, alpha {self.alpha:g}) and is {fmt(_ratio(norm, ema.mean))}x the mean "
                f"({'min_ratio' if name in model_wide else 'layer_min_ratio'} {ratio:g})")
        return self.report_findings(step, findings)


def _ratio(x: float, reference: float) -> float:
    return x / reference if reference > 0 else math.inf


__all__ = ["GradNormSpike"]
