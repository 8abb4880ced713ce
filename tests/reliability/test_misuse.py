"""Bad configuration and misuse: every mistake gets an mltrace exception whose message names the
bad value and the fix, and no file is ever written outside out_dir.

What test_config.py, test_collections.py, test_json_config.py and test_pytorch_hook.py already
check (save_interval 0/-1/"abc", end_step < start_step, unknown reduction tokens, unknown
HookParameters keys, invalid regexes, a finished PyTorch out_dir) is not repeated here; this
module covers the ways around them: other types, attribute assignment, in-place edits,
collections, the JSON file as a whole, the other adapters, odd out_dirs, and odd names.

Decisions the tests pin down:

* ``end_step == start_step`` (with end_step != 0) is an error like ``end_step < start_step``:
  the range is empty, so it would save nothing, silently. ``end_step=0`` stays smdebug's way of
  switching a collection off, whatever start_step is.
* Setting a misspelt attribute on SaveConfig, SaveConfigMode or ReductionConfig
  (``save_config.save_intervl = 5``) raises MltraceAttributeError listing the real ones; every
  assignment to a real one is validated, and a failed one changes nothing.
* Unknown collections. smdebug users name a collection in ``include_collections`` and fill it
  after creating the hook (``hook.get_collection(name).include(regex)``) or while training
  (``hook.save_tensor(name, value, collections_to_write=name)``), so a name no collection has
  is not an error when the hook is built. When the first step starts, a name that still has no
  collection gets ONE warning (never repeated) that lists the known collections and suggests
  the closest one ("weight" -> "weights"). A collection that exists but matches nothing (made by
  ``get_collection(name)`` or a JSON CollectionConfigurations entry, with no regex) raises
  InvalidCollectionConfiguration at the first step, as smdebug does, now with the closest
  collection suggested. Both happen before any file is written.
* out_dir: a finished run raises MltraceRuntimeError for every adapter and for JSON configs; an
  out_dir that is a file, lies inside a file, or cannot be written raises MltraceValueError when
  the hook is built (not at the first background write); dry_run hooks write nothing and are
  not checked.
* Names. Any non-empty str that UTF-8 can encode is a valid tensor name and is read back
  exactly: '/', '..', absolute paths, unicode, emoji, NUL, newlines, 5,000 characters. Names
  never become file paths in a trial. Empty names, non-str names and lone surrogates raise.
  TensorBoard tags follow smdebug's cleaning (characters outside ``[-/\\w.]`` become ``_``), so
  two names differing only there share a tag, as in smdebug; MLflow metric keys are cleaned to
  MLflow's rules and made distinct per name (a short hash suffix when two names clean to the
  same key), so no metric is refused and none is merged with another.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow import MlflowClient
from mlflow.utils.validation import _validate_metric_name
from tensorboard.backend.event_processing import event_accumulator as ea

import mltrace.pytorch as smd
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.exceptions import (
    InvalidCollectionConfiguration,
    MltraceAttributeError,
    MltraceError,
    MltraceRuntimeError,
    MltraceTypeError,
    MltraceValueError,
)
from mltrace.format import paths
from mltrace.trials import create_trial
from mltrace.writer.tensorboard import clean_tag

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root``: relative path -> (size, mtime_ns)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_size if name in filenames else 0, st.st_mtime_ns)
    return out


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


def _finished_run(out_dir: Path) -> Path:
    """A real, closed PyTorch trial in ``out_dir``."""
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1))
    model = _model()
    hook.register_module(model)
    for _ in range(2):
        model(torch.ones(2, 4))
    hook.close()
    assert (out_dir / paths.END_OF_JOB_MARKER).exists()
    return out_dir


def _assert_clear(exc: BaseException, *needles: str) -> None:
    """An mltrace exception whose message holds every needle (the value, the fix)."""
    assert isinstance(exc, MltraceError), f"{type(exc).__name__} is not an mltrace exception: {exc}"
    for needle in needles:
        assert needle in str(exc), f"{needle!r} not in {str(exc)!r}"


# -- SaveConfig / SaveConfigMode values --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"save_interval": float("inf")}, ["save_interval=inf", "integer"]),
        ({"save_interval": float("nan")}, ["save_interval=nan", "integer"]),
        ({"save_interval": [10]}, ["save_interval=[10]", "integer"]),
        ({"save_interval": None, "start_step": 2.5}, ["start_step=2.5", "whole"]),
        ({"start_step": 5, "end_step": 5}, ["end_step=5", "start_step=5", "end_step=6", "end_step=0"]),
        ({"start_step": "7", "end_step": "7"}, ["end_step=7", "start_step=7"]),
        ({"save_steps": b"12"}, ["save_steps=b'12'", "[0, 10, 20]"]),
        ({"save_steps": {3: 4}}, ["save_steps={3: 4}", "list of steps"]),
        ({"save_steps": [0, -1]}, ["-1", ">= 0"]),
        ({"when_nan": [""]}, ["when_nan", "''", "['loss']"]),
        ({"when_nan": 5}, ["when_nan=5", "['loss']"]),
    ],
)
def test_save_config_rejects_values_beyond_the_basic_ones(kwargs, needles):
    for build in (SaveConfig, SaveConfigMode):
        with pytest.raises(MltraceError) as info:
            build(**kwargs)
        _assert_clear(info.value, *needles)


def test_end_step_zero_still_switches_saving_off_whatever_start_step_is():
    for start in (0, 5):
        mode = SaveConfigMode(save_interval=1, start_step=start, end_step=0, save_steps=[3])
        assert [s for s in range(10) if mode.should_save_step(s)] == [3]


def test_when_nan_given_one_name_watches_that_name_not_its_letters():
    assert SaveConfig(when_nan="loss").when_nan == ["loss"]
    config = SaveConfig()
    config.when_nan = "gradient/fc.weight"
    assert config.watched_nan_tensors() == {"gradient/fc.weight"}


@pytest.mark.parametrize("obj", [SaveConfig(), SaveConfigMode(), ReductionConfig()], ids=type)
def test_misspelt_attribute_is_an_error_listing_the_real_ones(obj):
    with pytest.raises(MltraceAttributeError) as info:
        obj.save_intervl = 5
    assert isinstance(info.value, AttributeError)
    real = "reductions" if isinstance(obj, ReductionConfig) else "save_interval"
    _assert_clear(info.value, "'save_intervl'", real)
    assert not hasattr(obj, "save_intervl")


def test_save_config_assignment_that_fails_for_one_mode_changes_no_mode():
    config = SaveConfig({"TRAIN": SaveConfigMode(save_interval=2, end_step=10)}, save_interval=5)
    before = config.to_json_dict()
    with pytest.raises(MltraceValueError) as info:
        config.start_step = 20  # fine for EVAL (no end_step), not for TRAIN (end_step=10)
    _assert_clear(info.value, "start_step=20", "end_step=10")
    assert config.to_json_dict() == before
    with pytest.raises(MltraceValueError, match="save_interval=0"):
        config.save_interval = 0
    assert config.to_json_dict() == before


@pytest.mark.parametrize(
    ("value", "needles"),
    [
        ({"save_interval": 10}, ["'save_interval'", "SaveConfig(save_interval=...)", "'TRAIN'"]),
        ({"TRAINING": {"save_interval": 10}}, ["'TRAINING'", "TRAIN", "EVAL"]),
        ({"TRAIN": {"save_interval": 0}}, ["mode TRAIN", "save_interval=0"]),
        ({"TRAIN": {"save_intervl": 1}}, ["'save_intervl'", "save_interval"]),
        ({"TRAIN": 10}, ["mode_save_configs[TRAIN]=10", "SaveConfigMode"]),
        ("every 10 steps", ["'every 10 steps'", "SaveConfig"]),
    ],
)
def test_bad_save_config_through_hook_and_collection(tmp_path, value, needles):
    """The same mistakes through the hook's constructor and a collection's save_config."""
    with pytest.raises(MltraceError) as info:
        smd.Hook(out_dir=str(tmp_path / "run"), save_config=value)
    _assert_clear(info.value, *needles)
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    weights = hook.get_collection("weights")
    before = weights.save_config.to_json_dict()
    with pytest.raises(MltraceError) as info:
        weights.save_config = value
    _assert_clear(info.value, *needles)
    assert weights.save_config.to_json_dict() == before
    hook.close()
    assert not (tmp_path / "run").exists()


def test_collection_save_config_fields_are_validated_on_assignment(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    config = hook.get_collection("weights").save_config
    for field, value, needle in [("save_interval", -1, "save_interval=-1"),
                                 ("end_step", "x", "end_step='x'"), ("save_steps", [1, "two"], "'two'")]:
        with pytest.raises(MltraceValueError, match=re.escape(needle)):
            setattr(config, field, value)
    assert config.save_interval == 500 and config.end_step is None and config.save_steps == []
    hook.close()


# -- ReductionConfig ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "needles"),
    [
        ("reductions", ["mena"], ["'mena'", "did you mean 'mean'", "choose from min"]),
        ("reductions", "max,mena", ["'mena'", "did you mean 'mean'"]),
        ("reductions", 5, ["reductions=5", "list of names"]),
        ("abs_reductions", ["nan_count"], ["'nan_count'", "min, max"]),
        ("abs_reductions", ["zero_fraction"], ["'zero_fraction'"]),
        ("norms", ["l3"], ["'l3'", "l1, l2"]),
        ("abs_norms", ["L2"], ["'L2'", "did you mean 'l2'"]),
        ("save_raw_tensor", "yes", ["save_raw_tensor='yes'", "True or False"]),
        ("save_shape", 1, ["save_shape=1", "True or False"]),
    ],
)
def test_reduction_config_rejects_bad_values_in_constructor_and_assignment(field, value, needles):
    with pytest.raises(MltraceValueError) as info:
        ReductionConfig(**{field: value})
    _assert_clear(info.value, *needles)
    config = ReductionConfig(reductions=["min"], save_raw_tensor=True)
    with pytest.raises(MltraceValueError) as info:
        setattr(config, field, value)
    _assert_clear(info.value, *needles)
    assert config == ReductionConfig(reductions=["min"], save_raw_tensor=True)


@pytest.mark.parametrize(("token", "needle"), [
    ("abs_nan_count", "'nan_count'"), ("abs_l3_norm", "'abs_l3_norm'"), ("abs_", "'abs_'"),
    ("abs_abs_max", "'abs_abs_max'"),
])
def test_json_abs_prefix_on_reductions_that_have_no_abs_form(token, needle):
    with pytest.raises(MltraceValueError) as info:
        ReductionConfig.from_dict({"reductions": f"max,{token}"})
    _assert_clear(info.value, needle)


def test_reduction_list_edited_in_place_is_caught_before_any_file_is_written(tmp_path):
    """``config.reductions.append("mena")`` bypasses assignment: the first step catches it (it
    used to write a collections file no reader could open, then disable the hook)."""
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights"])
    hook.get_collection("weights").reduction_config = smd.ReductionConfig(reductions=["mean"])
    hook.get_collection("weights").reduction_config.reductions.append("mena")
    model = _model()
    hook.register_module(model)
    with pytest.raises(InvalidCollectionConfiguration) as info:
        model(torch.ones(1, 4))
    _assert_clear(info.value, "'weights'", "'mena'", "did you mean 'mean'")
    assert not (tmp_path / "run").exists()
    with pytest.raises(MltraceValueError, match="reduction_config='mean'"):
        hook.get_collection("biases").reduction_config = "mean"


# -- hook arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"include_regex": 5}, ["include_regex=5", "'fc1.*'"]),
        ({"include_regex": ["fc1", 5]}, ["include_regex 5"]),
        ({"include_collections": 5}, ["include_collections=5", "['weights']"]),
        ({"include_collections": ["weights", None]}, ["entry None", "'weights'"]),
        ({"include_collections": [""]}, ["entry ''"]),
        ({"reduction_config": {"reductions": "mean"}}, ["reduction_config=", "ReductionConfig"]),
    ],
)
def test_bad_hook_arguments(tmp_path, kwargs, needles):
    with pytest.raises(MltraceError) as info:
        smd.Hook(out_dir=str(tmp_path / "run"), **kwargs)
    _assert_clear(info.value, *needles)
    assert not (tmp_path / "run").exists()


def test_unknown_mode_raises_instead_of_disabling_the_hook(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights"])
    with pytest.raises(MltraceValueError) as info:
        hook.set_mode("TRAINING")
    _assert_clear(info.value, "'TRAINING'", "TRAIN", "EVAL")
    assert not hook.disabled
    hook.set_mode(smd.modes.TRAIN)
    model = _model()
    hook.register_module(model)
    model(torch.ones(1, 4))
    hook.close()
    assert create_trial(str(tmp_path / "run")).steps(mode=smd.modes.TRAIN) == [0]


# -- unknown collections -------------------------------------------------------------------------


def test_include_collections_name_without_collection_warns_once_listing_known(tmp_path, caplog):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weight", "biases"])
    model = _model()
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        for _ in range(3):
            model(torch.ones(1, 4))
        hook.add_collection(smd.Collection("extra", include_regex="^nothing$"))  # prepares again
        model(torch.ones(1, 4))
        hook.close()
    warnings = [r.getMessage() for r in caplog.records if "include_collections" in r.getMessage()]
    assert len(warnings) == 1, warnings
    for needle in ("'weight'", "Did you mean 'weights'", "Known collections: all, biases, default",
                   "get_collection(name).include(regex)", "save_tensor"):
        assert needle in warnings[0]
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(collection="biases") == ["Sequential_0.bias", "Sequential_2.bias"]


def test_collection_named_first_and_filled_after_the_hook_is_created_works(tmp_path, caplog):
    """smdebug's pattern: include_collections names it, get_collection(...).include fills it."""
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["mine", "by_save_tensor"])
    hook.get_collection("mine").include(r"^Sequential_2\.weight$")
    model = _model()
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        model(torch.ones(1, 4))
        hook.save_tensor("custom/value", np.arange(3.0), collections_to_write="by_save_tensor")
        hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(collection="mine") == ["Sequential_2.weight"]
    np.testing.assert_array_equal(trial.tensor("custom/value").value(0), np.arange(3.0))
    # by_save_tensor had no collection when the first step started: one warning, and it still
    # saves what save_tensor puts into it later, as the warning says.
    assert sum("by_save_tensor" in r.getMessage() for r in caplog.records) == 1
    assert not any("'mine'" in r.getMessage() for r in caplog.records)


