"""Built-in rules on small synthetic trials: each fires where it should and stays quiet elsewhere.

Trials are written with mltrace's own writer (tests/support/rule_trials.py); tests/rules/test_rules_torch.py
runs some rules on trials written by the PyTorch hook, tests/rules/test_rules_cli.py the CLI.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from mltrace.exceptions import MltraceValueError, RuleEvaluationConditionMet
from mltrace.rules import invoke_rule
from mltrace.rules.builtin import (
    BUILTIN_RULES,
    AllZero,
    CheckInputImages,
    ClassImbalance,
    Confusion,
    DeadRelu,
    ExplodingTensor,
    FeatureImportanceOverweight,
    GradientNormVsBaseline,
    LossNotDecreasing,
    NaNInfDetected,
    NLPSequenceRatio,
    Overfit,
    Overtraining,
    PoorWeightInitialization,
    SaturatedActivation,
    SimilarAcrossRuns,
    StalledTrainingRule,
    TensorVariance,
    TreeDepth,
    UnchangedTensor,
    WeightUpdateRatio,
    rule_class,
)
from mltrace.stability.signals import collection_regexes
from mltrace.trials import create_trial
from tests.support.rule_trials import last_step, red, write_trial

RNG = np.random.default_rng(0)


def fires(first_step, cls, path, *args, steps=None, message=None, **params):
    """``cls(trial, *args, **params)`` over the whole trial fires first at ``first_step`` (at
    exactly ``steps`` when given), and with raise_eval_cond raises RuleEvaluationConditionMet
    there. Returns the RuleResult."""
    rule = cls(create_trial(path), *args, **params)
    result = invoke_rule(rule, end_step=last_step(rule.base_trial) + 1)
    assert result.first_step == first_step, (result.fired_steps, rule.last_message)
    if steps is not None:
        assert result.fired_steps == steps
    assert result.status == "IssuesFound" and result.message  # the first firing's message
    if message is not None:
        assert message in result.message, result.message
    again = cls(create_trial(path), *args, **params)
    with pytest.raises(RuleEvaluationConditionMet) as info:
        invoke_rule(again, end_step=last_step(again.base_trial) + 1, raise_eval_cond=True)
    assert info.value.step == first_step
    return result


def quiet(cls, path, *args, **params):
    """``cls(trial, *args, **params)`` evaluates every step and never fires."""
    rule = cls(create_trial(path), *args, **params)
    result = invoke_rule(rule, end_step=last_step(rule.base_trial) + 1, raise_eval_cond=True)
    assert result.fired_steps == [] and result.evaluated_steps > 0
    assert result.status == "NoIssuesFound"
    return result


# -- registry ---------------------------------------------------------------------------------
def test_every_smdebug_rule_and_the_new_ones_are_registered():
    smdebug = {"VanishingGradient", "ExplodingTensor", "SimilarAcrossRuns", "WeightUpdateRatio",
               "AllZero", "UnchangedTensor", "LossNotDecreasing", "CheckInputImages",
               "NLPSequenceRatio", "Confusion", "ClassImbalance", "DeadRelu",
               "SaturatedActivation", "PoorWeightInitialization", "TensorVariance", "Overfit",
               "Overtraining", "StalledTrainingRule", "FeatureImportanceOverweight", "TreeDepth"}
    stability = {"LossSpike", "GradNormSpike", "AttentionLogitGrowth", "AttentionEntropyCollapse",
                 "OutputLogitDrift", "MassiveActivation", "LinearOutputGrowth", "UpdateRatio",
                 "AdamEpsilonDominance", "AdamStaleSecondMoment", "WorkerDivergence"}
    assert smdebug | {"NaNInfDetected", "GradientNormVsBaseline"} | stability == set(BUILTIN_RULES)
    assert rule_class("lossnotdecreasing") is LossNotDecreasing
    for cls in BUILTIN_RULES.values():
        assert "default" in (cls.__doc__ or ""), cls.__name__


# -- ExplodingTensor / NaNInfDetected -----------------------------------------------------------
def test_exploding_tensor_raw_values(tmp_path):
    ok = np.ones((3, 2), np.float32)
    steps = {0: {"w": ok}, 1: {"w": ok}, 2: {"w": np.array([1.0, np.inf])},
             3: {"w": np.array([np.nan, 1.0])}}
    path = write_trial(tmp_path / "run", steps)
    fires(2, ExplodingTensor, path, steps=[2, 3], message="infinite")
    fires(3, ExplodingTensor, path, only_nan="True", steps=[3], message="NaN")
    quiet(ExplodingTensor, write_trial(tmp_path / "fine", {0: {"w": ok}, 1: {"w": ok}}))


def test_exploding_tensor_from_reductions_only(tmp_path):
    """No raw tensor: stored nan_count, or smdebug's min/max reductions, still tell."""
    def step(nans, b_max):
        return {red("a", "nan_count"): nans, red("a", "inf_count"): 0,
                red("b", "max"): b_max, red("b", "min"): 1.0}

    path = write_trial(tmp_path / "run", {0: step(0, 3.0), 1: step(2, 3.0), 2: step(0, np.inf)})
    fires(1, ExplodingTensor, path, tensor_regex="^a$", steps=[1])
    fires(2, ExplodingTensor, path, tensor_regex="^b$", steps=[2])
    quiet(ExplodingTensor, path, tensor_regex="^b$", only_nan=True)


