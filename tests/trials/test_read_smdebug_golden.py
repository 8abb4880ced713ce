"""mltrace reads a trial written by real smdebug 1.0.34, in the main venv (numpy 2, no smdebug).

The trial under tests/golden/smdebug_1.0.34/pytorch_run was written by ``smdebug.pytorch.Hook``
and expected.json holds what smdebug's own reader returned for it (tests/golden/
make_smdebug_golden.py, run in .venv-legacy, made both; tests/legacy/test_smdebug_golden.py
checks that regenerating gives the same). Here mltrace must return all of it, and where smdebug's
reader is wrong (int8 read as uint8, int16 unreadable) the values the generator wrote.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mltrace.exceptions import ShapeUnavailableForStep, TensorUnavailableForStep
from mltrace.trials import create_trial

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "smdebug_1.0.34"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text(encoding="utf-8"))
TENSOR_NAMES = sorted(EXPECTED["tensors"])
MODES = ("TRAIN", "EVAL", "GLOBAL")


def decode(entry: dict) -> np.ndarray:
    return np.array(entry["data"], dtype=np.dtype(entry["dtype"])).reshape(entry["shape"])


def assert_same(actual: np.ndarray, expected: dict, what: str) -> None:
    want = decode(expected)
    assert isinstance(actual, np.ndarray), what
    assert actual.shape == want.shape, (what, actual.shape, want.shape)
    if want.dtype.kind == "U":
        assert actual.dtype.kind == "U" and actual.tolist() == want.tolist(), what
    else:
        assert actual.dtype == want.dtype, (what, actual.dtype, want.dtype)
        assert np.array_equal(actual, want), what


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    # A copy, so that nothing a reader might write ever lands in the committed golden files.
    path = tmp_path_factory.mktemp("golden") / EXPECTED["trial"]
    shutil.copytree(GOLDEN / EXPECTED["trial"], path)
    return create_trial(str(path))


def test_golden_files_are_smdebugs():
    assert EXPECTED["smdebug_version"] == "1.0.34"
    run = GOLDEN / EXPECTED["trial"]
    assert (run / "training_job_end.ts").exists()
    assert sorted(p.name for p in (run / "index" / "000000000").iterdir()) == [
        f"{g:012d}_worker_0.json" for g in EXPECTED["steps"]["GLOBAL"]]
    for index_file in (run / "index" / "000000000").iterdir():  # smdebug's own: no crc32c field
        entries = json.loads(index_file.read_text())["tensor_payload"]
        assert entries and not any("crc32c" in e for e in entries)
    size = sum(f.stat().st_size for f in GOLDEN.rglob("*") if f.is_file())
    assert size < 250_000


def test_trial_level(trial):
    assert trial.workers() == EXPECTED["workers"]
    assert trial.num_workers == EXPECTED["num_workers"]
    assert sorted(m.name for m in trial.modes()) == EXPECTED["modes"]
    for mode in MODES:
        assert trial.steps(mode=mode) == EXPECTED["steps"][mode], mode
    for g, (mode, mode_step) in EXPECTED["mode_of_global_step"].items():
        found_mode, found_step = trial.mode_modestep(int(g))
        assert (found_mode.name, found_step) == (mode, mode_step)
        assert trial.global_step(mode, mode_step) == int(g)
    assert trial.tensor_names() == EXPECTED["tensor_names"]
    for mode, by_step in EXPECTED["tensor_names_by_step"].items():
        for step, names in by_step.items():
            assert trial.tensor_names(step=int(step), mode=mode) == names, (mode, step)


def test_collections(trial):
    collections = trial.collections()
    assert sorted(collections) == sorted(EXPECTED["collections"])
    for name, want in EXPECTED["collections"].items():
        assert collections[name].to_json_dict() == want, name
    for name, names in EXPECTED["tensors_in_collection"].items():
        assert trial.tensor_names(collection=name) == names, name


@pytest.mark.parametrize("name", TENSOR_NAMES)
def test_tensor(trial, name):
    expected = EXPECTED["tensors"][name]
    tensor = trial.tensor(name)
    for mode in MODES:
        assert tensor.steps(mode=mode) == expected["steps"][mode], mode
    misread = name in EXPECTED["smdebug_misreads"]
    for mode in ("TRAIN", "EVAL"):
        for step, value in expected["values"][mode].items():
            what = f"{name} {mode} step {step}"
            step = int(step)
            shape = expected["shapes"][mode][str(step)]
            if misread:  # smdebug's reader got it wrong: compare with what was written
                assert_same(tensor.value(step, mode=mode), EXPECTED["written"][name], what)
                assert list(tensor.shape(step, mode=mode)) == EXPECTED["written"][name]["shape"]
            elif value is None:
                with pytest.raises(TensorUnavailableForStep):
                    tensor.value(step, mode=mode)
            else:
                assert_same(tensor.value(step, mode=mode), value, what)
                g = trial.global_step(mode, step)
                assert_same(tensor.value(g), value, what + " (by global step)")
            if shape is None and not misread:
                with pytest.raises(ShapeUnavailableForStep):
                    tensor.shape(step, mode=mode)
            elif not misread:
                assert list(tensor.shape(step, mode=mode)) == shape, what
            reductions = expected["reductions"][mode][str(step)]
            stored = tensor.reduction_values(step, mode=mode)
            assert sorted(stored) == sorted((r["name"], r["abs"]) for r in reductions), what
            for red in reductions:
                key = (red["name"], red["abs"])
                assert_same(stored[key], red, f"{what} {key}")
                single = tensor.reduction_value(step, red["name"], mode=mode, abs=red["abs"])
                assert_same(single, red, f"{what} {key} reduction_value")


def test_values_smdebug_reads_wrong(trial):
    """int8: smdebug's reader returns uint8; int16: it raises (docs/format.md, "What smdebug's
    reader gets wrong").

    mltrace returns what was written."""
    step = trial.steps(mode="TRAIN")[0]
    int8 = trial.tensor("dtype_int8").value(step, mode="TRAIN")
    assert_same(int8, EXPECTED["written"]["dtype_int8"], "int8")
    smdebug_says = decode(EXPECTED["smdebug_misreads"]["dtype_int8"]["smdebug_reads"])
    assert smdebug_says.dtype == np.uint8 and np.array_equal(smdebug_says, int8.view(np.uint8))
    assert "KeyError" in EXPECTED["smdebug_misreads"]["dtype_int16"]["smdebug_raises"]
    assert_same(trial.tensor("dtype_int16").value(step, mode="TRAIN"),
                EXPECTED["written"]["dtype_int16"], "int16")


def test_written_dtypes_round_trip(trial):
    """Every array the generator passed to save_tensor reads back exactly, at every TRAIN step."""
    for name, written in EXPECTED["written"].items():
        for step in trial.tensor(name).steps(mode="TRAIN"):
            assert_same(trial.tensor(name).value(step, mode="TRAIN"), written, f"{name} {step}")
