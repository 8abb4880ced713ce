"""examples/mxnet/gluon_cnn.py runs end to end and its trial reads back (legacy venv: MXNet)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from mltrace.trials import create_trial

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mxnet" / "gluon_cnn.py"


def test_mxnet_example_runs_as_a_script(tmp_path):
    out_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out-dir", str(out_dir), "--epochs", "1", "--steps", "6",
         "--eval-steps", "2", "--save-interval", "3"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "conv1_relu_input_0 at TRAIN step 3" in proc.stdout
    trial = create_trial(str(out_dir))
    assert trial.steps(mode="TRAIN") == [0, 3] and trial.steps(mode="EVAL") == [0]
    assert trial.tensor_names(collection="relu_activations") == [
        "conv0_relu_input_0", "conv0_relu_output_0", "conv1_relu_input_0", "conv1_relu_output_0"]
    relu_out = trial.tensor("conv0_relu_output_0").value(3, mode="TRAIN")
    assert relu_out.shape == (16, 6, 24, 24) and (relu_out >= 0).all()
    assert "gradient/conv0_weight" in trial.tensor_names(collection="gradients")


def test_mxnet_example_with_json_config_and_hybridize(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("mxnet_example_gluon_cnn", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "2", "reductions": "mean,l2_norm",
                           "save_raw_tensor": True},
        "CollectionConfigurations": [{"CollectionName": "gradients"}, {"CollectionName": "losses"}],
    }))
    assert example.main(["--config", str(config), "--epochs", "1", "--steps", "4",
                         "--eval-steps", "1", "--hybridize"]) == 0
    assert "gradient variance" in capsys.readouterr().out
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps(mode="TRAIN") == [0, 2]
    grad = trial.tensor("gradient/dense0_weight")
    value = grad.value(2, mode="TRAIN")
    np.testing.assert_allclose(grad.reduction_value(2, "l2", mode="TRAIN"),
                               np.sqrt(np.sum(value.astype(np.float64) ** 2)), rtol=1e-5)
