"""Every framework example runs unmodified, with its mltrace lines removed
(examples/zero_change/), under ``mltrace run --config <its JSON>`` and leaves the trial the
original example leaves: the same tensor names, the same steps per mode, the same values.

The runs start together in one module-scoped fixture (independent processes whose time is mostly
importing torch or TensorFlow); each test then compares one pair. MXNet: tests/legacy.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mltrace.trials import Trial, create_trial
from tests.support.launch_runs import ROOT, TIMEOUT_S, environment

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples"
STRIPPED = EXAMPLES / "zero_change"
MODES = ("train", "eval", "predict", "global")


@dataclass
class Pair:
    """An original example's command line and its stripped copy's, run side by side."""

    original: list[str]  # arguments after the script; {out} is the trial directory
    stripped: list[str]  # arguments of mltrace run (config, script, its arguments)
    script: Path
    rtol: float = 0.0  # 0: values must be equal
    script_only: tuple[str, ...] = ()  # saved by hook.record_tensor_value: no hook finds these


PAIRS = {
    "pytorch-weights-bias-gradients": Pair(
        ["--output-uri", "{out}", "--hook-type", "weights-bias-gradients", "--steps", "5"],
        ["--config", "pytorch_weights_bias_gradients.json", "pytorch_hook_demos.py", "--steps", "5"],
        EXAMPLES / "pytorch" / "pytorch_hook_demos.py"),
    "pytorch-module-input-output": Pair(
        ["--output-uri", "{out}", "--hook-type", "module-input-output", "--steps", "12"],
        ["--config", "pytorch_module_input_output.json", "pytorch_hook_demos.py", "--steps", "12"],
        EXAMPLES / "pytorch" / "pytorch_hook_demos.py"),
    "pytorch-saveall": Pair(
        ["--output-uri", "{out}", "--hook-type", "saveall", "--steps", "5"],
        ["--config", "pytorch_saveall.json", "pytorch_hook_demos.py", "--steps", "5"],
        EXAMPLES / "pytorch" / "pytorch_hook_demos.py"),
    "pytorch-vanishing-grad": Pair(
        ["--output-uri", "{out}", "--rule_type", "vanishing_grad", "--steps", "8"],
        ["--config", "pytorch_vanishing_grad.json", "pytorch_hook_demos.py",
         "--rule_type", "vanishing_grad", "--steps", "8"],
        EXAMPLES / "pytorch" / "pytorch_hook_demos.py"),
    "keras-fit": Pair(
        ["--out-dir", "{out}", "--epochs", "1"],
        ["--config", "keras_fit.json", "keras_fit.py", "--epochs", "1"],
        EXAMPLES / "tensorflow" / "keras_fit.py", rtol=1e-6),
    "keras-gradienttape": Pair(
        ["--out-dir", "{out}", "--epochs", "1"],
        ["--config", "tf_keras_gradienttape.json", "tf_keras_gradienttape.py", "--epochs", "1"],
        EXAMPLES / "tensorflow" / "tf_keras_gradienttape.py", rtol=1e-6, script_only=("accuracy",)),
    "tf-session-hook": Pair(
        ["--out-dir", "{out}", "--steps", "20"],
        ["--config", "session_hook.json", "session_hook.py", "--steps", "20"],
        EXAMPLES / "tensorflow" / "session_hook.py"),
    "xgboost-feature-importance": Pair(
        ["--out-dir", "{out}", "--rounds", "12", "--plot", "{out}.png"],
        ["--config", "feature_importance.json", "feature_importance.py", "--rounds", "12"],
        EXAMPLES / "xgboost" / "feature_importance.py"),
}


class Run:
    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(args, cwd=ROOT, env=environment(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait(self) -> None:
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.stdout, self.stderr = self.proc.communicate()
        assert self.proc.returncode == 0, f"{self.proc.args}\n{self.stdout}\n{self.stderr}"


@pytest.fixture(scope="module")
def trials(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Trial, Trial]]:
    base = tmp_path_factory.mktemp("zero_change")
    runs = {}
    for name, pair in PAIRS.items():
        with_lines, without = base / f"{name}-with-lines", base / f"{name}-mltrace-run"
        original = [a.replace("{out}", str(with_lines)) for a in pair.original]
        stripped = [str(STRIPPED / a) if a.endswith((".json", ".py")) else a for a in pair.stripped]
        runs[name] = (
            Run([sys.executable, str(pair.script), *original]),
            Run([sys.executable, "-m", "mltrace", "run", "--out-dir", str(without), *stripped]),
            with_lines, without)
    for first, second, _, _ in runs.values():
        first.wait()
        second.wait()
    return {name: (create_trial(str(a)), create_trial(str(b))) for name, (_, _, a, b) in runs.items()}


def assert_same_trial(expected: Trial, got: Trial, rtol: float, script_only: tuple[str, ...] = ()) -> None:
    names = [n for n in expected.tensor_names() if n not in script_only]
    assert set(script_only) <= set(expected.tensor_names())
    assert got.tensor_names() == names
    assert names
    for mode in MODES:
        assert got.steps(mode=mode) == expected.steps(mode=mode), mode
    for name in names:
        tensor, other = expected.tensor(name), got.tensor(name)
        assert other.steps() == tensor.steps(), name
        for step in tensor.steps():
            np.testing.assert_allclose(other.value(step), tensor.value(step), rtol=rtol,
                                       err_msg=f"{name} at step {step}")


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_stripped_example_under_mltrace_run_leaves_the_same_trial(
        trials: dict[str, tuple[Trial, Trial]], name: str) -> None:
    expected, got = trials[name]
    assert_same_trial(expected, got, PAIRS[name].rtol, PAIRS[name].script_only)


def test_stripped_copies_carry_no_mltrace_line() -> None:
    """They import nothing of mltrace and name no hook: the attaching is mltrace run's alone."""
    scripts = sorted(STRIPPED.glob("*.py"))
    assert len(scripts) == 6
    for script in scripts:
        tree = ast.parse(script.read_text())
        imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names]
        imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert not [m for m in imported if m.split(".")[0] in ("mltrace", "smdebug")], script
        identifiers = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        identifiers |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        assert not [i for i in identifiers if "hook" in i.lower() or i == "smd"], script
