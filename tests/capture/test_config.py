"""SaveConfig / SaveConfigMode / ReductionConfig: smdebug's documented semantics and JSON."""

from __future__ import annotations

import json

import pytest

from mltrace.capture.hook import Hook, HookOptions
from mltrace.collections import CollectionManager
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys

ALL_MODES = list(ModeKeys)


def saved_steps(config: SaveConfig, mode: ModeKeys = ModeKeys.TRAIN, upto: int = 1101) -> list[int]:
    return [step for step in range(upto) if config.should_save_step(mode, step)]


# -- SaveConfig: the examples of smdebug's documentation -------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, [0, 500, 1000]),
        ({"save_interval": 100, "end_step": 200}, [0, 100]),
        ({"save_interval": 100, "end_step": 201}, [0, 100, 200]),
        (
            {"save_interval": 100, "start_step": 150},
            [200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100],
        ),
        ({"save_steps": [3, 7]}, [0, 3, 7, 500, 1000]),
        (
            {"save_interval": 100, "start_step": 150, "save_steps": [3]},
            [3, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100],
        ),
        ({"save_interval": 1, "end_step": 0}, []),
        ({"save_interval": 1, "start_step": 2, "end_step": 5}, [2, 3, 4]),
        ({"save_interval": "100", "end_step": "201", "save_steps": "3,7"}, [0, 3, 7, 100, 200]),
    ],
)
def test_save_config_documented_examples(kwargs, expected):
    config = SaveConfig(**kwargs)
    for mode in ALL_MODES:
        assert saved_steps(config, mode) == expected


def test_save_steps_override_range_limits():
    config = SaveConfig(save_interval=10, start_step=50, end_step=60, save_steps=[1, 99])
    assert saved_steps(config, upto=200) == [1, 50, 99]


def test_modulo_is_on_the_step_not_on_step_minus_start():
    assert saved_steps(SaveConfig(save_interval=100, start_step=150), upto=301) == [200, 300]


def test_save_config_mode_defaults():
    mode = SaveConfigMode()
    assert (mode.save_interval, mode.start_step, mode.end_step, mode.save_steps) == (
        500,
        0,
        None,
        [],
    )
    assert [s for s in range(1001) if mode.should_save_step(s)] == [0, 500, 1000]


def test_save_steps_parsing():
    assert SaveConfigMode(save_steps="7, 3,3,").save_steps == [3, 7]
    assert SaveConfigMode(save_steps=(5, 1)).save_steps == [1, 5]


# -- per-mode configs --------------------------------------------------------------------------


def test_per_mode_configs_with_simple_form_for_the_rest():
    config = SaveConfig(
        {ModeKeys.TRAIN: SaveConfigMode(save_interval=2), "eval": {"save_interval": 3}},
        save_interval=7,
    )
    assert saved_steps(config, ModeKeys.TRAIN, 9) == [0, 2, 4, 6, 8]
    assert saved_steps(config, ModeKeys.EVAL, 9) == [0, 3, 6]
    assert saved_steps(config, ModeKeys.PREDICT, 15) == [0, 7, 14]
    assert saved_steps(config, ModeKeys.GLOBAL, 15) == [0, 7, 14]
    assert config.get_save_config(ModeKeys.EVAL).save_interval == 3
    assert config.get_save_config("predict").save_interval == 7


def test_mode_dict_inherits_unset_keys_from_simple_form():
    config = SaveConfig({ModeKeys.EVAL: {"save_interval": 3}}, end_step=10)
    assert config.get_save_config(ModeKeys.EVAL).end_step == 10
    assert saved_steps(config, ModeKeys.EVAL) == [0, 3, 6, 9]


def test_set_save_config_replaces_one_mode():
    config = SaveConfig(save_interval=10)
    config.set_save_config(ModeKeys.PREDICT, SaveConfigMode(save_steps=[4], end_step=0))
    assert saved_steps(config, ModeKeys.PREDICT, 30) == [4]
    assert saved_steps(config, ModeKeys.TRAIN, 30) == [0, 10, 20]