def test_nan_inf_detected_names_every_nonfinite_tensor(tmp_path):
    def counts(g1, g2):
        return {red("g1", "nan_count"): g1[0], red("g1", "inf_count"): g1[1],
                red("g2", "nan_count"): g2[0], red("g2", "inf_count"): g2[1]}

    steps = {0: counts((0, 0), (0, 0)), 1: counts((0, 0), (0, 0)), 2: counts((5, 1), (0, 3))}
    path = write_trial(tmp_path / "run", steps, collections={"gradients": ["^g"]})
    result = fires(2, NaNInfDetected, path, collection_names="gradients", steps=[2])
    assert "g1 (5 NaN, 1 Inf)" in result.message and "g2 (0 NaN, 3 Inf)" in result.message
    fires(2, NaNInfDetected, path, only_nan=True,
          message="1 tensor(s) non-finite at step 2: g1 (5 NaN)")
    # A raw-only trial: counted from the values, unless the rule must not read raw tensors.
    raw = write_trial(tmp_path / "raw", {0: {"g": np.zeros(3)}, 1: {"g": np.array([np.nan, 0.0])}})
    fires(1, NaNInfDetected, raw)
    quiet(NaNInfDetected, raw, use_raw_tensors="false")
    with pytest.raises(MltraceValueError, match="not in trial"):
        NaNInfDetected(create_trial(path), collection_names="nope")


# -- SimilarAcrossRuns / GradientNormVsBaseline ----------------------------------------------------
def test_similar_across_runs(tmp_path):
    steps = {s: {"w": np.full(4, float(s)), "b": np.arange(3)} for s in range(4)}
    base = write_trial(tmp_path / "a", steps)
    same = write_trial(tmp_path / "b", steps)
    other = write_trial(tmp_path / "c", {**steps, 2: {"w": np.full(4, 2.5), "b": np.arange(3)}})
    quiet(SimilarAcrossRuns, base, create_trial(same))
    fires(2, SimilarAcrossRuns, base, other, steps=[2], message="max |difference| 0.5")
    quiet(SimilarAcrossRuns, base, other, "^b$")  # smdebug's third argument: the tensors compared
    quiet(SimilarAcrossRuns, base, other, atol="0.5")
    with pytest.raises(MltraceValueError, match="needs other_trial"):
        SimilarAcrossRuns(create_trial(base))


