"""The transformer-stability rules: they read the signals of mltrace.stability.signals (saved by
the PyTorch hook's ``stability`` collection) and judge each step against a trailing window of
the steps before it (mltrace.stability.windows)."""

from mltrace.rules.builtin.stability.activations import LinearOutputGrowth, MassiveActivation
from mltrace.rules.builtin.stability.attention import (
    AttentionEntropyCollapse,
    AttentionLogitGrowth,
)
from mltrace.rules.builtin.stability.gradient_norms import GradNormSpike
from mltrace.rules.builtin.stability.logits import OutputLogitDrift
from mltrace.rules.builtin.stability.loss_spike import LossSpike
from mltrace.rules.builtin.stability.optimizer import (
    AdamEpsilonDominance,
    AdamStaleSecondMoment,
    UpdateRatio,
)
from mltrace.rules.builtin.stability.workers import WorkerDivergence

#: The stability rules, in the order of a step's story: loss, gradients, attention, logits,
#: activations, optimizer, workers.
STABILITY_RULES = (
    LossSpike,
    GradNormSpike,
    AttentionLogitGrowth,
    AttentionEntropyCollapse,
    OutputLogitDrift,
    MassiveActivation,
    LinearOutputGrowth,
    UpdateRatio,
    AdamEpsilonDominance,
    AdamStaleSecondMoment,
    WorkerDivergence,
)

__all__ = [
    "AdamEpsilonDominance", "AdamStaleSecondMoment", "AttentionEntropyCollapse",
    "AttentionLogitGrowth", "GradNormSpike", "LinearOutputGrowth", "LossSpike",
    "MassiveActivation", "OutputLogitDrift", "STABILITY_RULES", "UpdateRatio", "WorkerDivergence",
]