def test_parse_accepts_none_saveconfig_mode_and_dict():
    assert SaveConfig.parse(None) == SaveConfig()
    existing = SaveConfig(save_interval=3)
    assert SaveConfig.parse(existing) is existing
    from_mode = SaveConfig.parse(SaveConfigMode(save_interval=4))
    assert all(from_mode.get_save_config(m).save_interval == 4 for m in ALL_MODES)
    from_dict = SaveConfig.parse({ModeKeys.TRAIN: SaveConfigMode(save_interval=6)})
    assert from_dict.get_save_config(ModeKeys.TRAIN).save_interval == 6
    assert from_dict.get_save_config(ModeKeys.EVAL).save_interval == 500
    with pytest.raises(MltraceValueError, match="save_config=42"):
        SaveConfig.parse(42)


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="'TRAINING'"):
        SaveConfig({"TRAINING": {"save_interval": 3}})


# -- mutability --------------------------------------------------------------------------------


def test_end_step_zero_on_save_config_disables_every_mode():
    config = SaveConfig(save_interval=1)
    config.end_step = 0
    for mode in ALL_MODES:
        assert saved_steps(config, mode, 50) == []
        assert config.get_save_config(mode).end_step == 0
    assert config.end_step == 0


def test_setting_a_field_on_save_config_sets_every_mode():
    config = SaveConfig({ModeKeys.TRAIN: SaveConfigMode(save_interval=2)}, save_interval=7)
    assert config.save_interval == {"TRAIN": 2, "EVAL": 7, "PREDICT": 7, "GLOBAL": 7}
    config.save_interval = 5
    assert config.save_interval == 5
    config.save_steps = [1]
    assert all(saved_steps(config, m, 11) == [0, 1, 5, 10] for m in ALL_MODES)


def test_save_config_mode_is_mutable():
    mode = SaveConfigMode()
    mode.save_interval = "10"
    mode.start_step = 20
    mode.end_step = 40
    assert [s for s in range(100) if mode.should_save_step(s)] == [20, 30]


def test_collection_end_step_zero_leaves_hook_config_alone(tmp_path):
    hook = Hook(
        HookOptions(out_dir=str(tmp_path / "run"), dry_run=True, save_config=SaveConfig(save_interval=10)),
        collection_manager=CollectionManager(),
    )
    try:
        metrics = hook.get_collection("metrics")
        metrics.save_config.end_step = 0  # seed 004
        assert saved_steps(metrics.effective_save_config(), upto=50) == []
        assert saved_steps(hook.save_config, upto=50) == [0, 10, 20, 30, 40]
        other = hook.get_collection("weights")
        assert saved_steps(other.effective_save_config(), upto=50) == [0, 10, 20, 30, 40]
    finally:
        hook.close()


def test_copy_is_independent():
    config = SaveConfig(save_interval=10)
    clone = config.copy()
    clone.end_step = 0
    clone.get_save_config(ModeKeys.TRAIN).save_steps = [3]
    assert config == SaveConfig(save_interval=10)
    assert saved_steps(clone, upto=10) == [3]


# -- invalid values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"save_interval": 0}, "save_interval=0"),
        ({"save_interval": -1}, "save_interval=-1"),
        ({"save_interval": "abc"}, "save_interval='abc'"),
        ({"save_interval": 1.5}, "save_interval=1.5"),
        ({"save_interval": True}, "save_interval=True"),
        ({"start_step": -1}, "start_step=-1"),
        ({"end_step": -2}, "end_step=-2"),
        ({"end_step": "soon"}, "end_step='soon'"),
        ({"start_step": 10, "end_step": 5}, "end_step=5"),
        ({"save_steps": [1, "x"]}, "'x'"),
        ({"save_steps": [-3]}, "-3"),
        ({"save_steps": 5}, "save_steps=5"),
    ],
)
def test_invalid_values_name_key_and_value(kwargs, needle):
    with pytest.raises(MltraceValueError) as info:
        SaveConfig(**kwargs)
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


