"""Built-in rules from the command line: parameters arrive as strings, other trials as paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from mltrace.rules.rule_invoker import main
from tests.support.rule_trials import write_trial

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _losses(path, values, interval=4):
    steps = {i * interval: {"loss_0": v} for i, v in enumerate(values)}
    return write_trial(path, steps, collections={"losses": ["^loss"]})


def test_cli_string_parameters(tmp_path, capsys):
    path = _losses(tmp_path / "run", [0.3, 0.33, 0.31, 0.30, 0.28])
    code = main(["--trial-dir", path, "--rule-name", "lossnotdecreasing", "--num_steps", "10",
                 "--diff_percent", "0", "--use_losses_collection", "True", "--mode", "global"])
    out = capsys.readouterr().out
    assert code == 1 and "fired at steps 12" in out and "loss_0 (GLOBAL) is 0.3 at step 12" in out
    # The next check would be 22 steps in: with num_steps=20 nothing fires in 17 steps.
    assert main(["--trial-dir", path, "--rule-name", "LossNotDecreasing", "--num-steps=20"]) == 0
    steps = {0: {"w": np.ones(4)}, 1: {"w": np.array([0.0, 0.0, 0.0, 1.0])}}
    zeros = write_trial(tmp_path / "zeros", steps)
    assert main(["--trial-dir", zeros, "--rule-name", "AllZero", "--tensor_regex", "w",
                 "--threshold", "75"]) == 1
    assert main(["--trial-dir", zeros, "--rule-name", "AllZero", "--tensor_regex", "w",
                 "--threshold", "80"]) == 0


def test_cli_other_trials_and_errors(tmp_path, capsys):
    a = write_trial(tmp_path / "a", {0: {"w": np.ones(3)}, 1: {"w": np.ones(3)}})
    b = write_trial(tmp_path / "b", {0: {"w": np.ones(3)}, 1: {"w": np.zeros(3)}})
    assert main(["--trial-dir", a, "--rule-name", "SimilarAcrossRuns", "--other-trials", b]) == 1
    assert "w differs from 'b' at step 1" in capsys.readouterr().out
    assert main(["--trial-dir", a, "--rule-name", "SimilarAcrossRuns", "--other-trials", a]) == 0
    capsys.readouterr()
    all_zero = ["--trial-dir", a, "--rule-name", "AllZero", "--tensor_regex", "w"]
    assert main([*all_zero, "--treshold", "5"]) == 2
    err = capsys.readouterr().err
    assert "rule AllZero has no parameter treshold" in err and "threshold (default 100)" in err
    assert main([*all_zero, "--threshold", "lots"]) == 2
    assert "threshold='lots' must be a number" in capsys.readouterr().err
    assert main(["--trial-dir", a, "--rule-name", "AllZero"]) == 2
    assert "pass collection_names or tensor_regex" in capsys.readouterr().err
    assert main(["--trial-dir", a, "--rule-name", "SimilarAcrossRuns"]) == 2
    assert "needs other_trial" in capsys.readouterr().err


def test_rules_spec_and_python_m(tmp_path):
    path = _losses(tmp_path / "run", [0.3, 0.33, 0.31, 0.30, 0.28])
    spec = tmp_path / "rules.json"
    spec.write_text(json.dumps([
        {"RuleName": "LossNotDecreasing",
         "RuleParameters": {"num_steps": "10", "use_losses_collection": "True"}},
        {"RuleName": "Overtraining", "RuleParameters": {"patience_train": "2", "delta": "0.5"}},
    ]))
    command = [sys.executable, "-m", "mltrace.rules.rule_invoker", "--trial-dir", path,
               "--rules-spec", str(spec)]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "LossNotDecreasing: IssuesFound" in proc.stdout
    assert "Overtraining: IssuesFound; evaluated 5 steps; fired at steps 4, 8, 12, 16" in (
        proc.stdout)