def test_gradient_norm_vs_baseline_matches_mode_steps(tmp_path):
    def norm(value):
        return {red("gradient/fc", "l2"): value}

    # Baseline: TRAIN steps 0..3 at global steps 0..3. Run: an EVAL step shifts TRAIN steps 2, 3.
    baseline = write_trial(tmp_path / "baseline", {g: norm(2.0) for g in range(4)},
                           modes={g: "train" for g in range(4)},
                           collections={"gradients": ["^gradient"]})
    steps = {0: norm(2.5), 1: norm(3.0), 2: {"loss": 1.0}, 3: norm(30.0), 4: norm(1.0)}
    modes = {0: "train", 1: "train", 2: "eval", 3: "train", 4: "train"}
    run = write_trial(tmp_path / "run", steps, modes=modes,
                      collections={"gradients": ["^gradient"]})
    result = fires(3, GradientNormVsBaseline, run, create_trial(baseline), steps=[3],
                   message="gradient/fc l2 norm 30 is 15x the baseline's 2 at step 3 (TRAIN step 2)")
    assert result.parameters["max_ratio"] == 10.0
    fires(3, GradientNormVsBaseline, run, baseline, min_ratio="0.6", steps=[3, 4])
    quiet(GradientNormVsBaseline, run, baseline, max_ratio="20")
    with pytest.raises(MltraceValueError, match="norm="):
        GradientNormVsBaseline(create_trial(run), baseline, norm="linf")


# -- WeightUpdateRatio -------------------------------------------------------------------------
def test_weight_update_ratio(tmp_path):
    w = RNG.normal(size=(5, 5))
    jumped = w * 1.01 + 50
    steps = {0: {"fc.weight": w}, 1: {"fc.weight": w * 1.01}, 2: {"fc.weight": jumped},
             3: {"fc.weight": jumped}, 4: {"fc.weight": jumped * 1.001}}
    modes = {0: "train", 1: "train", 2: "train", 3: "eval", 4: "train"}
    path = write_trial(tmp_path / "run", steps, modes=modes, collections={"weights": ["weight"]})
    # TRAIN step 2 jumps (ratio ~50); EVAL step 3 is skipped although unchanged (ratio 0).
    fires(2, WeightUpdateRatio, path, steps=[2], message="large_threshold")
    quiet(WeightUpdateRatio, path, large_threshold="1000")
    # TRAIN step 3 (global 4) vs TRAIN step 2: ratio 0.001; vs TRAIN step 1 (num_steps=2): ~50.
    fires(4, WeightUpdateRatio, path, large_threshold="1000", small_threshold="0.002", steps=[4],
          message="small_threshold")
    quiet(WeightUpdateRatio, path, num_steps="2", large_threshold="1000", small_threshold="0.002")


# -- AllZero / TensorVariance ------------------------------------------------------------------
def test_all_zero(tmp_path):
    half = np.array([0.0, 0.0, 1.0, 2.0])
    steps = {0: {"w": np.ones(4), "b": np.ones(2)}, 1: {"w": half, "b": np.ones(2)},
             2: {"w": np.ones(4), "b": np.zeros(2)}}
    path = write_trial(tmp_path / "run", steps, collections={"biases": ["^b$"]})
    fires(2, AllZero, path, collection_names="biases", tensor_regex="^w$", steps=[2])
    fires(1, AllZero, path, tensor_regex="^w$", threshold="50", steps=[1], message="50% of values")
    quiet(AllZero, path, tensor_regex="^w$")
    # Reductions only: abs max 0 means all zero.
    only = write_trial(tmp_path / "red", {0: {red("g", "max", True): 0.5},
                                          1: {red("g", "max", True): 0.0}})
    fires(1, AllZero, only, tensor_regex="g", steps=[1])
    with pytest.raises(MltraceValueError, match="collection_names or tensor_regex"):
        AllZero(create_trial(path))


def test_tensor_variance(tmp_path):
    steps = {s: {"w": RNG.normal(scale=1.0, size=200)} for s in range(3)}
    steps[3] = {"w": RNG.normal(scale=10.0, size=200)}
    steps[4] = {red("w", "variance"): 1e-9}
    path = write_trial(tmp_path / "run", steps)
    fires(3, TensorVariance, path, tensor_regex="w", max_threshold="10", steps=[3])
    fires(4, TensorVariance, path, tensor_regex="w", min_threshold="1e-6", steps=[4])
    quiet(TensorVariance, path, tensor_regex="w", max_threshold=1000, min_threshold=1e-12)
    with pytest.raises(MltraceValueError, match="max_threshold, min_threshold"):
        TensorVariance(create_trial(path), tensor_regex="w")


