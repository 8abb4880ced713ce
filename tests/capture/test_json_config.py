"""smdebug's JSON hook configuration (debughookconfig.json): parsing, env vars, errors."""

from __future__ import annotations

import json

import pytest

from mltrace.capture.json_config import config_file_path, load_hook_config, parse_hook_config
from mltrace.config import ReductionConfig, SaveConfigMode
from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys

SMDEBUG_CONFIG = {
    "LocalPath": "/tmp/mltrace-out",
    "S3Path": "s3://bucket/prefix/debug-output",
    "HookParameters": {
        "save_interval": "10",
        "train.save_interval": "5",
        "eval.end_step": "30",
        "save_steps": "1,2",
        "include_regex": "a.*,b.*",
        "reductions": "mean,abs_max",
        "save_raw_tensor": "true",
        "export_tensorboard": "false",
        "include_workers": "all",
        "save_all": "False",
    },
    "CollectionConfigurations": [
        {
            "CollectionName": "weights",
            "CollectionParameters": {
                "save_interval": "100",
                "include_regex": "w.*, v$",
                "save_histogram": "false",
            },
        },
        {"CollectionName": "losses"},
        {
            "CollectionName": "gradients",
            "CollectionParameters": {"reductions": "l2_norm,abs_l1", "save_shape": "true"},
        },
        {"CollectionName": "biases", "CollectionParameters": {"predict.save_interval": "3"}},
    ],
}


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "debughookconfig.json"
    path.write_text(json.dumps(SMDEBUG_CONFIG))
    return path


@pytest.fixture
def no_config_env(monkeypatch):
    monkeypatch.delenv("MLTRACE_CONFIG_FILE_PATH", raising=False)
    monkeypatch.delenv("SMDEBUG_CONFIG_FILE_PATH", raising=False)


def mode_dict(save_config, mode):
    return save_config.get_save_config(mode).to_json_dict()


def test_hook_kwargs(config_file):
    config = load_hook_config(str(config_file))
    kwargs = config.hook_kwargs
    assert config.path == str(config_file)
    assert kwargs["out_dir"] == "/tmp/mltrace-out"
    assert kwargs["include_regex"] == ["a.*", "b.*"]
    assert kwargs["export_tensorboard"] is False
    assert kwargs["save_all"] is False
    assert kwargs["include_workers"] == "all"
    assert kwargs["include_collections"] == ["weights", "losses", "gradients", "biases"]
    assert kwargs["reduction_config"] == ReductionConfig(
        reductions=["mean"], abs_reductions=["max"], save_raw_tensor=True
    )


def test_hook_save_config_per_mode(config_file):
    save_config = load_hook_config(str(config_file)).hook_kwargs["save_config"]
    assert mode_dict(save_config, ModeKeys.TRAIN) == {
        "save_interval": 5,
        "save_steps": [1, 2],
        "start_step": 0,
        "end_step": None,
    }
    assert mode_dict(save_config, ModeKeys.EVAL) == {
        "save_interval": 10,
        "save_steps": [1, 2],
        "start_step": 0,
        "end_step": 30,
    }
    for mode in (ModeKeys.PREDICT, ModeKeys.GLOBAL):
        assert mode_dict(save_config, mode) == {
            "save_interval": 10,
            "save_steps": [1, 2],
            "start_step": 0,
            "end_step": None,
        }
    assert save_config.should_save_step(ModeKeys.TRAIN, 15)
    assert not save_config.should_save_step(ModeKeys.EVAL, 40)


def test_collection_settings(config_file):
    collections = load_hook_config(str(config_file)).collections
    assert set(collections) == {"weights", "losses", "gradients", "biases"}
    assert collections["losses"] == {}
    weights = collections["weights"]
    assert weights["include_regex"] == ["w.*", "v$"]
    assert weights["save_histogram"] is False
    gradients = collections["gradients"]
    assert gradients["reduction_config"] == ReductionConfig(
        norms=["l2"], abs_norms=["l1"], save_shape=True
    )
    assert "save_config" not in gradients


