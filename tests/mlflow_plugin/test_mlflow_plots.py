"""Seed 002's plots from trials: the distribution-over-steps GIF and the two-trial comparison."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mltrace.exceptions import MltraceValueError
from mltrace.trials import create_trial
from mltrace_mlflow.plots import (
    compare_trials,
    create_interactive_matplotlib_histogram,
    plot_distributions,
    tensor_values,
)
from tests.support.mlflow_env import train


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    root = tmp_path_factory.mktemp("plots")
    train(root / "good", steps=6, mlflow=None, lr=0.05)
    train(root / "bad", steps=6, mlflow=None, lr=0.5, seed=1)
    return str(root / "good"), str(root / "bad")


def test_distributions_over_steps_gif(trials, tmp_path):
    out = plot_distributions(trials[0], ".*gradient", str(tmp_path / "gradients.gif"))
    with Image.open(out) as gif:
        assert gif.format == "GIF" and gif.n_frames == 6
    values = tensor_values(trials[0], "gradient/Sequential_0.weight", max_steps=3)
    assert list(values["gradient/Sequential_0.weight"]) == [0, 2, 5]
    trial = create_trial(trials[0])
    np.testing.assert_array_equal(values["gradient/Sequential_0.weight"][2],
                                  trial.tensor("gradient/Sequential_0.weight").value(2))


def test_notebook_helper_takes_the_rules_dict(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"conv0_relu_input_0": {s: rng.normal(0, 1 / (s + 1), 100) for s in range(0, 400, 100)},
               "conv1_relu_input_0": {s: -np.abs(rng.normal(size=50)) for s in (0, 100, 200)}}
    out = create_interactive_matplotlib_histogram(tensors, filename=str(tmp_path / "activation_inputs.gif"))
    with Image.open(out) as gif:
        assert gif.n_frames == 4


def test_two_trial_comparison_png_and_gif(trials, tmp_path):
    png = compare_trials(trials[0], trials[1], ["Sequential_0.weight", "gradient/Sequential_2.weight"],
                         str(tmp_path / "cmp.png"), labels=("good", "bad"))
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[1] > image.size[0] / 2
    gif = compare_trials(trials[0], trials[1], "gradient/Sequential_0.weight", str(tmp_path / "cmp.gif"))
    with Image.open(gif) as image:
        assert image.n_frames == 6
    with pytest.raises(MltraceValueError, match="matches"):
        compare_trials(trials[0], trials[1], "no_such_tensor", str(tmp_path / "x.png"))
