"""Configuration JSON against real smdebug 1.0.34 (issue 18): ``SaveConfig``, ``ReductionConfig``
and ``Collection`` ``to_json`` give smdebug's JSON text, each side's ``from_json`` reads the
other's; and smdebug-era JSON hook configurations give mltrace's PyTorch hook the save and
reduction settings smdebug's PyTorch hook got from the same file."""

from __future__ import annotations

import json
import logging

import pytest
import smdebug.pytorch as smd_torch
from smdebug.core.collection import Collection as SmdCollection
from smdebug.core.modes import ModeKeys as SmdModeKeys
from smdebug.core.reduction_config import ReductionConfig as SmdReductionConfig
from smdebug.core.save_config import SaveConfig as SmdSaveConfig
from smdebug.core.save_config import SaveConfigMode as SmdSaveConfigMode

import mltrace.pytorch as ml_torch
from mltrace.collections import Collection
from mltrace.config import ReductionConfig, SaveConfig, SaveConfigMode
from mltrace.modes import ModeKeys
from tests.support.smdebug_era_configs import SMDEBUG_ERA_CONFIGS, write_config

SAVE = dict(save_interval=3, start_step=2, end_step=40, save_steps=[1, 7])
REDUCTION = dict(reductions=["min", "std"], abs_reductions=["max"], norms=["l2"],
                 abs_norms=["l1"], save_raw_tensor=True, save_shape=True)


def _pairs():
    """(mltrace object, the same configuration built with smdebug's classes)."""
    ml_save = SaveConfig(mode_save_configs={ModeKeys.TRAIN: SaveConfigMode(**SAVE),
                                            ModeKeys.EVAL: SaveConfigMode(save_interval=5)})
    smd_save = SmdSaveConfig(mode_save_configs={
        SmdModeKeys.TRAIN: SmdSaveConfigMode(**SAVE), SmdModeKeys.EVAL: SmdSaveConfigMode(5),
        SmdModeKeys.PREDICT: SmdSaveConfigMode(), SmdModeKeys.GLOBAL: SmdSaveConfigMode()})
    ml_red, smd_red = ReductionConfig(**REDUCTION), SmdReductionConfig(**REDUCTION)
    ml_coll = Collection("fc", include_regex=["^fc1", "bias$"], tensor_names=["b", "a"],
                         reduction_config=ml_red, save_config=ml_save, save_histogram=False)
    smd_coll = SmdCollection("fc", include_regex=["^fc1", "bias$"], tensor_names=["b", "a"],
                             reduction_config=smd_red, save_config=smd_save,
                             save_histogram=False)
    return [(ml_save, smd_save), (SaveConfig(), SmdSaveConfig()), (ml_red, smd_red),
            (ReductionConfig(), SmdReductionConfig()), (ml_coll, smd_coll)]


@pytest.mark.parametrize("index", range(5))
def test_to_json_is_smdebugs_json_and_each_reads_the_others(index):
    ours, theirs = _pairs()[index]
    assert ours.to_json() == theirs.to_json()  # the same text, key order included
    assert type(theirs).from_json(ours.to_json()) == theirs
    assert type(ours).from_json(theirs.to_json()) == ours


def test_smdebug_reads_mltraces_additions_by_leaving_them_out():
    """when_nan and mltrace's own reductions ride in keys smdebug's from_json skips."""
    ours = ReductionConfig(reductions=["mean", "nan_count"], save_raw_tensor=True)
    assert SmdReductionConfig.from_json(ours.to_json()) == SmdReductionConfig(
        reductions=["mean"], save_raw_tensor=True)
    assert ReductionConfig.from_json(ours.to_json()) == ours
    save = SaveConfig(save_interval=4, when_nan=["loss"])
    assert SmdSaveConfig.from_json(save.to_json()) == SmdSaveConfig(save_interval=4)
    coll = Collection("c", include_regex=["x"], reduction_config=ours)
    assert SmdCollection.from_json(coll.to_json()).reduction_config == SmdReductionConfig(
        reductions=["mean"], save_raw_tensor=True)
    assert Collection.from_json(coll.to_json()) == coll


def _settings(hook, coll_names, save_of, reduction_of) -> dict:
    """What a JSON configuration decided: the hook's save config, its reduction config, and
    per configured collection its save config, reduction config and include regexes."""
    out = {"hook_save": save_of(hook.save_config), "hook_reduction": reduction_of(
        hook.reduction_config)}
    for name in coll_names:
        coll = hook.get_collection(name)
        out[name] = (save_of(coll.save_config), reduction_of(coll.reduction_config),
                     list(coll.include_regex))
    return out


def _save_dict(config) -> dict | None:
    if config is None:
        return None
    return {mode: {k: v for k, v in (c or {}).items() if k != "when_nan"}
            for mode, c in config.to_json_dict().items()}


def _reduction_dict(config) -> dict | None:
    return None if config is None else config.to_json_dict()


@pytest.mark.parametrize("name", sorted(SMDEBUG_ERA_CONFIGS))
def test_smdebug_era_configurations_decide_what_smdebugs_hook_decided(tmp_path, name, caplog):
    doc = SMDEBUG_ERA_CONFIGS[name]
    names = [e["CollectionName"] for e in doc.get("CollectionConfigurations", [])]
    smd_hook = smd_torch.Hook.create_from_json_file(write_config(tmp_path / "s", name, doc))
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        ml_hook = ml_torch.Hook.create_from_json_file(write_config(tmp_path / "m", name, doc))
    theirs = _settings(smd_hook, names, _save_dict, _reduction_dict)
    ours = _settings(ml_hook, names, _save_dict, _reduction_dict)
    ml_hook.close()
    # smdebug keeps a collection's own save config unset until its first step; mltrace fills it
    # from the hook's, so compare a configured collection's where smdebug has one
    for key in names:
        if theirs[key][0] is None:
            theirs[key] = (ours[key][0], *theirs[key][1:])
    hook_params = doc.get("HookParameters", {})
    if "reductions" not in hook_params and hook_params.get("save_shape"):
        # smdebug read save_shape only beside reductions; mltrace honours it (raw tensors
        # are saved either way, as smdebug saved them)
        theirs["hook_reduction"]["save_shape"] = True
    assert json.loads(json.dumps(ours)) == json.loads(json.dumps(theirs))
