"""The rules engine: seed rules as written, invoke_rule, the CLI, live rules and actions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mltrace.pytorch as smd
from mltrace.exceptions import NoMoreData, RuleEvaluationConditionMet, TensorUnavailable
from mltrace.rules import Rule, invoke_rule
from mltrace.rules.results import read_results
from mltrace.trials import create_trial
from tests.support.torch_training import make_model, train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULE_FILE = os.path.join(REPO, "tests", "data", "my_custom_rule.py")


@pytest.fixture(scope="module")
def trial_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("rules") / "run"
    model = make_model()
    hook = smd.Hook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=2),
                    include_collections=["weights", "gradients", "losses"])
    hook.register_module(model)
    train(model, hook, 10)
    hook.close()
    return str(out)


class CustomGradientRule(Rule):
    """Seed 001's rule, verbatim but for the import."""

    def __init__(self, base_trial, threshold=10.0):
        super().__init__(base_trial, other_trials=None)
        self.threshold = float(threshold)

    def invoke_at_step(self, step):
        for tensor in self.base_trial.tensors_in_collection('gradients'):
            abs_mean = tensor.reduction_value(step, 'mean', abs=True)
            if abs_mean > self.threshold:
                return True
        return False


class SmdebugStyleRule(Rule):
    """smdebug 1.0.34's constructor: Rule(base_trial, action_str, other_trials)."""

    def __init__(self, base_trial, other_trials=None):
        super().__init__(base_trial, "", other_trials)
        self.seen = []

    def invoke_at_step(self, step):
        self.seen.append(step)
        return False


def test_seed_001_rule_runs_as_written(trial_dir):
    trial = create_trial(trial_dir)
    result = invoke_rule(CustomGradientRule(trial, threshold="0.0"), end_step=9)
    assert result.fired_steps == [0, 2, 4, 6, 8] and result.first_step == 0
    quiet = invoke_rule(CustomGradientRule(trial, threshold=1e9), end_step=9)
    assert quiet.fired_steps == [] and quiet.evaluated_steps == 5 and quiet.status == "NoIssuesFound"
    with pytest.raises(RuleEvaluationConditionMet) as info:
        invoke_rule(CustomGradientRule(trial, threshold=0.0), start_step=3, raise_eval_cond=True)
    assert info.value.step == 4 and info.value.rule_name == "CustomGradientRule"


def test_unbounded_invocation_ends_with_no_more_data(trial_dir):
    trial = create_trial(trial_dir)
    rule = SmdebugStyleRule(trial, other_trials=[create_trial(trial_dir)])
    assert len(rule.other_trials) == 1 and rule.action_str == ""
    with pytest.raises(NoMoreData):
        invoke_rule(rule)
    assert rule.seen == [0, 2, 4, 6, 8]  # saved steps only; the rest are skipped


def test_rule_results_are_written_into_the_trial(trial_dir):
    trial = create_trial(trial_dir)
    before = len(read_results(trial.storage))
    invoke_rule(CustomGradientRule(trial, threshold=0.0), end_step=5)
    results = read_results(trial.storage)
    assert len(results) == before + 1
    last = results[-1]
    assert (last.rule, last.status, last.fired_steps, last.parameters) == (
        "CustomGradientRule", "IssuesFound", [0, 2, 4], {"threshold": 0.0})


def test_required_tensors_by_name_tensor_and_regex(trial_dir):
    trial = create_trial(trial_dir)

    class Needs(Rule):
        def set_required_tensors(self, step):
            self.req_tensors.add(trial.tensor("Sequential_0.weight"), steps=[step])
            self.req_tensors.add("^gradient/.*bias$", steps=[step], should_match_regex=True)

        def invoke_at_step(self, step):
            self.names = self.req_tensors.get_names()
            self.steps = self.req_tensors.get_tensor_steps()
            return all(np.isfinite(t.value(step)).all() for t in self.req_tensors.get())

    rule = Needs(trial)
    with pytest.raises(RuleEvaluationConditionMet):
        rule.invoke(2)
    assert rule.names == ["Sequential_0.weight", "gradient/Sequential_0.bias", "gradient/Sequential_2.bias"]
    assert rule.steps["Sequential_0.weight"] == [2]
    with pytest.raises(TensorUnavailable):
        rule.req_tensors.add("no_such_tensor", steps=[0])