def test_collection_save_config_inherits_hook_values_per_mode(config_file):
    biases = load_hook_config(str(config_file)).collections["biases"]["save_config"]
    assert biases.get_save_config(ModeKeys.PREDICT).save_interval == 3
    assert biases.get_save_config(ModeKeys.TRAIN).save_interval == 5  # hook's train.save_interval
    assert biases.get_save_config(ModeKeys.EVAL).to_json_dict() == {
        "save_interval": 10,
        "save_steps": [1, 2],
        "start_step": 0,
        "end_step": 30,
    }


def test_collection_plain_key_overrides_hook_mode_key(config_file):
    # smdebug (json_config.parse_save_config_modes_dict): the collection's own settings take
    # precedence over the hook's per-mode ones; only keys the collection leaves out are inherited.
    weights = load_hook_config(str(config_file)).collections["weights"]["save_config"]
    for mode in ModeKeys:
        assert weights.get_save_config(mode).save_interval == 100
    assert weights.get_save_config(ModeKeys.EVAL).end_step == 30
    assert weights.get_save_config(ModeKeys.TRAIN).save_steps == [1, 2]


def test_hook_parameters_may_be_null_or_absent():
    for doc in ({"LocalPath": "/out", "HookParameters": None}, {"LocalPath": "/out"}):
        config = parse_hook_config(doc)
        assert config.hook_kwargs == {"out_dir": "/out", "include_collections": None}
        assert config.collections == {}


def test_json_values_may_be_native_types():
    config = parse_hook_config(
        {
            "LocalPath": "/out",
            "HookParameters": {
                "save_interval": 20,
                "save_steps": [4, 2],
                "save_all": True,
                "include_regex": ["x", "y"],
            },
            "CollectionConfigurations": [
                {"CollectionName": "c", "CollectionParameters": {"save_histogram": True}}
            ],
        }
    )
    assert config.hook_kwargs["save_all"] is True
    assert config.hook_kwargs["include_regex"] == ["x", "y"]
    assert mode_dict(config.hook_kwargs["save_config"], ModeKeys.GLOBAL) == {
        "save_interval": 20,
        "save_steps": [2, 4],
        "start_step": 0,
        "end_step": None,
    }
    assert config.collections["c"] == {"save_histogram": True}


def test_mode_prefixed_keys_without_plain_ones():
    config = parse_hook_config({"LocalPath": "/out", "HookParameters": {"eval.save_steps": "3,9"}})
    save_config = config.hook_kwargs["save_config"]
    assert save_config.get_save_config(ModeKeys.EVAL) == SaveConfigMode(save_steps=[3, 9])
    assert save_config.get_save_config(ModeKeys.TRAIN) == SaveConfigMode()


# -- where the file comes from -----------------------------------------------------------------


def test_config_file_path_prefers_argument(config_file, monkeypatch, tmp_path):
    other = tmp_path / "other.json"
    other.write_text("{}")
    monkeypatch.setenv("MLTRACE_CONFIG_FILE_PATH", str(other))
    assert config_file_path(str(config_file)) == str(config_file)


def test_config_file_path_from_mltrace_env(config_file, monkeypatch, no_config_env):
    monkeypatch.setenv("MLTRACE_CONFIG_FILE_PATH", str(config_file))
    assert config_file_path() == str(config_file)
    assert load_hook_config().hook_kwargs["out_dir"] == "/tmp/mltrace-out"


def test_config_file_path_from_smdebug_env(config_file, monkeypatch, no_config_env):
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(config_file))
    assert config_file_path() == str(config_file)


def test_mltrace_env_wins_over_smdebug_env(config_file, monkeypatch, tmp_path, no_config_env):
    other = tmp_path / "smdebug.json"
    other.write_text("{}")
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(other))
    monkeypatch.setenv("MLTRACE_CONFIG_FILE_PATH", str(config_file))
    assert config_file_path() == str(config_file)
    monkeypatch.setenv("MLTRACE_CONFIG_FILE_PATH", "")
    assert config_file_path() == str(other)


def test_no_config_file_named(no_config_env):
    with pytest.raises(FileNotFoundError, match="MLTRACE_CONFIG_FILE_PATH"):
        config_file_path()


