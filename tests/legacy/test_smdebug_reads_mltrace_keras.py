"""Real smdebug 1.0.34's reader reads what mltrace's Keras hook writes (docs/format.md).

The trial under tests/golden/mltrace_keras/keras_run was written by mltrace.tensorflow.KerasHook
(TensorFlow 2.21 lives in the main venv only; this venv has smdebug but no TensorFlow) with
tests/golden/make_mltrace_keras_golden.py, which also wrote expected.json after checking it
against the values captured in the training process. smdebug's create_trial must see the same
tensor names, steps per mode, the same mode for every global step, the same values, dtypes and
shapes, the same collection members and stored reductions, and one worker; and it must not trip
over what mltrace adds (index crc32c fields, the mltrace_reductions key with nan_count).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from smdebug.core.modes import ModeKeys
from smdebug.trials import create_trial

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "mltrace_keras"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())
MODES = ("TRAIN", "EVAL", "PREDICT")


@pytest.fixture(scope="module")
def trial():
    return create_trial(str(GOLDEN / EXPECTED["trial"]))


def test_smdebug_sees_mltrace_keras_names_steps_and_workers(trial):
    assert sorted(trial.tensor_names()) == EXPECTED["tensor_names"]
    for mode in MODES:
        assert trial.steps(mode=ModeKeys[mode]) == EXPECTED["steps"][mode], mode
    assert trial.steps() == EXPECTED["steps"]["GLOBAL"]
    assert sorted(trial.workers()) == EXPECTED["workers"] == ["worker_0"]
    assert trial.num_workers == EXPECTED["num_workers"] == 1
    # every global step belongs to the mode (and mode step) mltrace wrote it in
    for mode in MODES:
        for step, global_step in EXPECTED["global_step"][mode].items():
            assert trial.global_step(ModeKeys[mode], int(step)) == global_step, (mode, step)
    assert (
        sorted(g for m in MODES for g in EXPECTED["global_step"][m].values())
        == EXPECTED["steps"]["GLOBAL"]
    )


def test_smdebug_reads_mltrace_keras_values(trial):
    checked = 0
    for name, modes in EXPECTED["tensors"].items():
        tensor = trial.tensor(name)
        for mode, steps in modes.items():
            assert tensor.steps(mode=ModeKeys[mode]) == sorted(int(s) for s in steps), (name, mode)
            for step, want in steps.items():
                got = tensor.value(int(step), mode=ModeKeys[mode])
                assert str(got.dtype) == want["dtype"] and list(got.shape) == want["shape"], (
                    name,
                    mode,
                    step,
                )
                np.testing.assert_array_equal(
                    got, np.array(want["value"], dtype=want["dtype"]), err_msg=name
                )
                checked += 1
    assert checked == sum(
        len(steps) for modes in EXPECTED["tensors"].values() for steps in modes.values()
    )
    assert checked > 100


def test_smdebug_reads_mltrace_keras_collections_and_reductions(trial):
    for collection, members in EXPECTED["collections"].items():
        assert sorted(trial.tensor_names(collection=collection)) == members, collection
    assert sorted(trial.collection("grad_stats").reduction_config.reductions) == [
        "max",
        "mean",
        "min",
    ]
    for name, steps in EXPECTED["reductions"].items():
        tensor = trial.tensor(name)
        for step, stored in steps.items():
            for red in ("min", "max", "mean"):
                assert tensor.reduction_value(int(step), red, mode=ModeKeys.TRAIN) == pytest.approx(
                    stored[red], rel=1e-12
                )
            assert tensor.reduction_value(int(step), "l2", mode=ModeKeys.TRAIN) == pytest.approx(
                stored["l2"], rel=1e-12
            )
            assert tensor.reduction_value(
                int(step), "max", mode=ModeKeys.TRAIN, abs=True
            ) == pytest.approx(stored["abs_max"], rel=1e-12)
    # Keras' losses and metrics are TRAIN/EVAL scalars as smdebug's Keras hook wrote them.
    assert trial.tensor("loss").value(0, mode=ModeKeys.TRAIN).shape == ()
    assert trial.tensor("val_loss").steps(mode=ModeKeys.EVAL) == [0, 1]
