"""AttentionLogitGrowth and AttentionEntropyCollapse: attention heads on the way to one-hot."""

from __future__ import annotations

import math
from typing import Any

from mltrace.rules.builtin._params import as_float
from mltrace.rules.builtin.stability._signals import (
    SignalNames,
    StabilityRule,
    fmt,
    int_param,
    per_head,
    require_collection,
    where,
)
from mltrace.stability.signals import ATTENTION
from mltrace.trials import Trial

#: AttentionEntropyCollapse's absolute test needs the head's trailing median above this many
#: times min_entropy: a head that has always been near one-hot (a positional or "sink" head)
#: has not collapsed.
HEALTHY_ENTROPY_FACTOR = 4.0


class AttentionLogitGrowth(StabilityRule):
    """Fires when an attention head's largest pre-softmax logit (``attention/<module>/max_logit``,
    one value per head) is above ``max_logit`` (Kimi K2's QK-clip threshold tau = 100), or above
    ``growth_factor`` times its median over the trailing ``window`` steps: attention-logit growth,
    which drives attention towards one-hot and precedes divergence (Wortsman et al. 2023,
    "Small-scale proxies for large-scale Transformer training instabilities"; ViT-22B).

    Args:
        base_trial: the trial to watch.
        max_logit: default 100.0 (Kimi K2 / MuonClip), > 0.
        growth_factor: default 4.0, > 1.
        window: default 100, >= 2: steps the median runs over.
        min_history: default 50, in [2, window]: finite values the window needs before the
            growth test judges a head (a warm-up). The max_logit test and a NaN or +inf logit
            fire from the first step.
        min_logit: default 10.0, >= 0: the growth test judges a logit only above this. Early in
            training every head's logits grow many times over from near zero (SpikeBench's
            healthy runs: 0.3 to 3 in 50 steps) while attention is still far from one-hot
            (over 64 keys a max logit of 10 leaves the others about e^-10 of its weight each
            at most when they are near 0).

    The growth test applies only while the head's median is positive (a ratio to a negative
    median means nothing). The finding names the module, its layer and the head.
    """

    def __init__(self, base_trial: Trial, max_logit: Any = 100.0, growth_factor: Any = 4.0,
                 window: Any = 100, min_history: Any = 50, min_logit: Any = 10.0,
                 action_str: Any = None) -> None:
        name = type(self).__name__
        size = int_param(name, "window", window, 2)
        super().__init__(base_trial, action_str, size + 1)
        require_collection(name, base_trial, ATTENTION, "per-head attention max logits")
        self.max_logit = as_float(name, "max_logit", max_logit, 0, inclusive=False)
        self.growth_factor = as_float(name, "growth_factor", growth_factor, 1, inclusive=False)
        self.min_logit = as_float(name, "min_logit", min_logit, 0)
        self.set_window(size, min_history)
        self._names = SignalNames(ATTENTION, "max_logit")

    def invoke_at_step(self, step: int) -> bool:
        findings = []
        for name in self.signal_tensors(self._names.names(self.base_trial), step):
            value = self._history.value(name, step)
            if value is None:
                continue
            _, median = self.trailing(name, step, value)
            for head, logit in per_head(value):
                med = float(median[head or 0])
                if math.isnan(logit) or logit == math.inf:
                    findings.append(f"{where(name, head)}: the max logit is {logit}")
                elif logit > self.max_logit:
                    findings.append(f"{where(name, head)}: the max logit {fmt(logit)} is above "
                                    f"max_logit {self.max_logit:g}")
                elif med > 0 and logit > self.min_logit and logit > self.growth_factor * med:
                    findings.append(
                        f"{where(name, head)}: the max logit {fmt(logit)} is above growth_factor "
                        f"{self.growth_factor:g} x its median {fmt(med)} over the last "
                        f"{self.window} steps")
        return self.report_findings(step, findings)


class AttentionEntropyCollapse(StabilityRule):
    """Fires when an attention head's entropy (``attention/<module>/entropy``, nats, one value
    per head) collapses: it is below ``min_entropy`` (near one-hot attention) while its median
    over the trailing ``window`` steps was above 4 x min_entropy, or it fell below
    ``drop_fraction`` times that median. Entropy collapse accompanies attention-logit growth
    (Wortsman et al. 2023; Dehghani et al. 2023, ViT-22B).

    Args:
        base_trial: the trial to watch.
        min_entropy: default 0.05 nats, > 0 (a head spending about 99% of its weight on one key
            has about this entropy).
        drop_fraction: default 0.25, in (0, 1).
        window: default 50, >= 2.
        min_history: default 10, in [2, window]: finite values the window needs before a head
            is judged (a warm-up).

    A head whose median is itself below min_entropy is not judged by the drop test: it has
    always been near one-hot, which some heads are by design. A head with no entropy at a step
    (NaN: every query of it masked) is skipped.
    """

    def __init__(self, base_trial: Trial, min_entropy: Any = 0.05, drop_fraction: Any = 0.25,
                 window: Any = 50, min_history: Any = 10, action_str: Any = None) -> None:
        name = type(self).__name__
        size = int_param(name, "window", window, 2)
        super().__init__(base_trial, action_str, size + 1)
        require_collection(name, base_trial, ATTENTION, "per-head attention entropies")
        self.min_entropy = as_float(name, "min_entropy", min_entropy, 0, inclusive=False)
        self.drop_fraction = as_float(name, "drop_fraction", drop_fraction, 0, 1,
                                         inclusive=False)
        self.set_window(size, min_history)
        self._names = SignalNames(ATTENTION, "entropy")

    def invoke_at_step(self, step: int) -> bool:
        findings = []
        for name in self.signal_tensors(self._names.names(self.base_trial), step):
            value = self._history.value(name, step)
            if value is None:
                continue
            _, median = self.trailing(name, step, value)
            for head, entropy in per_head(value):
                med = float(median[head or 0])
                if not math.isfinite(entropy) or math.isnan(med):
                    continue
                if (entropy < self.min_entropy
                        and med > HEALTHY_ENTROPY_FACTOR * self.min_entropy):
                    findings.append(
                        f"{where(name, head)}: the entropy {fmt(entropy)} nats is below min_entropy "
                        f"{self.min_entropy:g} while its median over the last {self.window} "
                        f"steps was {fmt(med)}")
                elif med > self.min_entropy and entropy < self.drop_fraction * med:
                    findings.append(
                        f"{where(name, head)}: the entropy {fmt(entropy)} nats fell below drop_fraction "
                        f"{self.drop_fraction:g} x its median {fmt(med)} over the last "
                        f"{self.window} steps")
        return self.report_findings(step, findings)


__all__ = ["AttentionEntropyCollapse", "AttentionLogitGrowth"]