# -- UnchangedTensor ---------------------------------------------------------------------------
def test_unchanged_tensor_smdebug_semantics(tmp_path):
    """smdebug's old unit test: foo_* saved at 0, 1, 2 (ones), boo_* at 5."""
    ones = np.ones((10, 3, 2))
    steps = {s: {f"foo_{i}": ones for i in range(3)} for s in range(3)}
    steps[5] = {f"boo_{i}": ones for i in range(3)}
    path = write_trial(tmp_path / "run", steps)

    def fired(start, end):
        rule = UnchangedTensor(create_trial(path), tensor_regex=".*")
        return invoke_rule(rule, start, end).fired_steps

    assert fired(0, 2) == []
    assert fired(0, 3) == [2]
    assert fired(2, 3) == [2]  # earlier steps are read even when not evaluated
    assert fired(3, 6) == []
    fires(1, UnchangedTensor, path, tensor_regex="foo", num_steps=2, steps=[1, 2])


def test_unchanged_tensor_compares_within_a_mode(tmp_path):
    w = RNG.normal(size=4)
    steps = {s: {"fc.weight": w + d, "out": w + d} for s, d in enumerate([0, 1, 1, 1, 2])}
    modes = {0: "train", 1: "train", 2: "eval", 3: "eval", 4: "train"}
    path = write_trial(tmp_path / "run", steps, modes=modes, collections={"weights": ["weight"]})
    # Weights never change in EVAL: not flagged there; TRAIN steps keep changing.
    quiet(UnchangedTensor, path, collection_names="weights", num_steps=2)
    fires(3, UnchangedTensor, path, tensor_regex="^out$", num_steps=2, steps=[3],
          message="EVAL steps 0, 1")
    fires(3, UnchangedTensor, path, tensor_regex="^out$", num_steps=3, mode="global")
    quiet(UnchangedTensor, path, tensor_regex="^out$", num_steps=2, mode="train")


# -- LossNotDecreasing --------------------------------------------------------------------------
def _losses(path, values, interval=4, **kwargs):
    steps = {i * interval: {"loss_0": v, "loss_1": v} for i, v in enumerate(values)}
    return write_trial(path, steps, collections={"gradients": ["loss"]}, **kwargs)


def test_loss_not_decreasing_smdebug_semantics(tmp_path):
    """smdebug's old unit test: losses saved every 4 steps, num_steps 10: fires at step 12."""
    path = _losses(tmp_path / "run", [0.3, 0.33, 0.31, 0.30, 0.28])
    for params in ({"tensor_regex": "loss, losses"}, {"collection_names": ["default", "gradients"]},
                   {}):
        fires(12, LossNotDecreasing, path, steps=[12], message="not decreasing", **params)
        rule = LossNotDecreasing(create_trial(path), **params)
        assert invoke_rule(rule, 0, 17).fired_steps == [12]
        assert invoke_rule(rule, 13, 17).fired_steps == []  # 16 is < num_steps after 12
        fresh = LossNotDecreasing(create_trial(path), **params)
        assert invoke_rule(fresh, 13, 17).fired_steps == []  # 16 vs 4: decreasing


def test_loss_not_decreasing_diff_percent_and_schedule(tmp_path):
    values = [1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.55, 0.3]
    path = _losses(tmp_path / "run", values, interval=3)
    # Checks at 12 (vs 0: -20%) and 24 (vs 12: -62.5%), not in between (num_steps 10).
    fires(12, LossNotDecreasing, path, num_steps="10", diff_percent="25", steps=[12],
          message="decreased by 20%")
    fires(12, LossNotDecreasing, path, num_steps="10", diff_percent="70", steps=[12, 24])
    quiet(LossNotDecreasing, path, num_steps=10, diff_percent=15)
    with pytest.raises(MltraceValueError, match="below 100"):
        LossNotDecreasing(create_trial(path), diff_percent=100)


