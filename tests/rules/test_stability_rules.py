"""The transformer-stability rules (mltrace.rules.builtin.stability) on small synthetic trials,
and the trailing-window statistics they use (mltrace.stability.windows).

Each rule fires on a trial with its fault, naming the tensor, layer, head and step; stays quiet
on a healthy trial with realistic noise (seeded); rejects an out-of-range parameter naming it;
and says what to record when the trial lacks its signals.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mltrace.exceptions import MltraceValueError, RuleEvaluationConditionMet
from mltrace.rules import invoke_rule
from mltrace.rules.builtin import (
    BUILTIN_RULES,
    AdamEpsilonDominance,
    AdamStaleSecondMoment,
    AttentionEntropyCollapse,
    AttentionLogitGrowth,
    GradNormSpike,
    LinearOutputGrowth,
    LossNotDecreasing,
    LossSpike,
    MassiveActivation,
    OutputLogitDrift,
    UpdateRatio,
    WorkerDivergence,
)
from mltrace.stability.windows import (
    EmaZScore,
    SeriesHistory,
    rising_fraction,
    robust_z,
    stack,
    window_mad,
    window_mean_std,
    window_median,
)
from mltrace.trials import create_trial
from tests.support.rule_trials import last_step, write_trial

STEPS = 300
STABILITY_RULES = (LossSpike, GradNormSpike, AttentionLogitGrowth, AttentionEntropyCollapse,
                   OutputLogitDrift, MassiveActivation, LinearOutputGrowth, UpdateRatio,
                   AdamEpsilonDominance, AdamStaleSecondMoment, WorkerDivergence)


# -- helpers ------------------------------------------------------------------------------------
def noisy(seed: int, base, noise: float = 0.05, shape: tuple[int, ...] = ()) -> np.ndarray:
    """``base`` (one value per step) times lognormal noise of ``noise`` (2-5%: a healthy run's
    batch-to-batch jitter), one row per step; ``shape`` adds per-head columns."""
    base = np.asarray(base, dtype=np.float64).reshape(-1, *([1] * len(shape)))
    rng = np.random.default_rng(seed)
    return base * np.exp(rng.normal(0.0, noise, (base.shape[0], *shape)))


def healthy_loss(seed: int = 0, noise: float = 0.03) -> np.ndarray:
    t = np.arange(STEPS)
    return noisy(seed, 3.0 * np.exp(-t / 150) + 1.0, noise)


def trial(tmp_path, series: dict[str, np.ndarray], collections: dict[str, list[str]],
          name: str = "run", edits: dict[tuple[int, str], object] | None = None,
          worker: str = "worker_0", end: int | None = None) -> str:
    """A trial with ``series[name][step]`` at each step (up to ``end``, exclusive), with
    ``edits`` {(step, name): value} (a fault) applied."""
    length = len(next(iter(series.values()))) if end is None else end
    steps = {s: {n: np.asarray(v[s], dtype=np.float32) for n, v in series.items()}
             for s in range(length)}
    for (s, n), value in (edits or {}).items():
        if s < length:
            steps[s][n] = np.asarray(value, dtype=np.float32)
    return write_trial(tmp_path / name, steps, collections=collections, worker=worker)


def run(cls, path, **params):
    rule = cls(create_trial(path), **params)
    return invoke_rule(rule, end_step=last_step(rule.base_trial) + 1)


def fires(first_step: int, cls, path, *texts: str, **params):
    """The rule fires first at ``first_step``, its message holding each of ``texts``."""
    result = run(cls, path, **params)
    assert result.first_step == first_step, (result.fired_steps[:10], result.message)
    assert result.status == "IssuesFound"
    for text in (f"step {first_step}", *texts):
        assert text in result.message, result.message
    return result


def quiet(cls, path, **params):
    result = run(cls, path, **params)
    assert result.fired_steps == [], result.message
    assert result.status == "NoIssuesFound" and result.evaluated_steps > 0
    return result


def rejects(cls, path, parameter: str, value) -> None:
    with pytest.raises(MltraceValueError, match=rf"parameter {parameter}=.*must"):
        cls(create_trial(path), **{parameter: value})


def lacks(cls, path, *texts: str) -> None:
    with pytest.raises(MltraceValueError) as info:
        cls(create_trial(path))
    for text in texts:
        assert text in str(info.value), str(info.value)


@pytest.fixture(scope="module")
def empty(tmp_path_factory) -> str:
    """A trial with a weight and nothing the stability rules read."""
    path = tmp_path_factory.mktemp("empty") / "run"
    return write_trial(path, {0: {"w": np.ones(3)}, 1: {"w": np.ones(3)}},
                       collections={"weights": ["^w$"]})


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> str:
    """One healthy run with every signal: 300 steps, each series with its own realistic,
    seeded noise (the loss 5% from step to step)."""
    series = {"loss": healthy_loss(seed=2, noise=0.05), **grad_norms(seed=3),
              **attention(seed=1), **logits(seed=1), **activations(seed=1), **updates(seed=1),
              **optimizer_state(seed=1)}
    collections = {**LOSSES, **GRAD_NORMS, **ATTENTION, **LOGITS, **ACTIVATIONS, **UPDATES,
                   **OPTIMIZER}
    return trial(tmp_path_factory.mktemp("healthy"), series, collections)


@pytest.mark.parametrize("cls", [c for c in STABILITY_RULES if c is not WorkerDivergence])
def test_every_rule_is_quiet_on_a_healthy_run(healthy, cls):
    quiet(cls, healthy)


def test_every_stability_rule_is_registered_with_documented_defaults():
    for cls in STABILITY_RULES:
        assert BUILTIN_RULES[cls.__name__] is cls
        assert "default" in (cls.__doc__ or ""), cls.__name__


@pytest.mark.parametrize("cls,what", [
    (GradNormSpike, "grad_norms"), (AttentionLogitGrowth, "attention"),
    (AttentionEntropyCollapse, "attention"), (OutputLogitDrift, "logits"),
    (MassiveActivation, "activation_outliers"), (LinearOutputGrowth, "activation_outliers"),
    (UpdateRatio, "updates"), (AdamEpsilonDominance, "optimizer_state"),
    (AdamStaleSecondMoment, "optimizer_state"), (LossSpike, "losses"),
    (WorkerDivergence, "losses"),
])
def test_a_trial_without_the_signals_says_what_to_record(empty, cls, what):
    lacks(cls, empty, f"{cls.__name__} needs", f"['{what}']", "include_collections=['stability']")


# -- LossSpike ------------------------------------------------------------------------------------
LOSSES = {"losses": ["^loss$"]}


def test_loss_spike_fires_on_a_spike_above_six_sigma(tmp_path):
    loss = healthy_loss()
    path = trial(tmp_path, {"loss": loss}, LOSSES, edits={(250, "loss"): loss[249] * 3},
                 end=260)
    fires(250, LossSpike, path, "loss: the loss", "sigmas 6", "last 128 values")
    # min_history: a spike inside the warm-up is not judged; a NaN is
    path = trial(tmp_path, {"loss": loss}, LOSSES, "early",
                 edits={(5, "loss"): 50.0, (9, "loss"): math.nan}, end=20)
    fires(9, LossSpike, path, "the loss is nan")


def test_loss_spike_fires_above_ten_times_the_largest_loss(tmp_path):
    loss = healthy_loss()
    path = trial(tmp_path, {"loss": loss}, LOSSES, edits={(200, "loss"): 45.0}, end=210)
    fires(200, LossSpike, path, "max_factor 10", sigmas="1e9")
    quiet(LossSpike, path, sigmas=1e9, max_factor="20")


def test_loss_spike_is_quiet_on_a_loss_with_little_noise(tmp_path):
    quiet(LossSpike, trial(tmp_path, {"loss": healthy_loss(seed=1, noise=0.02)}, LOSSES))


def test_loss_spike_parameters(healthy):
    rejects(LossSpike, healthy, "sigmas", "0")
    rejects(LossSpike, healthy, "window", "1")
    rejects(LossSpike, healthy, "max_factor", 0.5)
    rejects(LossSpike, healthy, "min_history", 1)
    with pytest.raises(MltraceValueError, match="min_history=200 must lie in"):
        LossSpike(create_trial(healthy), min_history="200")
    rule = LossSpike(create_trial(healthy), sigmas="4.5", window="64", min_history="8")
    assert (rule.sigmas, rule.window, rule.min_history, rule.max_factor) == (4.5, 64, 8, 10.0)


def test_loss_spike_out_of_order_gives_the_in_order_answer(tmp_path):
    loss = healthy_loss()
    path = trial(tmp_path, {"loss": loss}, LOSSES, edits={(150, "loss"): 60.0}, end=160)
    in_order = fires(150, LossSpike, path, "max_factor", sigmas=1e9)
    rule = LossSpike(create_trial(path), sigmas=1e9)
    rule.invoke(100)  # quiet
    with pytest.raises(RuleEvaluationConditionMet):
        rule.invoke(150)
    assert rule.last_message == in_order.message
    rule.invoke(40)  # earlier again: the running maximum is rebuilt, still quiet
    with pytest.raises(RuleEvaluationConditionMet):
        rule.invoke(150)


def test_loss_spike_keeps_each_mode_apart(tmp_path):
    """EVAL losses (higher, every 10th step) are judged against EVAL losses only."""
    train, steps, modes = healthy_loss(seed=3), {}, {}
    for s in range(STEPS):
        evaluating = s % 10 == 9
        steps[s] = {"loss": train[s] * (2.5 if evaluating else 1.0)}
        modes[s] = "eval" if evaluating else "train"
    path = write_trial(tmp_path / "modes", steps, modes=modes, collections=LOSSES)
    quiet(LossSpike, path, min_history=8)


def test_rules_read_each_value_once_in_order(tmp_path, monkeypatch):
    from mltrace.trials.tensor import Tensor

    reads: list[tuple[str, int]] = []
    original = Tensor.value

    def counted(self, step_num, *args, **kwargs):
        reads.append((self.name, step_num))
        return original(self, step_num, *args, **kwargs)

    monkeypatch.setattr(Tensor, "value", counted)
    path = trial(tmp_path, {"loss": healthy_loss()}, LOSSES, end=200)
    run(LossSpike, path, window=64)
    assert sorted(reads) == [("loss", s) for s in range(200)]


# -- GradNormSpike ---------------------------------------------------------------------------------
GRAD_NORMS = {"grad_norms": ["^grad_norm/"]}
PARAMS = ("GPT_blocks.0.attn.c_attn.weight", "GPT_blocks.1.mlp.c_fc.weight")


def grad_norms(seed: int = 0) -> dict[str, np.ndarray]:
    t = np.arange(STEPS)
    decay = 1.5 * np.exp(-t / 200) + 0.5
    series = {f"grad_norm/{p}": noisy(seed + i, decay * (i + 1), 0.1) for i, p in enumerate(PARAMS)}
    series["grad_norm/GPT"] = np.sqrt(sum(v ** 2 for v in series.values()))
    return series


def test_grad_norm_spike_names_the_parameter_and_layer(tmp_path):
    series = grad_norms()
    name = f"grad_norm/{PARAMS[1]}"
    path = trial(tmp_path, series, GRAD_NORMS, edits={(150, name): series[name][150] * 30},
                 end=160)
    fires(150, GradNormSpike, path, name, "parameter GPT_blocks.1.mlp.c_fc.weight",
          "layer blocks.1", "z_threshold 6", "layer_min_ratio 20")
    quiet(GradNormSpike, path, per_layer="false", min_ratio=20)  # the global norm rose less
    path = trial(tmp_path, series, GRAD_NORMS, "x8", edits={(150, name): series[name][150] * 8},
                 end=160)
    quiet(GradNormSpike, path)  # 8x: within one parameter's noise (SpikeBench's healthy 15.5x)
    fires(150, GradNormSpike, path, name, "layer_min_ratio 4", layer_min_ratio=4)
    path = trial(tmp_path, series, GRAD_NORMS, "inf", edits={(3, "grad_norm/GPT"): np.inf},
                 end=10)
    fires(3, GradNormSpike, path, "grad_norm/GPT (model GPT, all parameters)", "is inf")


def test_grad_norm_spike_needs_both_the_z_score_and_the_ratio(tmp_path):
    series = grad_norms()
    steady = np.full(STEPS, 2.0) * (1 + 1e-4 * np.sin(np.arange(STEPS)))
    series["grad_norm/GPT"] = steady
    path = trial(tmp_path, series, GRAD_NORMS, edits={(100, "grad_norm/GPT"): 2.6}, end=110)
    quiet(GradNormSpike, path)  # a huge z-score, but only 1.3x the mean
    fires(100, GradNormSpike, path, "grad_norm/GPT", min_ratio="1.2")


def test_grad_norm_spike_parameters(healthy):
    rejects(GradNormSpike, healthy, "z_threshold", "-1")
    rejects(GradNormSpike, healthy, "min_ratio", 0.5)
    rejects(GradNormSpike, healthy, "layer_min_ratio", 0.5)
    rejects(GradNormSpike, healthy, "alpha", "1")
    rejects(GradNormSpike, healthy, "min_history", 0)


def test_grad_norm_spike_out_of_order_rebuilds_the_ema(tmp_path):
    series = grad_norms()
    path = trial(tmp_path, series, GRAD_NORMS,
                 edits={(60, "grad_norm/GPT"): 40.0, (200, "grad_norm/GPT"): 40.0}, end=210)
    in_order = run(GradNormSpike, path)
    assert in_order.fired_steps == [60, 200]
    rule = GradNormSpike(create_trial(path))
    with pytest.raises(RuleEvaluationConditionMet):
        rule.invoke(200)
    first = rule.last_message
    rule.invoke(199)  # earlier: rebuilt from the first step, quiet
    with pytest.raises(RuleEvaluationConditionMet):
        rule.invoke(200)
    assert rule.last_message == first and "step 200" in first


# -- attention -------------------------------------------------------------------------------------
ATTENTION = {"attention": ["^attention/"]}
MODULES = ("blocks.0.attn", "blocks.1.attn")
HEADS = 4


def attention(seed: int = 0) -> dict[str, np.ndarray]:
    t = np.arange(STEPS)
    series = {}
    for i, module in enumerate(MODULES):
        series[f"attention/{module}/max_logit"] = noisy(seed + i, 8 + 4 * t / STEPS, 0.05, (HEADS,))
        series[f"attention/{module}/entropy"] = noisy(seed + 10 + i, 2.5 - t / STEPS, 0.05, (HEADS,))
    return series


def with_head(series, name, step, head, value):
    row = np.array(series[name][step])
    row[head] = value
    return {(step, name): row}


def test_attention_logit_growth_names_module_layer_and_head(tmp_path):
    series = attention()
    name = "attention/blocks.1.attn/max_logit"
    path = trial(tmp_path, series, ATTENTION, edits=with_head(series, name, 120, 2, 60.0),
                 end=130)
    result = fires(120, AttentionLogitGrowth, path, f"{name} head 2", "module blocks.1.attn",
                   "layer blocks.1", "growth_factor 4", "median")
    rule = AttentionLogitGrowth(create_trial(path))  # out of order: the window read from the trial
    with pytest.raises(RuleEvaluationConditionMet):
        rule.invoke(120)
    assert rule.last_message == result.message
    # above tau from the first step, whatever the history
    path = trial(tmp_path, series, ATTENTION, "tau", edits=with_head(series, name, 2, 3, 150.0),
                 end=20)
    fires(2, AttentionLogitGrowth, path, f"{name} head 3", "above max_logit 100")
    quiet(AttentionLogitGrowth, path, max_logit="200")


def test_attention_entropy_collapse(tmp_path):
    series = attention()
    name = "attention/blocks.0.attn/entropy"
    edits = with_head(series, name, 200, 1, 0.01)
    path = trial(tmp_path, series, ATTENTION, edits=edits, end=210)
    fires(200, AttentionEntropyCollapse, path, f"{name} head 1", "layer blocks.0",
          "below min_entropy 0.05")
    path = trial(tmp_path, series, ATTENTION, "drop", edits=with_head(series, name, 150, 0, 0.3),
                 end=160)
    fires(150, AttentionEntropyCollapse, path, f"{name} head 0", "drop_fraction 0.25")
    # a head that has always been near one-hot is not a collapse
    series[name][:, 3] = 0.02 * np.exp(np.random.default_rng(5).normal(0, 0.05, STEPS))
    quiet(AttentionEntropyCollapse, trial(tmp_path, series, ATTENTION, "sink", end=200))


def test_attention_rules_parameters(healthy):
    rejects(AttentionLogitGrowth, healthy, "max_logit", 0)
    rejects(AttentionLogitGrowth, healthy, "growth_factor", "1")
    rejects(AttentionLogitGrowth, healthy, "window", 1)
    rejects(AttentionEntropyCollapse, healthy, "min_entropy", "-0.1")
    rejects(AttentionEntropyCollapse, healthy, "drop_fraction", 1.5)


# -- OutputLogitDrift ------------------------------------------------------------------------------
LOGITS = {"logits": ["^logits/"]}


def logits(seed: int = 0) -> dict[str, np.ndarray]:
    t = np.arange(STEPS)
    log_z = 10.8 - 2 * t / STEPS
    return {"logits/GPT/log_z_mean": noisy(seed, log_z, 0.01),
            "logits/GPT/log_z_max": noisy(seed + 1, log_z + 3, 0.02),
            "logits/GPT/max": noisy(seed + 2, 12 + 0 * t, 0.05),
            "logits/GPT/entropy": noisy(seed + 3, 5 - 2 * t / STEPS, 0.02)}


def test_output_logit_drift(tmp_path):
    series = logits()
    path = trial(tmp_path, series, LOGITS, edits={(180, "logits/GPT/log_z_mean"): 16.5},
                 end=190)
    fires(180, OutputLogitDrift, path, "logits/GPT/log_z_mean (model GPT)", "max_drift 5")
    path = trial(tmp_path, series, LOGITS, "max", edits={(7, "logits/GPT/log_z_max"): -61.0},
                 end=20)
    fires(7, OutputLogitDrift, path, "logits/GPT/log_z_max", "max_log_z 50")
    path = trial(tmp_path, series, LOGITS, "nan", edits={(40, "logits/GPT/max"): math.nan},
                 end=50)
    fires(40, OutputLogitDrift, path, "logits/GPT/max", "nan")


def test_output_logit_drift_parameters(healthy):
    rejects(OutputLogitDrift, healthy, "max_drift", "0")
    rejects(OutputLogitDrift, healthy, "max_log_z", -5)
    rejects(OutputLogitDrift, healthy, "min_history", "101")


# -- MassiveActivation / LinearOutputGrowth --------------------------------------------------------
ACTIVATIONS = {"activation_outliers": ["^activations/"]}


def activations(seed: int = 0, ratio: bool = True) -> dict[str, np.ndarray]:
    t = np.arange(STEPS)
    series = {}
    for i, module in enumerate(("blocks.0.mlp", "blocks.1.mlp")):
        abs_max = noisy(seed + i, 8 + 4 * t / STEPS, 0.05)
        median = noisy(seed + 5 + i, 0.5 + 0 * t, 0.03)
        series[f"activations/{module}/abs_max"] = abs_max
        series[f"activations/{module}/abs_median"] = median
        if ratio:
            series[f"activations/{module}/max_over_median"] = abs_max / median
    for i, module in enumerate(("blocks.0.attn.c_attn", "blocks.0.mlp.c_fc")):
        series[f"activations/{module}/l2"] = noisy(seed + 20 + i, 50 + 20 * t / STEPS, 0.05)
    return series


def test_massive_activation(tmp_path):
    name = "activations/blocks.1.mlp/abs_max"
    for ratio in (True, False):  # max_over_median saved, or computed from abs_median
        series = activations(ratio=ratio)
        edits = {(30, name): 2000.0, (31, name): 300.0}  # 4000x the median; then 600x only
        if ratio:
            edits.update({(30, name.replace("abs_max", "max_over_median")): 4000.0,
                          (31, name.replace("abs_max", "max_over_median")): 600.0})
        path = trial(tmp_path, series, ACTIVATIONS, f"run{ratio}", edits=edits, end=40)
        result = fires(30, MassiveActivation, path, name, "module blocks.1.mlp", "layer blocks.1",
                       "min_abs 100", "ratio 1000")
        assert result.fired_steps == [30]
    path = trial(tmp_path, activations(), ACTIVATIONS, "nan", edits={(12, name): np.inf}, end=20)
    fires(12, MassiveActivation, path, name, "is inf")


def test_linear_output_growth_jump_and_steady_growth(tmp_path):
    series = activations()
    name = "activations/blocks.0.attn.c_attn/l2"
    path = trial(tmp_path, series, ACTIVATIONS, edits={(150, name): 900.0}, end=160)
    fires(150, LinearOutputGrowth, path, name, "layer blocks.0", "jump_factor 10")
    growing = series[name].copy()
    growing[150:] = growing[149] * 1.03 ** np.arange(1, STEPS - 149)
    series[name] = growing
    result = run(LinearOutputGrowth, trial(tmp_path, series, ACTIVATIONS, "growth", end=260))
    assert 225 <= result.first_step <= 250, result.message  # 90% of a 100-step window rising
    assert "rose in" in result.message and "growth_factor 3" in result.message


def test_activation_rules_parameters(healthy):
    rejects(MassiveActivation, healthy, "min_abs", 0)
    rejects(MassiveActivation, healthy, "ratio", "1")
    rejects(LinearOutputGrowth, healthy, "jump_factor", 0.9)
    rejects(LinearOutputGrowth, healthy, "growth_fraction", "0")
    rejects(LinearOutputGrowth, healthy, "growth_fraction", 1.1)
    rejects(LinearOutputGrowth, healthy, "growth_factor", 1)


# -- UpdateRatio / AdamEpsilonDominance / AdamStaleSecondMoment -----------------------------------
UPDATES = {"updates": ["^updates/"]}
OPTIMIZER = {"optimizer_state": ["^optimizer_state/"]}
WEIGHT, BIAS = "GPT_blocks.0.attn.c_attn.weight", "GPT_blocks.0.attn.c_attn.bias"


def updates(seed: int = 0) -> dict[str, np.ndarray]:
    t = np.arange(STEPS)
    bias_ratio = np.concatenate([[np.inf], 1.0 / t[1:]])  # a bias initialised at zero
    return {f"updates/{WEIGHT}/ratio": noisy(seed, 1e-3 + 0 * t, 0.2),
            f"updates/{WEIGHT}/l2": noisy(seed + 1, 0.05 + 0 * t, 0.2),
            f"updates/{BIAS}/ratio": bias_ratio,
            f"updates/{BIAS}/l2": noisy(seed + 2, 1e-3 + 0 * t, 0.2)}


def test_update_ratio(tmp_path):
    series = updates()
    name = f"updates/{WEIGHT}/ratio"
    path = trial(tmp_path, series, UPDATES, edits={(120, name): 0.05}, end=130)
    fires(120, UpdateRatio, path, name, "parameter GPT_blocks.0.attn.c_attn.weight",
          "layer blocks.0", "jump_factor 20")
    path = trial(tmp_path, series, UPDATES, "max", edits={(220, name): 0.5}, end=230)
    fires(220, UpdateRatio, path, name, "above jump_factor 20")
    fires(220, UpdateRatio, path, name, "above max_ratio 0.1", max_ratio=0.1)
    edits = {(3, name): math.nan, (3, f"updates/{WEIGHT}/l2"): math.nan}
    fires(3, UpdateRatio, trial(tmp_path, series, UPDATES, "nan", edits=edits, end=10), name, "nan")


def test_update_ratio_parameters(healthy):
    rejects(UpdateRatio, healthy, "max_ratio", 0)
    rejects(UpdateRatio, healthy, "jump_factor", "1")
    rejects(UpdateRatio, healthy, "min_history", "51")


def optimizer_state(seed: int = 0) -> dict[str, np.ndarray]:
    t = np.arange(STEPS)
    out = {}
    for i, param in enumerate((WEIGHT, "GPT_blocks.2.mlp.c_proj.weight")):
        out[f"optimizer_state/{param}/eps_fraction"] = noisy(seed + i, 0.01 + 0 * t, 0.3)
        out[f"optimizer_state/{param}/grad_sq_ratio"] = noisy(seed + 5 + i, 1 + 0 * t, 0.3)
    return out


def test_adam_epsilon_dominance_needs_patience(tmp_path):
    name = "optimizer_state/GPT_blocks.2.mlp.c_proj.weight/eps_fraction"
    edits = {(50, name): 0.9, **{(s, name): 0.8 for s in range(100, 110)}}
    path = trial(tmp_path, optimizer_state(), OPTIMIZER, edits=edits, end=120)
    fires(102, AdamEpsilonDominance, path, name, "layer blocks.2", "max_fraction 0.5",
          "3 consecutive")
    fires(50, AdamEpsilonDominance, path, name, patience="1")
    fires(109, AdamEpsilonDominance, path, name, patience=10)


def test_adam_stale_second_moment(tmp_path):
    name = f"optimizer_state/{WEIGHT}/grad_sq_ratio"
    stale = {(s, name): 0.003 for s in range(100, 200)}
    path = trial(tmp_path, optimizer_state(), OPTIMIZER, edits={**stale, (200, name): 30.0},
                 end=210)
    result = fires(102, AdamStaleSecondMoment, path, name, "layer blocks.0", "went stale",
                   "below stale_ratio 0.01 on 3 steps running")
    assert result.fired_steps == [102, 200]  # gone stale (once), then the spike
    spike = invoke_rule(AdamStaleSecondMoment(create_trial(path)), start_step=200, end_step=201)
    assert "spike_ratio 10" in spike.message and "v was stale" in spike.message
    result = fires(102, AdamStaleSecondMoment, path, name, "went stale", warn_stale="true")
    assert result.fired_steps == [102, *range(149, 201)]  # gone stale, stayed stale, the spike
    result = fires(100, AdamStaleSecondMoment, path, name, "went stale", patience=1)
    assert result.fired_steps == [100, 200]


def test_adam_rules_parameters(healthy):
    quiet(AdamStaleSecondMoment, healthy, warn_stale=True)
    rejects(AdamEpsilonDominance, healthy, "max_fraction", "1")
    rejects(AdamEpsilonDominance, healthy, "patience", 0)
    rejects(AdamStaleSecondMoment, healthy, "stale_ratio", 0)
    rejects(AdamStaleSecondMoment, healthy, "spike_ratio", "0.001")
    with pytest.raises(MltraceValueError, match="warn_stale"):
        AdamStaleSecondMoment(create_trial(healthy), warn_stale="maybe")


# -- WorkerDivergence ------------------------------------------------------------------------------
WORKERS = ("worker_0", "worker_1", "worker_2", "worker_3")


def workers_trial(tmp_path, name: str = "run", faults=None, level=None,
                  end: int | None = None) -> str:
    """Four data-parallel workers: each its own loss (its own batches' noise), and the global
    grad norm, which DDP's all-reduce makes the same on every worker but for float rounding;
    ``faults`` {(step, worker, tensor): value}; ``level`` {worker: factor} on that worker's
    loss."""
    t = np.arange(STEPS)
    shared = noisy(40, 1.5 * np.exp(-t / 200) + 0.5, 0.1)
    for k, worker in enumerate(WORKERS):
        loss = healthy_loss(seed=30 + k) * (level or {}).get(worker, 1.0)
        norm = noisy(50 + k, shared, 1e-6)
        edits = {(s, n): v for (s, w, n), v in (faults or {}).items() if w == worker}
        trial(tmp_path, {"loss": loss, "grad_norm/GPT": norm},
              {"losses": ["^loss$"], "grad_norms": ["^grad_norm/"]}, name, edits, worker, end)
    return str(tmp_path / name)


def test_worker_divergence_names_the_worker(tmp_path):
    path = workers_trial(tmp_path, faults={(150, "worker_2", "loss"): 5.0}, end=160)
    fires(150, WorkerDivergence, path, "loss of worker worker_2", "median", "rel_threshold 0.2",
          "z_threshold 6")
    path = workers_trial(tmp_path, "norm", faults={(90, "worker_1", "grad_norm/GPT"): 9.0,
                                                   (95, "worker_3", "loss"): math.inf}, end=100)
    fires(90, WorkerDivergence, path, "grad_norm/GPT of worker worker_1")
    fires(95, WorkerDivergence, path, "loss of worker worker_3 is inf", grad_norms="false")


def test_worker_divergence_is_quiet_on_healthy_workers_and_on_a_steady_offset(tmp_path):
    quiet(WorkerDivergence, workers_trial(tmp_path))
    # one worker's shard has a 60% higher loss all along: different, but not diverging
    quiet(WorkerDivergence, workers_trial(tmp_path, "offset", level={"worker_3": 1.6}))


def test_worker_divergence_needs_every_worker_and_checks_parameters(tmp_path):
    one = trial(tmp_path, {"loss": healthy_loss()[:20]}, LOSSES, "one")
    lacks(WorkerDivergence, one, "one worker's values", "include_workers='all'")
    path = workers_trial(tmp_path, end=20)
    rejects(WorkerDivergence, path, "rel_threshold", "0")
    rejects(WorkerDivergence, path, "z_threshold", -1)
    rejects(WorkerDivergence, path, "epsilon", 0)


# -- LossNotDecreasing(noise_aware=True) ----------------------------------------------------------
def test_loss_not_decreasing_noise_aware_ignores_batch_noise(tmp_path):
    path = trial(tmp_path, {"loss": healthy_loss(seed=8, noise=0.03)}, LOSSES)
    assert run(LossNotDecreasing, path, num_steps=20).fired_steps  # smdebug's test: noise fires
    result = quiet(LossNotDecreasing, path, num_steps=20, noise_aware="True")
    assert result.parameters["window"] == 20
    quiet(LossNotDecreasing, path, num_steps=10, noise_aware=True, window=50)
    stalled = healthy_loss(seed=8)  # stops going down at step 150, then creeps up
    stalled[150:] = 1.9 * (1 + 0.002 * np.arange(150)) * np.exp(
        np.random.default_rng(9).normal(0, 0.03, 150))
    path = trial(tmp_path, {"loss": stalled}, LOSSES, "stalled")
    result = run(LossNotDecreasing, path, num_steps=20, noise_aware=True)
    assert result.fired_steps and 150 < result.first_step <= 200, result.fired_steps
    assert "the median of its last 20 values is" in result.message
    rejects(LossNotDecreasing, path, "window", 0)
    with pytest.raises(MltraceValueError, match="noise_aware"):
        LossNotDecreasing(create_trial(path), noise_aware="sometimes")


# -- windows ---------------------------------------------------------------------------------------
def test_series_history_keeps_the_newest_values_and_window_statistics():
    history = SeriesHistory(keep=5)
    for step, value in [(0, 1.0), (2, 3.0), (1, 2.0), (3, 10.0), (4, np.nan), (5, 4.0)]:
        history.add(step, value)
    assert [s for s in range(6) if s in history] == [1, 2, 3, 4, 5] and history.get(0) is None
    before_4 = stack([history.get(s) for s in (1, 2, 3)])
    mean, std = window_mean_std(before_4)
    assert mean[0] == pytest.approx(5.0) and std[0] == pytest.approx(np.std([2, 3, 10], ddof=1))
    before_6 = stack([history.get(s) for s in (1, 2, 3, 4, 5)])
    assert window_median(before_6)[0] == pytest.approx(3.5)  # NaN left out: 2, 3, 4, 10
    assert window_mad(before_6)[0] == pytest.approx(1.0)
    heads = stack([[1.0, 5.0], [2.0, np.inf], [3.0, 7.0]])
    assert np.allclose(window_median(heads), [2.0, 6.0])
    assert np.allclose(window_mad(heads), [1.0, 1.0])
    assert np.isnan(window_mean_std(stack([[1.0]]))[1][0])  # one value: no deviation
    with pytest.raises(ValueError):
        stack([[1.0, 2.0], [1.0]])


def test_robust_z_and_rising_fraction():
    window = stack([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 50.0])  # one outlier barely moves it
    assert robust_z(1.0, window)[0] == pytest.approx(0.0)
    assert robust_z(2.0, window)[0] > 6
    constant = stack([2.0] * 5)
    assert robust_z(3.0, constant)[0] == math.inf and robust_z(1.0, constant)[0] == -math.inf
    assert robust_z(2.0, constant)[0] == 0.0 and np.isnan(robust_z(np.nan, constant)[0])
    assert rising_fraction(stack([1.0, 2.0, 3.0, 2.5, 4.0]))[0] == pytest.approx(0.75)


def test_ema_z_score_warms_up_then_follows_zclip():
    ema = EmaZScore(alpha=0.5, warmup=3)
    for x in (1.0, 2.0, math.nan, 3.0):
        assert not ema.ready and math.isnan(ema.z(x))
        ema.update(x)
    assert ema.ready and ema.mean == pytest.approx(2.0) and ema.var == pytest.approx(2 / 3)
    assert ema.z(3.0) == pytest.approx(1 / math.sqrt(2 / 3))
    ema.update(4.0)
    assert ema.mean == pytest.approx(3.0) and ema.var == pytest.approx(0.5 * 2 / 3 + 0.5)
    with pytest.raises(ValueError):
        EmaZScore(alpha=1.0)
