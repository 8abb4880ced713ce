"""examples/zero_change/gluon_cnn.py (examples/mxnet/gluon_cnn.py with its mltrace lines removed)
under ``mltrace run --config gluon_cnn.json`` leaves the trial the original leaves: the same
tensor names, steps per mode and values (legacy venv: MXNet)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from mltrace.trials import create_trial

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--epochs", "1", "--steps", "6", "--eval-steps", "2"]


def _run(args: list[str]) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_gluon_example_without_its_mltrace_lines_under_mltrace_run(tmp_path):
    with_lines, without = tmp_path / "with-lines", tmp_path / "mltrace-run"
    _run([str(ROOT / "examples" / "mxnet" / "gluon_cnn.py"), "--out-dir", str(with_lines), *ARGS])
    stripped = ROOT / "examples" / "zero_change"
    out = _run(["-m", "mltrace", "run", "--config", str(stripped / "gluon_cnn.json"),
                "--out-dir", str(without), str(stripped / "gluon_cnn.py"), *ARGS])
    assert out.startswith("epoch 0: last train loss")
    expected, got = create_trial(str(with_lines)), create_trial(str(without))
    assert got.tensor_names() == expected.tensor_names()
    assert "conv0_relu_output_0" in got.tensor_names(collection="relu_activations")
    assert "softmaxcrossentropyloss0_output_0" in got.tensor_names(collection="losses")
    for mode in ("TRAIN", "EVAL", "PREDICT"):
        assert got.steps(mode=mode) == expected.steps(mode=mode)
    assert got.steps(mode="TRAIN") == [0, 5] and got.steps(mode="EVAL") == [0]
    for name in expected.tensor_names():
        for step in expected.tensor(name).steps():
            np.testing.assert_array_equal(got.tensor(name).value(step),
                                          expected.tensor(name).value(step))