def test_missing_config_file(monkeypatch, tmp_path, no_config_env):
    missing = tmp_path / "nope.json"
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(missing))
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_hook_config()


@pytest.mark.parametrize("text", ["", "{not json", '{"LocalPath": "/x",}'])
def test_invalid_json_names_the_file(tmp_path, text):
    path = tmp_path / "broken_config.json"
    path.write_text(text)
    with pytest.raises(MltraceValueError, match="broken_config.json"):
        load_hook_config(str(path))


# -- errors name the key and the value ---------------------------------------------------------


@pytest.mark.parametrize(
    ("hook_params", "needles"),
    [
        ({"strict": "true", "save_intervl": "10"}, ["save_intervl", "save_interval"]),
        ({"strict": "true", "train.save_intervall": "10"}, ["train.save_intervall"]),
        ({"save_interval": "abc"}, ["save_interval", "'abc'"]),
        ({"save_interval": "0"}, ["save_interval", "'0'"]),
        ({"end_step": "-1"}, ["end_step", "'-1'"]),
        ({"start_step": "10", "end_step": "5"}, ["end_step=5", "start_step=10"]),
        ({"save_steps": "1,x"}, ["save_steps", "'x'"]),
        ({"reductions": "mean,bogus"}, ["'bogus'", "abs_"]),
        ({"export_tensorboard": "maybe"}, ["export_tensorboard", "'maybe'"]),
        ({"save_all": "yes"}, ["save_all", "'yes'"]),
        ({"save_raw_tensor": "maybe"}, ["save_raw_tensor", "'maybe'"]),
    ],
)
def test_bad_hook_parameters(hook_params, needles):
    with pytest.raises(MltraceValueError) as info:
        parse_hook_config({"LocalPath": "/out", "HookParameters": hook_params}, "cfg.json")
    message = str(info.value)
    assert "cfg.json" in message
    for needle in needles:
        assert needle in message


def test_bad_mode_prefixed_value_names_the_prefixed_key():
    with pytest.raises(MltraceValueError) as info:
        parse_hook_config(
            {
                "LocalPath": "/out",
                "HookParameters": {"save_interval": "10", "train.save_interval": "0"},
            },
            "cfg.json",
        )
    assert "train.save_interval" in str(info.value)
    assert "'0'" in str(info.value)


@pytest.mark.parametrize(
    ("params", "needles"),
    [
        ({"save_interval": "-3"}, ["save_interval", "'-3'", "'weights'"]),
        ({"save_histogram": "nah"}, ["save_histogram", "'nah'"]),
        ({"reductions": "l3_norm"}, ["'l3_norm'"]),
    ],
)
def test_bad_collection_parameters(params, needles):
    doc = {
        "LocalPath": "/out",
        "CollectionConfigurations": [{"CollectionName": "weights", "CollectionParameters": params}],
    }
    with pytest.raises(MltraceValueError) as info:
        parse_hook_config(doc, "cfg.json")
    for needle in needles:
        assert needle in str(info.value)


@pytest.mark.parametrize(
    ("params", "needles"),
    [
        ({"bogus": "1"}, ["'bogus'", "'weights'"]),
        ({"include_workers": "all"}, ["include_workers"]),
    ],
)
def test_unknown_collection_parameters_are_errors_when_strict(params, needles):
    doc = {
        "LocalPath": "/out", "HookParameters": {"strict": "true"},
        "CollectionConfigurations": [{"CollectionName": "weights", "CollectionParameters": params}],
    }
    with pytest.raises(MltraceValueError) as info:
        parse_hook_config(doc, "cfg.json")
    for needle in [*needles, "strict"]:
        assert needle in str(info.value)


@pytest.mark.parametrize(
    "doc",
    [
        {"HookParameters": {}},
        {"LocalPath": "/out", "HookParameters": ["save_interval"]},
        {"LocalPath": "/out", "CollectionConfigurations": [{"CollectionParameters": {}}]},
        {"LocalPath": "/out", "CollectionConfigurations": ["weights"]},
        ["LocalPath"],
    ],
)
def test_malformed_documents(doc):
    with pytest.raises(MltraceValueError, match="cfg.json"):
        parse_hook_config(doc, "cfg.json")