def _cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "mltrace.rules.rule_invoker", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_cli_with_a_custom_rule_file_and_string_parameters(trial_dir):
    fired = _cli("--trial-dir", trial_dir, "--rule-file", RULE_FILE, "--rule-name", "CustomGradientRule",
                 "--threshold", "0.0")
    assert fired.returncode == 1, fired.stderr
    assert "IssuesFound" in fired.stdout and "fired at steps 0, 2, 4, 6, 8" in fired.stdout
    quiet = _cli("--trial-dir", trial_dir, "--rule-file", RULE_FILE, "--rule-name", "CustomGradientRule",
                 "--threshold", "1e9")
    assert quiet.returncode == 0 and "NoIssuesFound" in quiet.stdout
    raised = _cli("--trial-dir", trial_dir, "--rule-file", RULE_FILE, "--rule-name", "CustomGradientRule",
                  "--threshold", "0", "--raise-rule-eval-cond-exception")
    assert raised.returncode != 0 and "RuleEvaluationConditionMet" in raised.stderr


def test_cli_errors_name_the_valid_choices(trial_dir):
    unknown = _cli("--trial-dir", trial_dir, "--rule-name", "NoSuchRule")
    assert unknown.returncode == 2 and "VanishingGradient" in unknown.stderr
    bad_param = _cli("--trial-dir", trial_dir, "--rule-name", "VanishingGradient", "--treshold", "1")
    assert bad_param.returncode == 2 and "threshold" in bad_param.stderr
    missing = _cli("--trial-dir", trial_dir + "-missing", "--rule-name", "VanishingGradient", "--wait", "0.2")
    assert missing.returncode == 2 and "no trial data" in missing.stderr


def test_cli_rules_spec_shaped_like_sagemakers(trial_dir, tmp_path):
    spec = [{
        "RuleName": "CustomGradientRule",
        "SourceS3Uri": RULE_FILE,
        "InstanceType": "ml.c5.4xlarge",
        "VolumeSizeInGB": 10,
        "RuntimeConfigurations": {"threshold": "0.0", "start-step": "4", "end-step": "7",
                                  "logging-level": "WARNING"},
    }, {"RuleName": "VanishingGradient", "RuntimeConfigurations": {"threshold": "1e-30"}}]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    out = _cli("--trial-dir", trial_dir, "--rules-spec", str(path))
    assert out.returncode == 1, out.stderr
    assert "fired at steps 4, 6" in out.stdout
    assert "VanishingGradient: NoIssuesFound" in out.stdout
    assert "InstanceType" in out.stderr and "ignored" in out.stderr


LIVE_TRAINING = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {repo!r})
    import mltrace.pytorch as smd
    from mltrace.exceptions import StopTrainingRequested
    from tests.support.torch_training import make_model
    model = make_model()
    hook = smd.Hook(out_dir={out!r}, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients"], stop_check_interval=0.1)
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr={lr})
    try:
        for step in range({steps}):
            opt.zero_grad()
            model(torch.ones(8, 4)).pow(2).mean().backward()
            opt.step()
            time.sleep({pause})
        print("finished all steps")
    except StopTrainingRequested as exc:
        print("stopped:", exc)
    hook.close()
""")


def test_live_rule_follows_training_until_the_end_marker(tmp_path):
    out = str(tmp_path / "live")
    proc = subprocess.Popen([sys.executable, "-c", LIVE_TRAINING.format(
        repo=REPO, out=out, lr=0.01, steps=8, pause=0.2)], stdout=subprocess.PIPE, text=True)
    try:
        rule = SmdebugStyleRule(create_trial(out, timeout=30))
        with pytest.raises(NoMoreData):
            invoke_rule(rule)
        assert rule.seen == list(range(8))
    finally:
        proc.wait(timeout=60)


def test_stop_training_action_ends_the_loop_with_data_intact(tmp_path):
    out = str(tmp_path / "stop")
    proc = subprocess.Popen([sys.executable, "-c", LIVE_TRAINING.format(
        repo=REPO, out=out, lr=0.0, steps=400, pause=0.02)], stdout=subprocess.PIPE, text=True)
    try:
        trial = create_trial(out, timeout=30)

        class AfterStep3(Rule):
            def invoke_at_step(self, step):
                self.last_message = "enough"
                return step >= 3

        rule = AfterStep3(trial, action_str='{"name": "StopTraining"}')
        with pytest.raises(RuleEvaluationConditionMet):
            invoke_rule(rule, raise_eval_cond=True)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert "stopped: rule AfterStep3 asked training to stop" in stdout
    finished = create_trial(out)
    assert finished.loaded_all_steps
    last = finished.steps()[-1]
    assert 3 <= last < 399
    for step in finished.steps():
        assert finished.tensor("Sequential_0.weight").value(step).shape == (8, 4)
