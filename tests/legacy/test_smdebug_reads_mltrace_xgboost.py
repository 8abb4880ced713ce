"""Real smdebug 1.0.34's reader reads what mltrace's XGBoost hook writes (docs/format.md).

This venv has no xgboost, so the trial is the committed golden one: tests/golden/mltrace_xgboost/
(written by tests/golden/make_mltrace_xgboost_golden.py with the main venv, which records in
``expected.json`` the values seen in the training process). smdebug's ``create_trial`` must see
the same steps, workers, tensor names, collection members and values (dtype, shape, content: 1-d
strings of the trees and hyperparameters, float32 SHAP values and predictions, float64 metrics,
int64 tree ids), and mltrace's reader in this venv (numpy 1.23) must agree.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from smdebug.trials import create_trial as smd_create_trial

from mltrace.trials import create_trial as ml_create_trial

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "mltrace_xgboost"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())


def _want(entry: dict) -> np.ndarray:
    values = [math.nan if v == "NaN" else v for v in entry["value"]]
    dtype = str if entry["dtype"] == "str" else np.dtype(entry["dtype"])
    return np.array(values, dtype=dtype).reshape(entry["shape"])


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    if want.dtype.kind == "U":
        return got.shape == want.shape and [str(g) for g in got.reshape(-1)] == want.reshape(-1).tolist()
    return got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want, equal_nan=True)


@pytest.fixture(scope="module")
def smd_trial():
    return smd_create_trial(str(GOLDEN / "run"))


def test_smdebug_sees_the_steps_workers_and_names_of_the_xgboost_trial(smd_trial):
    assert smd_trial.steps() == EXPECTED["steps"]
    assert smd_trial.workers() == EXPECTED["workers"]
    assert smd_trial.tensor_names() == EXPECTED["tensor_names"]
    assert smd_trial.loaded_all_steps


def test_smdebug_reads_every_xgboost_value_as_captured_in_the_process(smd_trial):
    checked = 0
    for name, by_step in EXPECTED["values"].items():
        tensor = smd_trial.tensor(name)
        assert tensor.steps() == sorted(int(s) for s in by_step), name
        for step, entry in by_step.items():
            got, want = tensor.value(int(step)), _want(entry)
            assert _same(got, want), (name, step, got, want)
            checked += 1
    assert checked == sum(len(v) for v in EXPECTED["values"].values()) > 60  # all collections


def test_smdebug_finds_the_members_of_each_xgboost_collection(smd_trial):
    for collection, members in EXPECTED["collections"].items():
        assert smd_trial.tensor_names(collection=collection) == members, collection
    # smdebug's own SHAP regex ([^/bias]$) would have dropped these two; mltrace's keeps them.
    assert {"full_shap/alpha", "full_shap/bias_s"} <= set(smd_trial.tensor_names(collection="full_shap"))
    # hyperparameters are saved once, at the first round
    assert smd_trial.tensor("hyperparameters/objective").steps() == [0]


def test_mltrace_reader_in_the_legacy_venv_agrees_with_smdebug_on_the_xgboost_trial(smd_trial):
    trial = ml_create_trial(str(GOLDEN / "run"))
    assert trial.tensor_names() == smd_trial.tensor_names()
    assert trial.steps() == smd_trial.steps()
    for name in ("trees/ID", "trees/Split", "full_shap/income", "validation-rmse",
                 "hyperparameters/eval_metric"):
        for step in smd_trial.tensor(name).steps():
            assert _same(trial.tensor(name).value(step), smd_trial.tensor(name).value(step)), (name, step)