def test_loss_not_decreasing_uses_eval_losses_first(tmp_path):
    # TRAIN loss falls; EVAL loss stays flat. Each epoch: 4 TRAIN steps, then 2 EVAL steps.
    steps, modes = {}, {}
    for epoch in range(6):
        for i in range(4):
            g, t = 6 * epoch + i, 4 * epoch + i
            steps[g], modes[g] = {"loss": 1.0 - 0.03 * t}, ("train", t)
        for i in range(2):
            g, e = 6 * epoch + 4 + i, 2 * epoch + i
            steps[g], modes[g] = {"loss": 0.9}, ("eval", e)
    path = write_trial(tmp_path / "run", steps, modes=modes, collections={"losses": ["loss"]})
    # EVAL step 10 (global 34) is the first 10 EVAL steps after EVAL step 0.
    fires(34, LossNotDecreasing, path, steps=[34], message="(EVAL)")
    quiet(LossNotDecreasing, path, mode="train", num_steps=5)
    quiet(LossNotDecreasing, path, mode="TRAIN")


# -- CheckInputImages / NLPSequenceRatio -----------------------------------------------------------
def test_check_input_images(tmp_path):
    name = "hybridsequential0_input_0"

    def images(draw, steps=6):
        return write_trial(tmp_path / f"run{len(list(tmp_path.iterdir()))}",
                           {s: {name: draw(size=(100, 3, 4, 4)).astype(np.float32)}
                            for s in range(steps)})

    # After 500 images (step 4), the mean (0.5) is far from 0: inputs were not normalized.
    fires(4, CheckInputImages, images(RNG.uniform), steps=[4, 5], message="channel")
    quiet(CheckInputImages, images(RNG.normal))
    # NHWC with one channel off: channel=3 finds it, at the sample threshold given as a string.
    nhwc = np.concatenate([RNG.normal(size=(50, 4, 4, 2)), np.full((50, 4, 4, 1), 0.5)], axis=3)
    path = write_trial(tmp_path / "nhwc", {s: {"model_input_0": nhwc} for s in range(3)})
    fires(1, CheckInputImages, path, regex="model_input", channel="3", threshold_samples="100",
          message="channel 2")


def test_nlp_sequence_ratio(tmp_path):
    seqs = RNG.integers(2, 100, size=(8, 20))
    padded = seqs.copy()
    padded[:, 6:] = 0  # 70% padding
    unknown = seqs.copy()
    unknown[:, :5] = 1  # 25% unknown tokens
    name = "embedding0_input_0"
    path = write_trial(tmp_path / "run", {0: {name: seqs}, 1: {name: padded}, 2: {name: unknown}})
    fires(1, NLPSequenceRatio, path, steps=[1], message="70% of tokens are 0")
    fires(2, NLPSequenceRatio, path, token_values="0,1", token_thresholds_percent="80,20",
          steps=[2])
    quiet(NLPSequenceRatio, path, token_thresholds_percent="75")
    with pytest.raises(MltraceValueError, match="one per token"):
        NLPSequenceRatio(create_trial(path), token_values="0,1,2", token_thresholds_percent="1,2")


# -- Confusion / ClassImbalance --------------------------------------------------------------------
def test_confusion_smdebug_cases(tmp_path):
    y = RNG.integers(10, size=100)
    path = write_trial(tmp_path / "a", {0: {"y": y, "y_hat": y}},
                       collections={"labels": ["^y$"], "preds": ["y_hat"]})
    quiet(Confusion, path, labels_collection="labels", predictions_collection="preds")
    y = np.arange(10)
    y_hat = y.copy()
    y_hat[4] = 7
    path = write_trial(tmp_path / "b", {1: {"foo": y, "bar": y_hat}})
    fires(1, Confusion, path, 10, "foo", "bar", message="predicted as class 7")
    fires(1, Confusion, path, "10", "foo", "bar", min_diag="0.0", max_off_diag="0.01",
          message="are class 4")
    quiet(Confusion, write_trial(tmp_path / "c", {1: {"labels": y, "predictions": y}}))


def test_confusion_with_scores_per_step(tmp_path):
    y = RNG.integers(3, size=60)
    good = np.eye(3)[y] * 0.8 + 0.1
    bad = np.eye(3)[(y + 1) % 3]
    steps = {0: {"labels": y, "predictions": good}, 5: {"labels": y, "predictions": bad}}
    fires(5, Confusion, write_trial(tmp_path / "run", steps), steps=[5])


