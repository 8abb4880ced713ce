"""Collections: membership (regex search, exact names) and the collections file's JSON."""

from __future__ import annotations

import json

import pytest

from mltrace.collections import Collection, CollectionManager
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys

WHERE = "collections/000000000/worker_0_collections.json"


@pytest.mark.parametrize(
    ("regex", "name", "expected"),
    [
        ("fc1", "Net_fc1.weight", True),  # search, not match: anywhere in the name
        ("^fc1", "Net_fc1.weight", False),
        ("weight$", "Net_fc1.weight", True),
        ("^(?!gradient).*weight", "Net_fc1.weight", True),
        ("^(?!gradient).*weight", "gradient/Net_fc1.weight", False),
        ("^gradient", "gradient/Net_fc1.weight", True),
        ("[Ll]oss_(?!input).*output", "CrossEntropyLoss_output_0", True),
        ("[Ll]oss_(?!input).*output", "CrossEntropyLoss_input_0", False),
        ("fc1.weight", "fc1Xweight", True),  # '.' is a regex wildcard
    ],
)
def test_include_regex_uses_re_search(regex, name, expected):
    assert Collection("c", include_regex=regex).matches(name) is expected


def test_any_regex_of_several_matches():
    coll = Collection("c", include_regex=["^a", "z$"])
    assert coll.matches("abc") and coll.matches("xyz")
    assert not coll.matches("bcd")


def test_include_adds_string_or_list_without_duplicates():
    coll = Collection("c")
    assert not coll.matches("anything")
    coll.include("fc1")
    coll.include(["^gradient", "fc1"])
    assert coll.include_regex == ["fc1", "^gradient"]
    assert coll.matches("gradient/x")


def test_include_regex_setter_replaces():
    coll = Collection("c", include_regex="old")
    coll.include_regex = "new"
    assert coll.include_regex == ["new"]
    assert coll.matches("a_new_b") and not coll.matches("old")


@pytest.mark.parametrize("regex", ["([", "*bad", "(?P<x", "a{2,1}"])
def test_invalid_regex_is_a_clear_error(regex):
    with pytest.raises(MltraceValueError) as info:
        Collection("c", include_regex=regex)
    assert repr(regex) in str(info.value)
    assert "re.escape" in str(info.value)


def test_invalid_regex_in_list_adds_none_of_it():
    coll = Collection("c", include_regex="keep")
    with pytest.raises(MltraceValueError, match=r"'\(\['"):
        coll.include(["fine", "(["])
    assert coll.include_regex == ["keep"]


def test_failed_include_regex_assignment_keeps_old_regexes():
    coll = Collection("c", include_regex="keep")
    with pytest.raises(MltraceValueError):
        coll.include_regex = "(["
    assert coll.include_regex == ["keep"]
    assert coll.matches("keep_me")


@pytest.mark.parametrize("name", ["", None, 3])
def test_collection_name_must_be_a_non_empty_string(name):
    with pytest.raises(MltraceValueError, match=repr(name)):
        Collection(name)


def test_tensor_names_are_exact():
    coll = Collection("c", tensor_names=["loss"])
    assert coll.matches("loss")
    assert not coll.matches("loss2") and not coll.matches("my_loss")
    coll.add_tensor_name("acc")
    assert coll.has_tensor_name("acc") and coll.matches("acc")
    coll.remove_tensor_name("acc")
    coll.remove_tensor_name("never_added")
    assert not coll.matches("acc")
    assert coll.tensor_names == {"loss"}
    coll.tensor_names = ["x", "y"]
    assert coll.tensor_names == {"x", "y"} and not coll.matches("loss")


def test_collection_to_json_dict_is_smdebugs_entry():
    coll = Collection(
        "weights",
        include_regex=["^(?!gradient).*weight"],
        tensor_names=["b", "a"],
        reduction_config=ReductionConfig(
            reductions=["min"], abs_norms=["l2"], save_raw_tensor=True
        ),
        save_config=SaveConfig(save_interval=10, end_step=100),
        save_histogram=False,
    )
    entry = coll.to_json_dict()
    assert list(entry) == [
        "name",
        "include_regex",
        "tensor_names",
        "reduction_config",
        "save_config",
        "save_histogram",
    ]
    assert entry["name"] == "weights"
    assert entry["include_regex"] == ["^(?!gradient).*weight"]
    assert entry["tensor_names"] == ["a", "b"]
    assert entry["reduction_config"] == {
        "save_raw_tensor": True,
        "reductions": "min,abs_l2_norm",
        "save_shape": False,
    }
    assert set(entry["save_config"]) == {"TRAIN", "EVAL", "PREDICT", "GLOBAL"}
    assert entry["save_config"]["EVAL"] == {
        "save_interval": 10,
        "save_steps": [],
        "start_step": 0,
        "end_step": 100,
    }
    assert entry["save_histogram"] is False


def test_extra_reductions_go_to_their_own_key():
    coll = Collection(
        "c", reduction_config=ReductionConfig(reductions=["max", "nan_count", "median"])
    )
    entry = coll.to_json_dict()
    assert entry["reduction_config"]["reductions"] == "max"
    assert entry["mltrace_reductions"] == "nan_count,median"
    assert Collection.from_dict(json.loads(json.dumps(entry))) == coll


