"""The examples under examples/tensorflow run end to end (in this process: TensorFlow is imported
once for all TensorFlow tests), and the golden Keras trial of the legacy cross-check still reads
back as its expected.json says."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import mltrace.tensorflow as smd
from mltrace.modes import ModeKeys
from mltrace.trials import create_trial

ROOT = Path(__file__).resolve().parents[2]


def _example(name: str):
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", ROOT / "examples" / "tensorflow" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_keras_fit(tmp_path, capsys):
    out_dir = _example("keras_fit").main(["--out-dir", str(tmp_path / "run"), "--epochs", "1"])
    assert "Loss values during evaluation were" in capsys.readouterr().out
    trial = create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 10]
    # EVAL step 0 is due; step 1, the last validation step of the epoch, holds val_loss/val_accuracy
    assert trial.steps(mode=ModeKeys.EVAL) == [0, 1]
    assert trial.tensor("val_loss").steps(mode=ModeKeys.EVAL) == [1]
    assert trial.steps(mode=ModeKeys.PREDICT) == [0]
    assert len(trial.tensor_names(collection="gradients")) == 4
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(trial.tensor_names())


@pytest.mark.parametrize("extra", [[], ["--tf-function"]], ids=["eager", "tf_function"])
def test_example_gradienttape(tmp_path, capsys, extra):
    out_dir = _example("tf_keras_gradienttape").main(
        ["--out-dir", str(tmp_path / "run"), "--epochs", "1"] + extra
    )
    assert "TRAIN steps saved: [0, 5]" in capsys.readouterr().out
    trial = create_trial(out_dir)
    assert trial.tensor("accuracy").steps(mode=ModeKeys.TRAIN) == [0, 5]
    shapes = {trial.tensor(n).value(5).shape for n in trial.tensor_names(collection="gradients")}
    assert shapes == {(784, 64), (64,), (64, 10), (10,)}  # (model names vary: sequential_<n>)


def test_example_session_hook(tmp_path):
    out_dir = _example("session_hook").main(["--out-dir", str(tmp_path / "run"), "--steps", "11"])
    trial = create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 5, 10]
    w = [trial.tensor("w:0").value(s).ravel() for s in (0, 5, 10)]
    assert (
        np.abs(w[2] - [2.0, -1.0, 0.5]).sum() < np.abs(w[0] - [2.0, -1.0, 0.5]).sum()
    )  # it learns
    assert "prediction:0" in trial.tensor_names()


def test_golden_keras_trial_reads_back_as_expected():
    """tests/golden/mltrace_keras (real smdebug reads it in the legacy suite) is expected.json."""
    golden = ROOT / "tests" / "golden" / "mltrace_keras"
    expected = json.loads((golden / "expected.json").read_text())
    trial = create_trial(str(golden / expected["trial"]))
    assert trial.tensor_names() == expected["tensor_names"]
    for name, modes in expected["tensors"].items():
        for mode, steps in modes.items():
            for step, want in steps.items():
                got = trial.tensor(name).value(int(step), mode=ModeKeys[mode])
                np.testing.assert_array_equal(got, np.array(want["value"], dtype=want["dtype"]))
    for collection, members in expected["collections"].items():
        assert trial.tensor_names(collection=collection) == members
    assert smd.create_trial is create_trial
