"""Built-in rules with smdebug's names, parameters and defaults (smdebug 1.0.34's rule names, parameters and defaults),
and mltrace's own: NaNInfDetected, GradientNormVsBaseline and the transformer-stability rules
(mltrace.rules.builtin.stability: LossSpike, GradNormSpike, AttentionLogitGrowth, ...).

``BUILTIN_RULES`` maps each name to its class; lookups are case-insensitive (``rule_class``).
Third-party rules register through the ``mltrace.rules`` entry point group (mltrace.plugins).
"""

from __future__ import annotations

from mltrace import plugins
from mltrace.exceptions import MltraceValueError
from mltrace.rules.builtin.activations import DeadRelu, SaturatedActivation
from mltrace.rules.builtin.classification import ClassImbalance, Confusion
from mltrace.rules.builtin.exploding_tensor import ExplodingTensor, NaNInfDetected
from mltrace.rules.builtin.gradient_baseline import GradientNormVsBaseline
from mltrace.rules.builtin.input_data import CheckInputImages, NLPSequenceRatio
from mltrace.rules.builtin.loss_not_decreasing import LossNotDecreasing
from mltrace.rules.builtin.overfit import Overfit, Overtraining
from mltrace.rules.builtin.poor_weight_initialization import PoorWeightInitialization
from mltrace.rules.builtin.similar_across_runs import SimilarAcrossRuns
from mltrace.rules.builtin.stability import (
    AdamEpsilonDominance,
    AdamStaleSecondMoment,
    AttentionEntropyCollapse,
    AttentionLogitGrowth,
    GradNormSpike,
    LinearOutputGrowth,
    LossSpike,
    MassiveActivation,
    OutputLogitDrift,
    UpdateRatio,
    WorkerDivergence,
)
from mltrace.rules.builtin.stalled_training import StalledTrainingRule
from mltrace.rules.builtin.tensor_statistics import AllZero, TensorVariance
from mltrace.rules.builtin.unchanged_tensor import UnchangedTensor
from mltrace.rules.builtin.vanishing_gradient import VanishingGradient
from mltrace.rules.builtin.weight_update_ratio import WeightUpdateRatio
from mltrace.rules.builtin.xgboost_rules import FeatureImportanceOverweight, TreeDepth
from mltrace.rules.rule import Rule

BUILTIN_RULES: dict[str, type[Rule]] = {
    cls.__name__: cls
    for cls in (
        VanishingGradient,
        ExplodingTensor,
        SimilarAcrossRuns,
        WeightUpdateRatio,
        AllZero,
        UnchangedTensor,
        LossNotDecreasing,
        CheckInputImages,
        NLPSequenceRatio,
        Confusion,
        ClassImbalance,
        DeadRelu,
        SaturatedActivation,
        PoorWeightInitialization,
        TensorVariance,
        Overfit,
        Overtraining,
        StalledTrainingRule,
        FeatureImportanceOverweight,
        TreeDepth,
        NaNInfDetected,
        GradientNormVsBaseline,
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
}
for _name, _cls in BUILTIN_RULES.items():
    plugins.rules.register(_name, _cls)
del _name, _cls


def rule_class(name: str) -> type[Rule]:
    """The rule class called ``name`` (any case): a built-in rule, or one that another package
    registers through the ``mltrace.rules`` entry point group (see mltrace.plugins).

    Raises:
        MltraceValueError: unknown name, listing the known ones.
    """
    known = plugins.rules.items()
    by_lower = {n.lower(): cls for n, cls in known.items()}
    cls = by_lower.get(name.lower())
    if cls is None:
        failed = plugins.rules.failures.get(name)
        raise MltraceValueError(
            f"unknown rule {name!r}"
            + (f" (its plugin failed to load: {failed})" if failed else "")
            + f"; known rules are: {', '.join(sorted(known))} "
            "(or pass --rule-file FILE for a rule of your own)"
        )
    return cls


__all__ = ["BUILTIN_RULES", "rule_class", *BUILTIN_RULES]