def test_class_imbalance(tmp_path):
    labels = np.zeros(1000)
    labels[-10:] = 1
    path = write_trial(tmp_path / "a", {3: {"labels_0": labels}})
    fires(3, ClassImbalance, path, labels_regex="labels_0", predictions_regex="labels_0",
          message="ratio 99")
    # Balanced labels over steps, but class 2 mostly mispredicted; fires once 500 samples are in.
    y = np.repeat([0, 1, 2], 40)
    scores = np.eye(3)[y]
    scores[80:110] = np.eye(3)[0]  # 30 of 40 class-2 samples predicted as 0
    path = write_trial(tmp_path / "b", {s: {"val_labels": y, "val_predictions": scores}
                                        for s in range(6)})
    fires(4, ClassImbalance, path, argmax="True", steps=[4, 5], message="class 2")
    quiet(ClassImbalance, path, argmax=True, threshold_misprediction="0.8")


# -- DeadRelu / SaturatedActivation ----------------------------------------------------------------
def test_dead_relu(tmp_path):
    healthy = np.maximum(RNG.normal(size=(64, 10)), 0)
    dying = healthy.copy()
    dying[:, :6] = 0  # 6 of 10 units never active
    conv = np.maximum(RNG.normal(size=(8, 4, 5, 5)), 0)
    conv[:, :3] = 0  # 3 of 4 channels dead
    steps = {0: {"relu0_relu_output": healthy}, 1: {"relu0_relu_output": dying},
             2: {"conv_relu": conv}}
    path = write_trial(tmp_path / "run", steps)
    fires(1, DeadRelu, path, steps=[1], message="60% of 10 units")
    fires(2, DeadRelu, path, tensor_regex="conv_relu", message="75% of 4 units")
    quiet(DeadRelu, path, threshold_layer="80")


def test_saturated_activation(tmp_path):
    ok = RNG.normal(size=(32, 8))
    saturated = ok.copy()
    saturated[:, :5] = 12.0  # beyond tanh's range, inside the sigmoid's
    steps = {0: {"l1_tanh_input": ok, "l2_sigmoid_input": saturated},
             1: {"l1_tanh_input": saturated, "l2_sigmoid_input": ok}}
    path = write_trial(tmp_path / "run", steps)
    fires(1, SaturatedActivation, path, steps=[1], message="l1_tanh_input: 62.5%")
    quiet(SaturatedActivation, path, threshold_tanh="(-15, 15)")
    fires(0, SaturatedActivation, path, threshold_sigmoid="[-23, 10]", message="l2_sigmoid_input")


# -- PoorWeightInitialization ----------------------------------------------------------------------
def test_poor_weight_initialization(tmp_path):
    def run(first_var, grad_scale, losses):
        steps = {s: {"l1_relu_input": RNG.normal(scale=math.sqrt(first_var), size=256),
                     "l2_relu_input": RNG.normal(size=256),
                     "gradient/fc": RNG.normal(scale=grad_scale, size=100), "loss": loss}
                 for s, loss in enumerate(losses)}
        return write_trial(tmp_path / f"run{len(list(tmp_path.iterdir()))}", steps,
                           collections={"gradients": ["^gradient"], "losses": ["loss"]})

    falling = [1.0 - 0.05 * s for s in range(12)]
    quiet(PoorWeightInitialization, run(1.5, 0.1, falling))
    fires(0, PoorWeightInitialization, run(100.0, 0.1, falling),
          message="activation input variances")
    fires(0, PoorWeightInitialization, run(1.0, 1e-5, falling), message="percentiles")
    stuck = [1.0, 0.9, 0.95, 0.92, 0.91, 0.93, 0.94, 0.9, 0.9, 0.9, 0.9, 0.9]
    fires(6, PoorWeightInitialization, run(1.0, 0.1, stuck), steps=[6, 7, 8, 9],
          message="has not improved")
    # Only the first `steps` steps count.
    quiet(PoorWeightInitialization, run(1.0, 0.1, falling[:10] + [5.0, 5.0]), patience=1)