def test_empty_collection_raises_at_first_step_suggesting_the_close_one(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), include_collections=["gradient"])
    hook.get_collection("gradient")  # created, never filled: a typo of "gradients"
    model = _model()
    hook.register_module(model)
    with pytest.raises(InvalidCollectionConfiguration) as info:
        model(torch.ones(1, 4))
    _assert_clear(info.value, "'gradient'", "include(", "did you mean the collection 'gradients'")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("names", [[None], ["weights", 3], [""]])
def test_save_tensor_into_bad_collection_names(tmp_path, names):
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    with pytest.raises(MltraceValueError, match="collections_to_write"):
        hook.save_tensor("t", np.ones(2), collections_to_write=names)
    assert not hook.disabled
    hook.close()


# -- JSON hook configuration -------------------------------------------------------------------


def _json_hook(tmp_path: Path, doc: object, text: str | None = None):
    path = tmp_path / "hook.json"
    path.write_text(text if text is not None else json.dumps(doc))
    return smd.Hook.create_from_json_file(str(path))


@pytest.mark.parametrize(
    ("doc", "needles"),
    [
        # misspelt keys are errors with strict on (without it, warnings: test_json_config.py)
        ({"LocalPath": "OUT", "HookParameters": {"strict": "true"}, "collectionconfigurations": []},
         ["'collectionconfigurations'", "'CollectionConfigurations'"]),
        ({"LocalPth": "OUT"}, ["'LocalPth'", "did you mean 'LocalPath'"]),
        ({"LocalPath": 5}, ["LocalPath=5", "string"]),
        ({"LocalPath": "OUT", "HookParameters": {"strict": "true", "save_intrval": "1"}},
         ["'save_intrval'", "did you mean 'save_interval'"]),
        ({"LocalPath": "OUT", "HookParameters": {"reductions": "mena"}}, ["'mena'", "did you mean 'mean'"]),
        ({"LocalPath": "OUT", "HookParameters": {"save_interval": "1", "end_step": "0", "start_step": "3",
                                                 "train.end_step": "3"}},
         ["train.end_step='3'", "start_step='3'", "end_step > start_step"]),
        ({"LocalPath": "OUT", "CollectionConfigurations": {"weights": {}}},
         ["CollectionConfigurations must be a list"]),
        ({"LocalPath": "OUT", "HookParameters": {"strict": "true"},
          "CollectionConfigurations": [{"CollectionName": "weights", "CollectionParams": {}}]},
         ["'CollectionParams'", "did you mean 'CollectionParameters'"]),
        ({"LocalPath": "OUT",
          "CollectionConfigurations": [{"CollectionName": "weights", "CollectionParameters": ["x"]}]},
         ["CollectionParameters must be an object", "'weights'"]),
    ],
)
def test_bad_json_files(tmp_path, doc, needles):
    doc = json.loads(json.dumps(doc).replace('"OUT"', json.dumps(str(tmp_path / "run"))))
    with pytest.raises(MltraceValueError) as info:
        _json_hook(tmp_path, doc)
    _assert_clear(info.value, "hook.json", *needles)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text", ["", "{", '{"LocalPath": "x",}', "[1, 2]", "null", '"LocalPath"'])
def test_malformed_json_file_through_create_from_json_file(tmp_path, text):
    with pytest.raises(MltraceValueError, match="hook.json"):
        _json_hook(tmp_path, None, text)


def test_unrelated_top_level_keys_are_ignored_with_a_warning(tmp_path, caplog):
    doc = {"LocalPath": str(tmp_path / "run"), "S3OutputPath": "s3://bucket/x", "RuleConfigurations": []}
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        hook = _json_hook(tmp_path, doc)
    assert [r.getMessage() for r in caplog.records if "top-level" in r.getMessage()] == [
        f"{tmp_path / 'hook.json'}: ignoring the top-level key 'RuleConfigurations'; mltrace reads "
        "['LocalPath', 'HookParameters', 'CollectionConfigurations', 'S3OutputPath', 'S3Path', "
        "'FlightRecorder']"]
    hook.close()


def test_json_collection_without_regex_raises_at_first_step(tmp_path):
    doc = {"LocalPath": str(tmp_path / "run"), "HookParameters": {"save_interval": "1"},
           "CollectionConfigurations": [{"CollectionName": "bias"}]}
    hook = _json_hook(tmp_path, doc)
    model = _model()
    hook.register_module(model)
    with pytest.raises(InvalidCollectionConfiguration) as info:
        model(torch.ones(1, 4))
    _assert_clear(info.value, "'bias'", "did you mean the collection 'biases'")
    assert not (tmp_path / "run").exists()


# -- out_dir -------------------------------------------------------------------------------------


def _keras_hook(out_dir: str, scratch: Path):
    import mltrace.tensorflow as tfsmd

    return tfsmd.KerasHook(out_dir=out_dir)


def _xgboost_hook(out_dir: str, scratch: Path):
    import mltrace.xgboost as xsmd

    return xsmd.Hook(out_dir=out_dir)


def _json_config_hook(out_dir: str, scratch: Path):
    path = scratch / "out_dir_hook.json"
    path.write_text(json.dumps({"LocalPath": out_dir, "HookParameters": {"save_interval": "1"}}))
    return smd.Hook.create_from_json_file(str(path))


#: Every way to build a hook on an out_dir: (out_dir, a scratch folder for config files).
BUILDERS = {"pytorch": lambda d, scratch: smd.Hook(out_dir=d), "keras": _keras_hook,
            "xgboost": _xgboost_hook, "json": _json_config_hook}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    return _finished_run(tmp_path_factory.mktemp("finished") / "run")


@pytest.mark.parametrize("adapter", ["keras", "xgboost", "json"])
def test_finished_run_is_refused_by_every_adapter_and_left_untouched(finished, adapter):
    before = _tree(finished)
    with pytest.raises(MltraceRuntimeError) as info:
        BUILDERS[adapter](str(finished), finished.parent)
    _assert_clear(info.value, str(finished), "finished run", paths.END_OF_JOB_MARKER, "new out_dir")
    assert _tree(finished) == before


def test_dry_run_on_a_finished_run_writes_nothing(finished):
    before = _tree(finished)
    hook = smd.Hook(out_dir=str(finished), dry_run=True, save_config=smd.SaveConfig(save_interval=1))
    model = _model()
    hook.register_module(model)
    model(torch.ones(1, 4))
    hook.close()
    assert _tree(finished) == before


@pytest.mark.parametrize("adapter", list(BUILDERS))
@pytest.mark.parametrize("where", ["file", "inside_file"])
def test_out_dir_that_is_a_file_is_refused_when_the_hook_is_built(tmp_path, adapter, where):
    target = tmp_path / "not_a_dir.txt"
    target.write_text("keep me")
    out_dir = target if where == "file" else target / "run"
    with pytest.raises(MltraceValueError) as info:
        BUILDERS[adapter](str(out_dir), tmp_path)
    _assert_clear(info.value, str(out_dir), "is a file" if where == "file" else "which is a file", "directory")
    assert target.read_text() == "keep me"


_DROP_CAPS = """
import ctypes, json, os, sys
# Drop CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER (bits 1-3) from this thread, so that
# root, too, obeys file permissions; threads started later inherit the reduced set.
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]
if os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()
    mask = ~0b1110 & 0xFFFFFFFF
    ok = libc.capget(ctypes.byref(header), data) == 0
    data[0].effective &= mask; data[0].permitted &= mask; data[0].inheritable &= mask
    if not ok or libc.capset(ctypes.byref(header), data) != 0:
        print(json.dumps({"skip": "cannot drop capabilities"})); sys.exit(0)
out_dir = sys.argv[1]
try:
    open(os.path.join(os.path.dirname(out_dir), "probe"), "w").close()
    print(json.dumps({"skip": "the locked folder is still writable"})); sys.exit(0)
except PermissionError:
    pass
import mltrace.pytorch as smd
try:
    smd.Hook(out_dir=out_dir)
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="drops Linux capabilities to test permissions as root")
def test_out_dir_without_write_permission_is_refused_when_the_hook_is_built(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        result = subprocess.run([sys.executable, "-c", _DROP_CAPS, str(locked / "run")], cwd=REPO,
                                capture_output=True, text=True, timeout=120, check=True)
    finally:
        locked.chmod(0o755)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])  # only this subcase: permissions cannot be enforced here
    assert report["error"] == "MltraceValueError", report
    for needle in (str(locked / "run"), "cannot be written", str(locked), "directory you can write to"):
        assert needle in report["message"]
    assert list(locked.iterdir()) == []


# -- odd tensor names ------------------------------------------------------------------------------

NAMES = [
    "a/b", "a//b", "../../escape", "escape", "..", "./x", "/etc/passwd", "权重/λ", "😀",
    "x\x00y", "x\ny", "tab\there", "n" * 5000, "n" * 4999 + "m", "a.b*c[0]", "a:b (%)", "(x)+?|^$",
]
BAD_NAMES = [("", MltraceValueError, "empty"), ("x\ud800", MltraceValueError, "UTF-8"),
             (5, MltraceTypeError, "int"), (None, MltraceTypeError, "NoneType"),
             (b"bytes", MltraceTypeError, "bytes")]


def _outside(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], out_rel: str) -> set[str]:
    """Paths new or changed in ``after``, outside out_dir and MLflow's own store."""
    changed = {p for p, v in after.items() if before.get(p) != v}
    return {p for p in changed if not (p == out_rel or p.startswith(out_rel + os.sep)
                                       or p.split(os.sep)[0] == "mlruns" or p.startswith("mlflow.db"))
            and not out_rel.startswith(p + os.sep)}  # out_dir's own parent folders


def test_odd_names_round_trip_to_trial_tensorboard_and_mlflow_and_stay_inside_out_dir(tmp_path, tracking):
    out_dir = tmp_path / "nested" / "deeper" / "run"
    # Other pytest sessions may add folders beside tmp_path.parent, so above it only the paths
    # an escape would create are checked ('../../escape' from the cwd, tmp_path, or from out_dir).
    siblings_before = sorted(os.listdir(tmp_path.parent))
    escapes = [tmp_path.parent.parent / "escape", tmp_path.parent / "escape", Path("/escape")]
    assert not any(p.exists() for p in escapes)
    passwd_before = os.stat("/etc/passwd").st_mtime_ns
    tree_before = _tree(tmp_path)

    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["default"], export_tensorboard=True, mlflow=True)
    model = _model()
    hook.register_module(model)
    for step in range(2):
        model(torch.ones(1, 4))
        for i, name in enumerate(NAMES):
            hook.save_tensor(name, np.array([i, step], dtype=np.float32))
            hook.save_scalar(name, float(i + 100 * step))
        for bad, kind, needle in BAD_NAMES:
            for save in (lambda: hook.save_tensor(bad, np.ones(2)), lambda: hook.save_scalar(bad, 1.0)):
                with pytest.raises(kind, match=needle):
                    save()
    run_id = hook.sinks[0].run_id
    hook.close()
    assert not hook.disabled

    # 1. The trial holds every name exactly, with its values.
    trial = create_trial(str(out_dir))
    names = set(trial.tensor_names())
    for i, name in enumerate(NAMES):
        assert name in names and "scalar/" + name in names, repr(name[:20])
        for step in range(2):
            np.testing.assert_array_equal(trial.tensor(name).value(step), [i, step])
            assert trial.tensor("scalar/" + name).value(step).item() == i + 100 * step
    assert len(names) == 2 * len(NAMES)

    # 2. TensorBoard reads every summary, under smdebug's cleaned tags.
    runs = os.listdir(out_dir / "tensorboard")
    assert runs == ["GLOBAL"]
    acc = ea.EventAccumulator(str(out_dir / "tensorboard" / "GLOBAL"),
                              size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {clean_tag("scalar/" + n) for n in NAMES}
    # each tensor its own histogram: names that clean to one tag ("x\x00y", "x\ny") are numbered
    histograms = set(acc.Tags()["histograms"])
    assert len(histograms) == len(NAMES)
    assert {"default/" + clean_tag(n) for n in NAMES} | {"default/x_y_1"} == histograms
    assert acc.Scalars(clean_tag("scalar/权重/λ"))[1].value == NAMES.index("权重/λ") + 100

    # 3. MLflow: one valid metric per name, none refused, none shared with another name.
    metrics = MlflowClient().get_run(run_id).data.metrics
    assert len(metrics) == len(NAMES)
    histories = set()
    for key in metrics:
        _validate_metric_name(key)
        assert len(key) <= 250
        history = MlflowClient().get_metric_history(run_id, key)
        histories.add(tuple(m.value for m in sorted(history, key=lambda m: m.step)))
    assert histories == {(float(i), float(i + 100)) for i in range(len(NAMES))}
    for kept in ("a/b", "escape", "权重/λ", "a.b_c_0_", "a:b ___"):
        assert kept in metrics

    # 4. Nothing outside out_dir, except MLflow's own store (mlflow.db, mlruns/ artifacts).
    tree_after = _tree(tmp_path)
    assert _outside(tree_before, tree_after, str(out_dir.relative_to(tmp_path))) == set()
    artifacts = {p for p in tree_after if p.startswith("mlruns") and p not in tree_before}
    logged = re.compile(r"/artifacts(/mltrace(/(collections|tensorboard|summary).*)?)?$")
    assert all("/artifacts" not in p or logged.search(p) for p in artifacts), artifacts
    components = {part for p in tree_after for part in Path(p).parts}
    assert not components & {"escape", "passwd", "etc", "权重", "λ", "😀", "n" * 255}
    assert sorted(os.listdir(tmp_path.parent)) == siblings_before
    assert not any(p.exists() for p in escapes)
    assert os.stat("/etc/passwd").st_mtime_ns == passwd_before


MODULE_NAMES = ["a/b", "权重λ", "😀", "x\ny", "x\x00y", "sp ace", "m" * 5000]


def test_odd_module_names_are_saved_and_read_back_exactly(tmp_path):
    model = torch.nn.Module()
    for name in MODULE_NAMES:
        model.add_module(name, torch.nn.Linear(2, 1))
    model.forward = lambda x: sum(m(x) for m in model.children())  # type: ignore[method-assign]
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    save_all=True, export_tensorboard=True)
    hook.register_module(model)
    for _ in range(2):
        model(torch.ones(1, 2)).sum().backward()
    hook.record_tensor_value("权重/../x\n", torch.tensor([7.0]))
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    names = set(trial.tensor_names())
    for name in MODULE_NAMES:
        sub = model.get_submodule(name)
        np.testing.assert_array_equal(trial.tensor(f"Module_{name}.weight").value(1),
                                      sub.weight.detach().numpy())
        assert f"gradient/Module_{name}.weight" in names
        assert f"{name}_output_0" in names
    np.testing.assert_array_equal(trial.tensor("权重/../x\n_output_0").value(1), [7.0])
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_module_name_that_utf8_cannot_store_is_refused_at_registration(tmp_path):
    model = torch.nn.Module()
    model.add_module("bad\ud800", torch.nn.Linear(2, 1))  # torch allows it
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    with pytest.raises(MltraceValueError) as info:
        hook.register_module(model)
    _assert_clear(info.value, "module name", "UTF-8")
    assert not hook.disabled
    with pytest.raises(MltraceValueError, match="record_tensor_value name is empty"):
        hook.record_tensor_value("", torch.ones(1))


# -- names through the reader ------------------------------------------------------------------


def test_tensor_names_regex_with_metacharacters_in_names(tmp_path):
    tricky = ["a.b*c[0]", "(x)+?", "a|b", "^$", "back\\slash", "权重.λ", "dot.", "dotX"]
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    model = _model()
    hook.register_module(model)
    model(torch.ones(1, 4))
    for name in tricky:
        hook.save_tensor(name, np.ones(1))
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    for name in tricky:
        assert trial.tensor_names(regex="^" + re.escape(name) + "$") == [name]
    assert trial.tensor_names(regex=r"^dot\.$") == ["dot."]
    assert trial.tensor_names(regex="^dot.$") == ["dot.", "dotX"]  # unescaped: '.' is any char
    assert trial.tensor_names(regex=["^a\\|b$", "^\\^\\$$"]) == ["^$", "a|b"]
    for bad in ("a.b*c[0", "(x", "*", ["ok", "[bad"]):
        with pytest.raises(MltraceValueError) as info:
            trial.tensor_names(regex=bad)
        _assert_clear(info.value, "not a valid regular expression", "re.escape(name)")
