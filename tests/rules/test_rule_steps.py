"""One step axis in rule messages: the number after "step" is the global step (the TensorBoard
tab's x axis, MLflow's metric step, RuleResult.first_step), the mode's own step beside it."""

from __future__ import annotations

import numpy as np

from mltrace.modes import ModeKeys
from mltrace.rules import Rule, invoke_rule
from mltrace.rules.builtin.exploding_tensor import ExplodingTensor
from mltrace.rules.builtin.loss_not_decreasing import LossNotDecreasing
from mltrace.trials import create_trial
from tests.support.rule_trials import write_trial

MODES = {s: ("train" if s < 5 else "eval") for s in range(9)}  # TRAIN 0..4, then EVAL 0..3 at 5..8


class _Noop(Rule):
    def invoke_at_step(self, step: int) -> bool:
        return False


def test_step_label_names_the_global_step_and_the_mode_step(tmp_path):
    trial = create_trial(write_trial(tmp_path / "run", {s: {"loss": np.float32(1.0)} for s in range(9)},
                                     modes=MODES))
    rule = _Noop(trial)
    assert rule.step_label(6) == "step 6 (EVAL step 1)"
    assert rule.step_label(1, ModeKeys.EVAL) == "step 6 (EVAL step 1)"
    assert rule.step_label(3) == "step 3 (TRAIN step 3)"
    assert rule.step_label(40, ModeKeys.EVAL) == "EVAL step 40"  # no such step: said as it is
    plain = _Noop(create_trial(write_trial(tmp_path / "plain", {0: {"loss": np.float32(1.0)}})))
    assert plain.step_label(0) == "step 0"  # GLOBAL mode: global and mode step are one


def test_messages_agree_with_first_step(tmp_path):
    steps = {s: {"gradient/w": np.ones(3), "loss": np.float32(1.0)} for s in range(9)}
    steps[6]["gradient/w"] = np.array([1.0, np.nan, 1.0])
    trial = create_trial(write_trial(tmp_path / "run", steps, modes=MODES,
                                     collections={"gradients": ["gradient/w"], "losses": ["loss"]}))
    result = invoke_rule(ExplodingTensor(trial), end_step=9)
    assert result.first_step == 6 and "holds NaN at step 6 (EVAL step 1)" in result.message
    flat = invoke_rule(LossNotDecreasing(trial, mode="eval", num_steps=2), end_step=9)
    assert flat.first_step == 7  # EVAL step 2 compared with EVAL step 0
    assert "at step 7 (EVAL step 2), 1 at step 5 (EVAL step 0)" in flat.message
