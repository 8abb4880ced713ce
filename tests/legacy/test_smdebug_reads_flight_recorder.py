"""Real smdebug 1.0.34 reads the steps a flight recorder dumped (issue "catch the moment").

A run saving every 500 steps turns NaN at step 47 (tests/support/flight_training.py); its recorder keeps
20 steps before and 5 after, with raw copies of the activations. smdebug's reader must see those
steps as ordinary steps, with the same reductions and raw values as mltrace's reader, and must
not trip over the record file beside them (``mltrace_flight_recorder/``).
"""

from __future__ import annotations

import numpy as np
import pytest
from smdebug.trials import create_trial as smd_create_trial

import mltrace.pytorch as smd
from mltrace.trials import create_trial as ml_create_trial
from tests.support.flight_records import FIVE_REDUCTIONS
from tests.support.flight_training import POISONED, train

POISON, N, K = 47, 20, 5
REDUCTIONS = FIVE_REDUCTIONS


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("flight") / "run")
    config = smd.FlightRecorderConfig(steps=N, after_steps=K, raw=True,
                                      collections=["gradients", "activations", "losses"],
                                      reductions=list(REDUCTIONS))
    train(out, steps=POISON + 20, poison_step=POISON, recorder=config)
    return smd_create_trial(out), ml_create_trial(out)


def test_smdebug_sees_the_dumped_steps(trials):
    theirs, ours = trials
    window = list(range(POISON - N, POISON + K + 1))
    assert theirs.steps() == ours.steps() == [0] + window
    assert theirs.loaded_all_steps


def test_smdebug_reads_the_same_values_and_reductions(trials):
    theirs, ours = trials
    names = [n for n in ours.tensor_names() if n.startswith(("fc", "relu", "gradient/"))]
    assert set(names) <= set(theirs.tensor_names())
    for name in names:
        for step in (POISON - N, POISON - 1, POISON, POISON + K):
            for red in REDUCTIONS:
                mine = ours.tensor(name).reduction_value(step, red)
                np.testing.assert_array_equal(theirs.tensor(name).reduction_value(step, red), mine)
            np.testing.assert_array_equal(theirs.tensor(name).value(step), ours.tensor(name).value(step))
    assert np.isnan(theirs.tensor(POISONED).value(POISON)).all()
    assert np.isfinite(theirs.tensor(POISONED).value(POISON - 1)).all()


def test_smdebug_reads_the_losses_of_the_dumped_steps(trials):
    theirs, ours = trials
    for step in (POISON - 3, POISON + 2):
        assert float(theirs.tensor("MSELoss_output_0").value(step)) == pytest.approx(
            float(ours.tensor("MSELoss_output_0").value(step)))