def test_end_before_start_message_names_both():
    with pytest.raises(MltraceValueError) as info:
        SaveConfigMode(start_step=10, end_step=5)
    assert "end_step=5" in str(info.value)
    assert "start_step=10" in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("save_interval", 0), ("save_interval", "abc"), ("start_step", -1), ("end_step", -1)],
)
def test_invalid_assignment_raises_and_keeps_old_value(field, value):
    mode = SaveConfigMode(save_interval=10, start_step=5, end_step=50)
    with pytest.raises(MltraceValueError, match=field):
        setattr(mode, field, value)
    assert (mode.save_interval, mode.start_step, mode.end_step) == (10, 5, 50)


def test_assignment_breaking_start_end_order_keeps_old_value():
    mode = SaveConfigMode(save_interval=10, start_step=20)
    with pytest.raises(MltraceValueError, match="end_step=5"):
        mode.end_step = 5
    assert mode.end_step is None
    assert mode.should_save_step(30)
    mode = SaveConfigMode(save_interval=10, end_step=5)
    with pytest.raises(MltraceValueError, match="start_step=20"):
        mode.start_step = 20
    assert mode.start_step == 0


# -- JSON --------------------------------------------------------------------------------------


def test_to_json_dict_is_smdebugs_form():
    config = SaveConfig(save_interval=10, start_step=20, end_step=100, save_steps=[2, 1])
    doc = config.to_json_dict()
    assert list(doc) == ["TRAIN", "EVAL", "PREDICT", "GLOBAL"]
    assert doc["TRAIN"] == {
        "save_interval": 10,
        "save_steps": [1, 2],
        "start_step": 20,
        "end_step": 100,
    }
    assert list(doc["TRAIN"]) == ["save_interval", "save_steps", "start_step", "end_step"]
    assert json.loads(json.dumps(doc)) == doc
    assert SaveConfig().to_json_dict()["GLOBAL"]["end_step"] is None


@pytest.mark.parametrize(
    "config",
    [
        SaveConfig(),
        SaveConfig(save_interval=10, start_step=20, end_step=100, save_steps=[1, 2]),
        SaveConfig(
            {
                ModeKeys.TRAIN: SaveConfigMode(save_interval=2),
                ModeKeys.EVAL: SaveConfigMode(end_step=0),
            }
        ),
    ],
)
def test_save_config_json_round_trip(config):
    text = json.dumps(config.to_json_dict())
    again = SaveConfig.from_dict(json.loads(text))
    assert again == config
    assert again.to_json_dict() == config.to_json_dict()


def test_from_dict_with_missing_or_null_modes_uses_defaults():
    config = SaveConfig.from_dict({"TRAIN": {"save_interval": 5}, "EVAL": None})
    assert config.get_save_config(ModeKeys.TRAIN).save_interval == 5
    assert config.get_save_config(ModeKeys.EVAL) == SaveConfigMode()
    assert config.get_save_config(ModeKeys.GLOBAL) == SaveConfigMode()
    assert SaveConfig.from_dict(None) is None


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(MltraceValueError, match="save_intervals"):
        SaveConfig.from_dict({"TRAIN": {"save_intervals": 5}})


# -- ReductionConfig ---------------------------------------------------------------------------

SMDEBUG_TOKENS = {"min", "max", "mean", "std", "variance", "sum", "prod"}


def test_reduction_config_every_reduction():
    config = ReductionConfig(
        reductions=[
            "min",
            "max",
            "mean",
            "std",
            "variance",
            "sum",
            "prod",
            "median",
            "nan_count",
            "inf_count",
            "zero_fraction",
        ],
        abs_reductions=["min", "max", "mean", "std", "variance", "sum", "prod", "median"],
        norms=["l1", "l2"],
        abs_norms=["l1", "l2"],
        save_raw_tensor=True,
        save_shape=True,
    )
    assert config.to_json_dict() == {
        "save_raw_tensor": True,
        "reductions": "min,max,mean,std,variance,sum,prod,l1_norm,l2_norm,abs_min,abs_max,abs_mean,"
        "abs_std,abs_variance,abs_sum,abs_prod,abs_l1_norm,abs_l2_norm",
        "save_shape": True,
    }
    assert config.extra_reductions_string() == "median,nan_count,inf_count,zero_fraction,abs_median"
    items = config.items()
    assert ("nan_count", False) in items and ("l2", True) in items and ("median", True) in items
    assert len(items) == 11 + 2 + 8 + 2


