"""JSON hook configurations of the smdebug era: the shapes of smdebug 1.0.34's own test
configurations and of what the SageMaker SDK writes, each accepted by smdebug's
create_from_json_file. Used by tests/porting/test_porting_config.py and, against real smdebug, by
tests/legacy/test_smdebug_porting_config.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The shapes of smdebug 1.0.34's test configurations (tests/{core,mxnet,pytorch,tensorflow,
# xgboost}), LocalPath filled in per test. Each one worked with smdebug's create_from_json_file.
SMDEBUG_ERA_CONFIGS = {
    "core_all_params": {
        "S3OutputPath": "s3://bucket/prefix",
        "HookParameters": {"save_interval": "2", "save_all": "true", "include_workers": "one",
                           "export_tensorboard": "true", "tensorboard_dir": "TB"},
        "CollectionConfigurations": [
            {"CollectionName": "weights", "CollectionParameters": {"save_histogram": "false"}},
            {"CollectionName": "gradients", "CollectionParameters": {"save_histogram": False}}]},
    "mxnet_full": {
        "S3Path": "s3://bucket/prefix",
        "HookParameters": {"save_all": False, "include_regex": "regexe1,regex2",
                           "save_interval": "100", "save_steps": "1,2,3,4", "start_step": "1",
                           "end_step": "1000000",
                           "reductions": "min,max,mean, std,abs_variance,abs_sum,abs_l2_norm"},
        "CollectionConfigurations": [
            {"CollectionName": "collection_obj_name1",
             "CollectionParameters": {"include_regex": "regexe5*", "save_interval": 100,
                                      "save_steps": "1,2,3", "start_step": 1,
                                      "reductions": "min, abs_max,l1_norm,abs_l2_norm"}}]},
    "pytorch_multi_collections": {
        "S3Path": "s3://bucket/prefix",
        "HookParameters": {"save_all": False, "save_steps": "0, 1, 2, 3"},
        "CollectionConfigurations": [
            {"CollectionName": "weights"}, {"CollectionName": "biases"},
            {"CollectionName": "gradients"}, {"CollectionName": "default"},
            {"CollectionName": "ReluActivation",
             "CollectionParameters": {"include_regex": "relu*", "save_steps": "4, 5, 6"}}]},
    "pytorch_save_shape": {"HookParameters": {"save_all": True, "save_shape": True,
                                              "save_steps": "0,1"}},
    "pytorch_modes": {"HookParameters": {"save_all": True, "train.save_steps": "0,1,2,3,4"}},
    "tf_collection_defaults": {
        "S3OutputPath": "s3://bucket/prefix",
        "HookParameters": {"save_interval": 1, "train.save_interval": 2, "eval.save_interval": 3},
        "CollectionConfigurations": [
            {"CollectionName": "weights"},
            {"CollectionName": "losses",
             "CollectionParameters": {"eval.save_interval": 4, "global.save_interval": 5}}]},
    "tf_reductions": {
        "HookParameters": {
            "reductions": "min, max, mean, std, variance, sum, prod, abs_min, abs_max, abs_mean, "
                          "abs_std, abs_variance, abs_sum, abs_prod, l1_norm, l2_norm, "
                          "abs_l1_norm, abs_l2_norm",
            "train.save_interval": 1},
        "CollectionConfigurations": [{"CollectionName": "weights"},
                                     {"CollectionName": "losses"}]},
    "tf_save_config_disable": {"HookParameters": {"end_step": 0}},
    "tf_simple_include_regex": {"HookParameters": {"save_all": False, "include_regex": "loss:0",
                                                   "save_interval": 2},
                                "CollectionConfigurations": []},
    # smdebug's XGBoost tests passed include_collections, which smdebug read nowhere
    "xgboost_full": {
        "S3Path": "s3://bucket/prefix",
        "HookParameters": {
            "include_regex": "regexe1,regex2",
            "reductions": "min,max,mean,std,abs_variance,abs_sum,abs_l2_norm",
            "include_collections": "collection_obj_name1,collection_obj_name2",
            "save_all": False, "save_interval": 100, "save_steps": "1,2,3,4", "start_step": 1},
        "CollectionConfigurations": [
            {"CollectionName": "collection_obj_name1",
             "CollectionParameters": {"include_regex": "regexe5*", "save_interval": 100,
                                      "save_steps": "1,2,3", "start_step": 1,
                                      "reductions": "min,abs_max,l1_norm,abs_l2_norm"}}]},
    # what the SageMaker SDK writes (strings everywhere), with a section mltrace does not read
    "sagemaker_sdk": {
        "S3OutputPath": "s3://bucket/job/debug-output",
        "HookParameters": {"save_interval": "500", "include_collections": "weights,gradients"},
        "CollectionConfigurations": [
            {"CollectionName": "gradients", "CollectionParameters": {"save_interval": "10"}}],
        "RuleConfigurations": [{"RuleName": "VanishingGradient"}]},
}


def write_config(folder: Path, name: str, doc: dict[str, Any]) -> str:
    """Write configuration ``doc`` as ``folder/<name>.json`` with LocalPath ``folder/<name>``
    (and "TB" standing for ``folder/tb``); return the file's path."""
    doc = json.loads(json.dumps(doc).replace('"TB"', json.dumps(str(folder / "tb"))))
    doc = {"LocalPath": str(folder / name), **doc}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)