def make_manager() -> CollectionManager:
    manager = CollectionManager()
    manager.add(
        Collection(
            "weights",
            include_regex=["^(?!gradient).*weight"],
            tensor_names=["Net_fc1.weight"],
            reduction_config=ReductionConfig(
                reductions=["min", "zero_fraction"],
                norms=["l2"],
                save_raw_tensor=True,
                save_shape=True,
            ),
            save_config=SaveConfig(
                {ModeKeys.TRAIN: SaveConfigMode(save_interval=10, end_step=100)}
            ),
            save_histogram=False,
        )
    )
    manager.get("losses").include("[Ll]oss_(?!input).*output")
    manager.get("losses").add_tensor_name("CrossEntropyLoss_output_0")
    manager.get("empty")
    manager.num_workers = 4
    return manager


def test_manager_json_top_level_keys_are_exactly_smdebugs():
    doc = json.loads(make_manager().to_json())
    assert set(doc) == {"collections", "_meta"}
    assert doc["_meta"] == {"num_workers": 4}
    assert list(doc["collections"]) == ["weights", "losses", "empty"]
    for name, entry in doc["collections"].items():
        assert entry["name"] == name


def test_manager_json_round_trip():
    manager = make_manager()
    text = manager.to_json()
    again = CollectionManager.from_json(text, WHERE)
    assert again.num_workers == 4
    assert set(again.get_collections()) == {"weights", "losses", "empty"}
    for name, coll in manager.get_collections().items():
        assert again.get(name, create=False) == coll
    assert again.to_json() == text
    assert again.get("weights").matches("Net_fc2.weight")
    assert not again.get("weights").matches("gradient/Net_fc2.weight")
    assert again.get("weights").save_config.get_save_config(ModeKeys.TRAIN).end_step == 100
    assert again.get("weights").effective_reduction_config().items() == [
        ("min", False),
        ("zero_fraction", False),
        ("l2", False),
    ]


def test_manager_reads_smdebug_file_with_null_configs():
    text = json.dumps(
        {
            "collections": {
                "losses": {
                    "name": "losses",
                    "include_regex": ["[Ll]oss_(?!input).*output"],
                    "tensor_names": ["CrossEntropyLoss_output_0"],
                    "reduction_config": None,
                    "save_config": None,
                    "save_histogram": False,
                },
                "gradients": {
                    "name": "gradients",
                    "include_regex": ["^gradient"],
                    "tensor_names": [],
                    "reduction_config": {
                        "save_raw_tensor": False,
                        "reductions": "min,l1_norm,abs_mean,abs_l2_norm",
                        "save_shape": False,
                    },
                    "save_config": {
                        "TRAIN": {
                            "save_interval": 500,
                            "save_steps": [],
                            "start_step": 0,
                            "end_step": None,
                        },
                        "EVAL": None,
                        "PREDICT": None,
                        "GLOBAL": None,
                    },
                    "save_histogram": True,
                },
            },
            "_meta": {"num_workers": 2},
        }
    )
    manager = CollectionManager.from_json(text, WHERE)
    assert manager.num_workers == 2
    losses = manager.get("losses", create=False)
    assert losses.reduction_config is None and not losses.has_own_save_config()
    assert losses.save_histogram is False and losses.matches("CrossEntropyLoss_output_0")
    gradients = manager.get("gradients", create=False)
    assert gradients.reduction_config.items() == [
        ("min", False),
        ("l1", False),
        ("mean", True),
        ("l2", True),
    ]


def test_manager_get_without_create():
    manager = CollectionManager()
    with pytest.raises(KeyError, match="nope"):
        manager.get("nope", create=False)
    assert manager.get("made") is manager.get("made")


def test_manager_add_rejects_non_collections():
    with pytest.raises(MltraceValueError):
        CollectionManager().add({"name": "x"})


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        "{}",
        '{"collections": []}',
        '{"collections": {"a": {}}}',
        '{"collections": {"a": {"name": "a", "include_regex": ["("]}}}',
        '{"collections": {}, "_meta": {"num_workers": "many"}}',
    ],
)
def test_manager_rejects_damaged_files_naming_them(text):
    with pytest.raises(MltraceValueError) as info:
        CollectionManager.from_json(text, WHERE)
    assert WHERE in str(info.value)


def test_manager_reads_a_save_config_hooks_refuse(caplog):
    """A collections file written elsewhere may hold a save config mltrace's hooks refuse
    (smdebug accepted end_step == start_step): the trial stays readable, with a warning."""
    entry = Collection("weights", include_regex=[".*weight"]).to_json_dict()
    entry["save_config"] = {"TRAIN": {"save_interval": 10, "start_step": 5, "end_step": 5,
                                      "save_steps": [], "when_nan": []}}
    text = json.dumps({"collections": {"weights": entry}, "_meta": {"num_workers": 1}})
    with caplog.at_level("WARNING", logger="mltrace.collections"):
        manager = CollectionManager.from_json(text)
    assert manager.get("weights", create=False).include_regex == [".*weight"]
    assert "'weights'" in caplog.text and "end_step" in caplog.text
    with pytest.raises(MltraceValueError, match="end_step"):
        SaveConfig.from_dict(entry["save_config"])