# -- Overfit / Overtraining ------------------------------------------------------------------------
def _train_eval(path, train_losses, eval_losses, per_phase=3):
    """Phases of ``per_phase`` TRAIN steps then ``per_phase`` EVAL steps."""
    steps, modes = {}, {}
    for i, (train, val) in enumerate(zip(train_losses, eval_losses)):
        phase, k = divmod(i, per_phase)
        g = 2 * per_phase * phase + k
        steps[g], modes[g] = {"CrossEntropyLoss_output_0": train}, ("train", i)
        g += per_phase
        steps[g], modes[g] = {"CrossEntropyLoss_output_0": val}, ("eval", i)
    return write_trial(path, steps, modes=modes, collections={"losses": ["Loss_output"]})


def test_overfit(tmp_path):
    train = [1.0, 0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    close = [0.95, 0.95, 0.95, 0.55, 0.55, 0.55, 0.26, 0.26, 0.26]
    drifting = [0.95, 0.95, 0.95, 0.6, 0.6, 0.6, 0.5, 0.5, 0.5]
    path = _train_eval(tmp_path / "a", train, drifting)
    # Training means per phase: 0.9, 0.5, 0.2. (0.6 - 0.5) / 0.5 = 0.2 > 0.1 at global steps 9-11.
    fires(9, Overfit, path, steps=[9, 10, 11, 15, 16, 17])
    fires(15, Overfit, path, patience="4", steps=[15, 16, 17])
    fires(15, Overfit, path, start_step="12")
    quiet(Overfit, _train_eval(tmp_path / "b", train, close), ratio_threshold="0.35")
    quiet(Overfit, path, ratio_threshold="2")


def test_overtraining(tmp_path):
    train = [1.0, 0.8, 0.6, 0.5, 0.47, 0.45, 0.44, 0.43, 0.42]
    evals = [0.9, 0.7, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    path = _train_eval(tmp_path / "a", train, evals)
    # TRAIN: best 0.5 at TRAIN step 3, no 0.1 improvement for 5 steps: TRAIN step 8 (global 14).
    fires(14, Overtraining, path, steps=[14])
    # EVAL: best 0.5 at EVAL step 2; patience_validation 3: EVAL step 5 (global 11).
    fires(11, Overtraining, path, patience_train=20, patience_validation="3",
          message="validation loss")
    quiet(Overtraining, path, delta="0.01")


# -- StalledTrainingRule ---------------------------------------------------------------------------
def test_stalled_training_on_a_finished_trial(tmp_path):
    t0 = time.time() - 10_000
    path = write_trial(tmp_path / "run", {s: {"loss": 1.0} for s in range(4)},
                       wall_times={0: t0, 1: t0 + 60, 2: t0 + 2000, 3: t0 + 2060})
    fires(2, StalledTrainingRule, path, steps=[2], message="1940 s between step 1 and step 2")
    quiet(StalledTrainingRule, path, threshold="3600")


def test_stalled_training_while_waiting_for_a_live_trial(tmp_path):
    t0 = time.time() - 100
    path = write_trial(tmp_path / "run", {0: {"loss": 1.0}, 1: {"loss": 0.9}},
                       wall_times={0: t0, 1: t0 + 1}, end=False)
    rule = StalledTrainingRule(create_trial(path), threshold="50", stop_training_on_fire="true")
    with pytest.raises(RuleEvaluationConditionMet) as info:
        invoke_rule(rule, start_step=0, end_step=5, raise_eval_cond=True)
    assert info.value.step == 2 and "while waiting for step 2" in rule.last_message
    assert (tmp_path / "run" / "mltrace_stop_training.json").exists()


# -- XGBoost rules ---------------------------------------------------------------------------------
def test_feature_importance_overweight(tmp_path):
    even = {f"feature_importance/weight/f{i}": 0.1 for i in range(10)}
    weights = [0.5, 0.3, 0.1, 0.05, 0.05]
    skewed = {f"feature_importance/weight/f{i}": w for i, w in enumerate(weights)}
    steps = {0: even, 10: {**skewed, "feature_importance/gain/f0": 1.0}}
    path = write_trial(tmp_path / "run", steps,
                       collections={"feature_importance": ["^feature_importance"]})
    fires(10, FeatureImportanceOverweight, path, steps=[10], message="(f0, f1, f2) hold 0.9")
    quiet(FeatureImportanceOverweight, path, threshold="0.95")
    quiet(FeatureImportanceOverweight, path, nfeatures="5")  # all the features: skipped


def test_tree_depth(tmp_path):
    def tree(max_depth):  # node ids of a complete tree, numbered breadth-first as XGBoost does
        return np.arange(2 ** (max_depth + 1) - 1)

    two_trees = {"trees/Tree": np.array([0, 0, 0, 1, 1, 1, 1, 1, 1, 1]),
                 "trees/Node": np.array([0, 1, 2, 0, 1, 2, 3, 4, 5, 6])}
    steps = {0: {"trees/Node": tree(5), "trees/ID": np.array([f"0-{n}" for n in tree(5)])},
             1: {"trees/Node": tree(4)}, 2: {"trees/Node": tree(3)}, 3: two_trees}
    path = write_trial(tmp_path / "run", steps, collections={"trees": ["^trees/"]})
    fires(2, TreeDepth, path, steps=[2, 3], message="depth 3 < depth 4")
    fires(3, TreeDepth, path, depth="2", steps=[3], message="tree 0 of step 3 has depth 1")
    quiet(TreeDepth, path, depth=1)
    # With IDs and children saved, the tree is walked: 7 nodes, but 3 levels below the root
    # (node 4 splits again), where smdebug's log2(largest id) said 2.
    walked = {"trees/Node": np.arange(7), "trees/ID": np.array([f"0-{n}" for n in range(7)]),
              "trees/Yes": np.array(["0-1", "0-3", "nan", "nan", "0-5", "nan", "nan"]),
              "trees/No": np.array(["0-2", "0-4", "nan", "nan", "0-6", "nan", "nan"])}
    path = write_trial(tmp_path / "walked", {0: walked, 1: {"trees/Node": np.arange(7)}})
    fires(1, TreeDepth, path, depth=3, steps=[1], message="tree 0 of step 1 has depth 2")
    fires(0, TreeDepth, path, depth=4, steps=[0, 1], message="tree 0 of step 0 has depth 3")


# -- robustness ------------------------------------------------------------------------------------
def test_rules_skip_steps_where_their_tensors_are_missing(tmp_path):
    """Steps holding unrelated tensors, or only some reductions: no rule crashes."""
    signals = {"attention/b.0.attn/max_logit": np.ones(2), "attention/b.0.attn/entropy": np.ones(2),
               "logits/M/log_z_mean": 1.0, "logits/M/log_z_max": 1.0, "activations/b.0/abs_max": 1.0,
               "activations/b.0/abs_median": 1.0, "activations/b.0/l2": 1.0, "grad_norm/M": 1.0,
               "updates/M_w/ratio": 1e-3, "optimizer_state/M_w/eps_fraction": 0.0,
               "optimizer_state/M_w/grad_sq_ratio": 1.0}
    steps = {0: {"other": np.ones(3)}, 1: {"w": np.ones(3), "loss": 1.0, **signals}, 2: {"other": np.ones(3)},
             3: {red("w", "mean"): 1.0, "grad_norm/M": 1.0}}
    path = write_trial(tmp_path / "run", steps,
                       collections={"weights": ["^w$"], "gradients": ["^w$"], **collection_regexes("loss")},
                       modes={0: "train", 1: "train", 2: "eval", 3: "train"})
    baseline = write_trial(tmp_path / "baseline", {0: {"other": 1}})
    params = {"AllZero": {"tensor_regex": "w"}, "UnchangedTensor": {"tensor_regex": "w"},
              "TensorVariance": {"tensor_regex": "w", "max_threshold": "100"},
              "SimilarAcrossRuns": {"other_trial": baseline},
              "GradientNormVsBaseline": {"other_trial": baseline}}
    for name, cls in BUILTIN_RULES.items():
        if name == "WorkerDivergence":  # needs several workers: its own tests
            continue
        result = invoke_rule(cls(create_trial(path), **params.get(name, {})), end_step=4)
        assert result.error is None and result.evaluated_steps == 4, name
