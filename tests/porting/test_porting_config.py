"""smdebug-era configuration that must keep working after the import sed (issue 18): JSON hook
configurations as smdebug's own tests and SageMaker wrote them, with keys smdebug ignored, and
the configs' smdebug ``to_json``/``from_json``. tests/legacy/test_smdebug_porting_config.py
checks the same JSON against real smdebug 1.0.34."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import mltrace.pytorch as smd
from mltrace.capture import json_config
from mltrace.capture.json_config import parse_hook_config
from mltrace.collections import Collection
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.trials import create_trial
from tests.support.smdebug_era_configs import SMDEBUG_ERA_CONFIGS, write_config
from tests.support.torch_training import make_model, train


@pytest.mark.parametrize("name", sorted(SMDEBUG_ERA_CONFIGS))
def test_smdebug_era_configurations_build_a_hook_that_trains(tmp_path, name):
    hook = smd.Hook.create_from_json_file(write_config(tmp_path, name, SMDEBUG_ERA_CONFIGS[name]))
    model = make_model()
    hook.register_module(model)
    train(model, hook, 3, mode=smd.modes.TRAIN)
    hook.close()
    for entry in SMDEBUG_ERA_CONFIGS[name].get("CollectionConfigurations", []):
        assert entry["CollectionName"] in hook.get_collections()


def test_without_a_path_or_variable_sagemakers_file_is_read(tmp_path, monkeypatch):
    """smdebug read /opt/ml/input/config/debughookconfig.json when nothing named a file: a
    script on SageMaker calls create_from_json_file() with no variable set."""
    for variable in json_config.CONFIG_ENV_VARS:
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(FileNotFoundError, match="debughookconfig.json"):
        smd.Hook.create_from_json_file()
    path = write_config(tmp_path, "sm", SMDEBUG_ERA_CONFIGS["sagemaker_sdk"])
    monkeypatch.setattr(json_config, "SAGEMAKER_CONFIG_FILE", path)
    hook = smd.Hook.create_from_json_file()
    assert hook.out_dir == str(tmp_path / "sm")
    assert hook.get_collection("gradients").save_config.get_save_config("TRAIN").save_interval == 10
    hook.close()


def test_save_shape_alone_keeps_the_raw_tensors_smdebug_saved(tmp_path):
    """smdebug read save_shape only beside reductions and saved raw tensors otherwise: the same
    file must not leave a ported job with shapes only."""
    hook = smd.Hook.create_from_json_file(
        write_config(tmp_path, "shape", SMDEBUG_ERA_CONFIGS["pytorch_save_shape"]))
    model = make_model()
    hook.register_module(model)
    captured = train(model, hook, 2, mode=smd.modes.TRAIN)
    hook.close()
    trial = create_trial(str(tmp_path / "shape"))
    weight = trial.tensor("Sequential_0.weight")
    assert np.array_equal(weight.value(1), captured.values["Sequential_0.weight"][1])
    assert tuple(weight.shape(1)) == captured.values["Sequential_0.weight"][1].shape


def test_xgboost_trains_from_smdebugs_xgboost_configuration(tmp_path, caplog):
    """The issue's case: smdebug's XGBoost test configuration, include_collections and all."""
    import xgboost as xgb

    import mltrace.xgboost as xsmd
    from tests.support.xgboost_training import make_data

    doc = {**SMDEBUG_ERA_CONFIGS["xgboost_full"],
           "CollectionConfigurations": [{"CollectionName": "metrics",
                                         "CollectionParameters": {"save_interval": "1"}}]}
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        hook = xsmd.Hook.create_from_json_file(write_config(tmp_path, "xgb", doc))
    assert "include_collections" in caplog.text
    train, valid = make_data()
    xgb.train({"max_depth": 2}, train, num_boost_round=3, evals=[(valid, "validation")],
              callbacks=[hook])
    hook.close()
    trial = create_trial(str(tmp_path / "xgb"))
    assert trial.tensor_names(collection="metrics") == ["validation-rmse"]
    # the collection's save_interval 1 layers over the hook's start_step 1, as in smdebug
    assert trial.tensor("validation-rmse").steps() == [1, 2]


def test_keys_smdebug_ignored_warn_with_advice_and_change_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        config = parse_hook_config(json.loads(open(write_config(
            tmp_path, "x", SMDEBUG_ERA_CONFIGS["xgboost_full"])).read()), "xgb.json")
    [warning] = [r.getMessage() for r in caplog.records if "include_collections" in r.getMessage()]
    assert "xgb.json HookParameters" in warning and "smdebug ignored it too" in warning
    assert "CollectionConfigurations" in warning
    # the collections are the configured ones, as smdebug's were
    assert config.hook_kwargs["include_collections"] == ["collection_obj_name1"]
    assert config.hook_kwargs["save_config"].get_save_config(ModeKeys.TRAIN) == SaveConfigMode(
        save_interval=100, start_step=1, save_steps=[1, 2, 3, 4])


@pytest.mark.parametrize(
    ("doc", "needles"),
    [
        ({"HookParameters": {"save_intrval": "3"}},
         ["HookParameters", "'save_intrval'", "did you mean 'save_interval'?"]),
        ({"CollectionConfigurations": [{"CollectionName": "weights",
                                        "CollectionParameters": {"save_histogramm": "false"}}]},
         ["collection 'weights'", "'save_histogramm'", "did you mean 'save_histogram'?"]),
        ({"CollectionConfigurations": [{"CollectionName": "weights", "CollectionParams": {}}]},
         ["CollectionConfigurations[0]", "did you mean 'CollectionParameters'?"]),
        ({"HookParameter": {"save_interval": "3"}},
         ["top-level key 'HookParameter'", "did you mean 'HookParameters'?"]),
    ],
)
def test_unknown_keys_warn_with_the_closest_key(tmp_path, caplog, doc, needles):
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        config = parse_hook_config({"LocalPath": str(tmp_path), **doc}, "cfg.json")
    text = "\n".join(r.getMessage() for r in caplog.records)
    for needle in ["cfg.json", *needles]:
        assert needle in text
    assert "save_config" not in config.hook_kwargs  # the misspelt setting is not used


@pytest.mark.parametrize(
    ("params", "needle"),
    [({"include_collections": "weights", "save_interval": "ten"}, "save_interval='ten'"),
     ({"save_all": "sometimes"}, "'sometimes'"),
     ({"reductions": "mean,l3_norm"}, "'l3_norm'")],
)
def test_invalid_values_still_error(tmp_path, params, needle):
    with pytest.raises(MltraceValueError, match=needle):
        parse_hook_config({"LocalPath": str(tmp_path), "HookParameters": params}, "cfg.json")


# -- to_json / from_json ---------------------------------------------------------------------


def _configs():
    save = SaveConfig(mode_save_configs={
        ModeKeys.TRAIN: SaveConfigMode(save_interval=3, save_steps=[1, 7], end_step=50),
        "EVAL": {"start_step": 2}}, when_nan=["loss"])
    reduction = ReductionConfig(reductions=["nan_count", "min", "median"], abs_reductions=["max"],
                                norms=["l2"], abs_norms=["l1"], save_raw_tensor=True,
                                save_shape=True)
    collection = Collection("fc", include_regex=["^fc1", "bias$"], tensor_names=["b", "a"],
                            reduction_config=reduction, save_config=save, save_histogram=False)
    return save, reduction, collection


def test_to_json_round_trips_exactly():
    for config in _configs() + (SaveConfig(), ReductionConfig(), Collection("plain")):
        text = config.to_json()
        again = type(config).from_json(text)
        assert again == config and again.to_json() == text
        expected = config.to_json_dict()  # smdebug's to_json is its to_json_dict as text
        if isinstance(config, ReductionConfig) and config.extra_reductions_string():
            expected["mltrace_reductions"] = config.extra_reductions_string()
        assert json.loads(text) == json.loads(json.dumps(expected))


def test_to_json_keeps_mltraces_own_reductions_out_of_smdebugs_string():
    _, reduction, collection = _configs()
    doc = json.loads(reduction.to_json())
    assert doc == {"save_raw_tensor": True, "reductions": "min,l2_norm,abs_max,abs_l1_norm",
                   "save_shape": True, "mltrace_reductions": "nan_count,median"}
    assert ReductionConfig.from_json(reduction.to_json()).reductions == ["min", "nan_count",
                                                                        "median"]
    assert json.loads(collection.to_json())["mltrace_reductions"] == "nan_count,median"


@pytest.mark.parametrize(
    ("cls", "text", "needle"),
    [(SaveConfig, "{", "not JSON"), (ReductionConfig, "[1]", "not a JSON object"),
     (ReductionConfig, '{"reductions": "mena"}', "did you mean 'mean'"),
     (Collection, '{"include_regex": []}', "with a name"), (SaveConfig, "null", "JSON object")],
)
def test_from_json_errors_name_the_problem(cls, text, needle):
    with pytest.raises(MltraceValueError, match=needle):
        cls.from_json(text)