def test_smdebug_reductions_string_only_holds_tokens_smdebug_knows():
    config = ReductionConfig(
        reductions=["mean", "median", "nan_count", "inf_count", "zero_fraction"],
        abs_reductions=["median"],
    )
    tokens = config.to_json_dict()["reductions"].split(",")
    assert tokens == ["mean"]
    for token in tokens:
        base = token.removeprefix("abs_").removesuffix("_norm")
        assert base in SMDEBUG_TOKENS | {"l1", "l2"}
    assert config.extra_reductions_string() == "median,nan_count,inf_count,zero_fraction,abs_median"


def test_no_extra_reductions_gives_empty_string():
    assert ReductionConfig(reductions=["min"], norms=["l2"]).extra_reductions_string() == ""


def test_default_reduction_config():
    config = ReductionConfig()
    assert config.to_json_dict() == {
        "save_raw_tensor": False,
        "reductions": "",
        "save_shape": False,
    }
    assert config.items() == []


def test_from_dict_parses_docs_tokens():
    config = ReductionConfig.from_dict({"reductions": "min,max,abs_l2_norm,l1,abs_l1,median"})
    assert config.reductions == ["min", "max", "median"]
    assert config.norms == ["l1"]
    assert config.abs_norms == ["l2", "l1"]
    assert config.abs_reductions == []
    assert config.to_json_dict()["reductions"] == "min,max,l1_norm,abs_l2_norm,abs_l1_norm"
    assert config.extra_reductions_string() == "median"


def test_from_dict_flags_and_spaces():
    config = ReductionConfig.from_dict(
        {
            "reductions": " mean , l2_norm,,abs_variance",
            "save_raw_tensor": "True",
            "save_shape": True,
        }
    )
    assert (config.reductions, config.norms, config.abs_reductions) == (
        ["mean"],
        ["l2"],
        ["variance"],
    )
    assert config.save_raw_tensor is True and config.save_shape is True
    assert ReductionConfig.from_dict(None) is None


def test_reduction_config_json_round_trip_with_extra_key():
    config = ReductionConfig(
        reductions=["max", "nan_count"],
        abs_reductions=["mean", "median"],
        norms=["l2"],
        save_raw_tensor=True,
    )
    again = ReductionConfig.from_dict(
        json.loads(json.dumps(config.to_json_dict())), config.extra_reductions_string()
    )
    assert again == config


@pytest.mark.parametrize("token", ["bogus", "l3", "abs_nope", "mean_norm", "median_norm", "l2norm"])
def test_from_dict_unknown_token_lists_valid_ones(token):
    with pytest.raises(MltraceValueError) as info:
        ReductionConfig.from_dict({"reductions": f"min,{token}"})
    message = str(info.value)
    assert repr(token) in message
    for valid in ("min", "max", "mean", "std", "variance", "sum", "prod", "l1_norm", "l2_norm"):
        assert valid in message


@pytest.mark.parametrize(
    ("kwargs", "needle", "valid"),
    [
        ({"reductions": ["bogus"]}, "'bogus'", "min, max, mean"),
        ({"norms": ["l3"]}, "'l3'", "l1, l2"),
        ({"abs_reductions": ["nan_count"]}, "'nan_count'", "min, max, mean"),
        ({"abs_norms": ["mean"]}, "'mean'", "l1, l2"),
    ],
)
def test_constructor_rejects_unknown_names(kwargs, needle, valid):
    with pytest.raises(MltraceValueError) as info:
        ReductionConfig(**kwargs)
    assert needle in str(info.value)
    assert valid in str(info.value)


@pytest.mark.parametrize("value", ["true", 1, None])
def test_constructor_flags_must_be_bools(value):
    with pytest.raises(MltraceValueError, match="save_raw_tensor"):
        ReductionConfig(save_raw_tensor=value)


def test_from_dict_rejects_non_boolean_strings():
    with pytest.raises(MltraceValueError, match="save_shape='yes'"):
        ReductionConfig.from_dict({"reductions": "min", "save_shape": "yes"})


def test_reduction_config_copy_is_independent():
    config = ReductionConfig(reductions=["min"])
    clone = config.copy()
    clone.reductions.append("max")
    assert config.reductions == ["min"]
