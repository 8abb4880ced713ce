"""KerasHook under tf.distribute.MirroredStrategy (two logical CPUs, in a fresh process): the
trial is written by one worker; weights are the synchronised ones; in-step values (layer
inputs, gradients) are always replica 0's: its half of the batch and its local gradient."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mltrace.modes import ModeKeys
from mltrace.trials import create_trial

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
LR = 0.1


@pytest.fixture(scope="module")
def mirrored_run(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("mirrored") / "run")
    proc = subprocess.run(
        [sys.executable, os.path.join(SUPPORT, "tf_mirrored_training.py"), out_dir],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "MLTRACE_LOG_LEVEL": "error"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return create_trial(out_dir), json.loads(proc.stdout)


def test_mirrored_fit_writes_every_step_once(mirrored_run):
    trial, run = mirrored_run
    assert run["replicas"] == 2
    assert trial.workers() == ["worker_0"]
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2]
    assert {
        "loss", "d1/inputs", "gradients/net/d1/kernelGrad", "d1/weights/net/d1/kernel:0"
    } <= set(trial.tensor_names())


def test_mirrored_in_step_values_are_replica_zeros(mirrored_run):
    trial, run = mirrored_run
    x = np.asarray(run["x"], np.float32)
    kernels = [np.asarray(k, np.float32) for k in run["d1_kernel"]]
    for step in range(3):
        # Replica 0 gets the first half of each batch of 8.
        np.testing.assert_array_equal(
            trial.tensor("d1/inputs").value(step), x[step * 8:step * 8 + 4])
        # Weights are read after the step: the synchronised variable every replica holds.
        np.testing.assert_array_equal(
            trial.tensor("d1/weights/net/d1/kernel:0").value(step), kernels[step + 1])
        # The saved gradient is replica 0's local one; the all-reduced sum is what SGD applied.
        local0, local1 = (np.asarray(g, np.float32) for g in run["local_grads"][step])
        saved = trial.tensor("gradients/net/d1/kernelGrad").value(step)
        np.testing.assert_allclose(saved, local0, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(local0 + local1, (kernels[step] - kernels[step + 1]) / LR,
                                   rtol=1e-3, atol=1e-5)
        assert float(trial.tensor("loss").value(step)) > 0
