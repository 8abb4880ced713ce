"""XGBoost hook: what a user of smdebug's XGBoost hook would try, read back with create_trial.

Expected values come from tests/support/xgboost_training.Capture, a second callback that computes each
tensor with XGBoost's public API in the same round (not with the hook's code).
"""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sklearn
import xgboost as xgb

import mltrace.xgboost as smd
from mltrace.exceptions import MltraceTypeError, MltraceValueError, TensorUnavailableForStep
from mltrace.format import paths
from mltrace.trials import create_trial
from tests.support.xgboost_training import FEATURES, Capture, make_data, trees_of_round

ROOT = Path(__file__).resolve().parents[2]
ALL = ["metrics", "losses", "hyperparameters", "predictions", "labels", "feature_importance",
       "full_shap", "average_shap", "trees"]
PARAMS = {"max_depth": 2, "eta": 0.5, "nthread": 1, "seed": 0}
HYPER = {"max_depth": 2, "eta": 0.5, "objective": "reg:squarederror", "eval_metric": ["rmse", "mae"]}


def _train(hook, rounds=4, data=None, params=None, capture=True, **train_kwargs):
    dtrain, dval = data or make_data()
    cap = Capture(dtrain, dval, HYPER)
    callbacks = [hook, cap] if capture else [hook]
    bst = xgb.train({**PARAMS, **(params or {})}, dtrain, rounds,
                    evals=[(dtrain, "train"), (dval, "validation")], callbacks=callbacks,
                    verbose_eval=False, **train_kwargs)
    return bst, cap


def _hook(out_dir, data=None, **kwargs):
    dtrain, dval = data or make_data()
    kwargs.setdefault("save_config", smd.SaveConfig(save_interval=1))
    kwargs.setdefault("include_collections", ALL)
    return smd.Hook(out_dir=str(out_dir), hyperparameters=HYPER, train_data=dtrain,
                    validation_data=dval, **kwargs)


def _assert_equal(got: np.ndarray, want: np.ndarray, where) -> None:
    if want.dtype.kind == "U":
        assert got.tolist() == want.tolist(), where
    else:
        assert got.dtype == want.dtype and got.shape == want.shape, (where, got.dtype, got.shape, want.shape)
        assert np.array_equal(got, want, equal_nan=True), where


def test_xgb_round_trip_every_collection_matches_the_process(tmp_path):
    data = make_data()
    hook = _hook(tmp_path / "run", data)
    bst, cap = _train(hook, rounds=4, data=data)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.workers() == ["worker_0"]
    expected = {n for n in cap.values if not n.endswith("/bias")}  # SHAP collections leave bias out
    assert set(trial.tensor_names()) == expected
    for name in expected:
        for step, want in cap.values[name].items():
            _assert_equal(trial.tensor(name).value(step), want, (name, step))
    # metrics equal XGBoost's own evaluation history
    history = xgb.train({**PARAMS}, data[0], 4, evals=[(data[1], "validation")], verbose_eval=False,
                        evals_result=(result := {}))
    assert history.num_boosted_rounds() == 4
    assert [trial.tensor("validation-rmse").value(s)[0] for s in range(4)] == result["validation"]["rmse"]
    # hyperparameters: once, at step 0, strings and lists included
    assert trial.tensor("hyperparameters/objective").steps() == [0]
    assert trial.tensor("hyperparameters/eval_metric").value(0).tolist() == ["rmse", "mae"]


def test_xgb_each_full_shap_entry_is_one_feature_column_not_the_whole_matrix(tmp_path):
    data = make_data()
    hook = _hook(tmp_path / "run", data, include_collections=["full_shap", "average_shap"])
    bst, _ = _train(hook, rounds=2, data=data)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    contribs = bst.predict(data[0], pred_contribs=True)  # (samples, features + bias)
    assert trial.tensor_names(collection="full_shap") == sorted(f"full_shap/{f}" for f in FEATURES)
    for i, feature in enumerate(FEATURES):
        column = trial.tensor(f"full_shap/{feature}").value(1)
        assert column.shape == (contribs.shape[0],)
        np.testing.assert_array_equal(column, contribs[:, i])
        average = trial.tensor(f"average_shap/{feature}").value(1)[0]
        assert average == pytest.approx(contribs[:, i].mean(), rel=1e-6)
    assert not trial.has_tensor("full_shap/bias") and not trial.has_tensor("average_shap/bias")


def test_xgb_default_hook_saves_metrics_every_10_rounds(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    _train(hook, rounds=25, capture=False)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 10, 20]
    assert trial.tensor_names() == ["train-rmse", "validation-rmse"]
    assert trial.tensor_names(collection="metrics") == ["train-rmse", "validation-rmse"]
    assert hook.save_config.get_save_config("GLOBAL").save_interval == 10


def test_xgb_metrics_always_saved_and_can_be_switched_off_as_seed_004_does(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), include_collections=["labels"],
                    validation_data=make_data()[1], save_config=smd.SaveConfig(save_interval=2))
    hook.get_collection("metrics").save_config.end_step = 0
    _train(hook, rounds=3, capture=False)
    hook.close()
    assert create_trial(str(tmp_path / "run")).tensor_names() == ["labels"]


def test_xgb_multiclass_rounds_hold_every_tree_of_the_round(tmp_path):
    data = make_data(classes=3)
    hook = _hook(tmp_path / "run", data, include_collections=["trees", "full_shap", "average_shap"])
    bst, cap = _train(hook, rounds=3, data=data, params={"objective": "multi:softprob", "num_class": 3})
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    for step in range(3):
        trees = sorted(set(trial.tensor("trees/Tree").value(step).tolist()))
        assert trees == [3 * step, 3 * step + 1, 3 * step + 2]
        for column, want in trees_of_round(bst, step).items():
            _assert_equal(trial.tensor(f"trees/{column}").value(step), want, (column, step))
    shap = trial.tensor("full_shap/alpha").value(2)
    assert shap.shape == (data[0].num_row(), 3)  # (samples, classes)
    assert trial.tensor("average_shap/alpha").value(2).shape == (1,)
    np.testing.assert_array_equal(shap, cap.values["full_shap/alpha"][2])


def test_xgb_resumed_training_steps_continue_at_the_models_round(tmp_path):
    data = make_data()
    first, _ = _train(smd.Hook(out_dir=str(tmp_path / "first")), rounds=3, data=data, capture=False)
    hook = _hook(tmp_path / "resumed", data, include_collections=["metrics", "trees", "hyperparameters"])
    bst, cap = _train(hook, rounds=2, data=data, xgb_model=first)
    hook.close()
    trial = create_trial(str(tmp_path / "resumed"))
    assert bst.num_boosted_rounds() == 5
    assert trial.steps() == [3, 4]
    assert trial.tensor("hyperparameters/eta").steps() == [3]  # the first round this hook saw
    for step in (3, 4):
        assert trial.tensor("trees/Tree").value(step).tolist()[0] == step
        _assert_equal(trial.tensor("trees/Split").value(step), trees_of_round(bst, step)["Split"], step)
        _assert_equal(trial.tensor("train-rmse").value(step), cap.values["train-rmse"][step], step)


def test_xgb_hook_reused_for_a_second_training_keeps_steps_increasing(tmp_path, caplog):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    _train(hook, rounds=3, capture=False)
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        _train(hook, rounds=2, capture=False)
    hook.close()
    assert create_trial(str(tmp_path / "run")).steps() == [0, 1, 2, 3, 4]
    assert "continues at step 3" in caplog.text


@pytest.mark.parametrize("metric, is_loss", [
    ("rmse", True), ("mae", True), ("mape", True), ("logloss", True), ("error@0.7", True),
    ("poisson-nloglik", True), ("merror", True), ("auc", False), ("aucpr", False), ("map", False),
    ("map@3", False), ("ndcg", False), ("ndcg@5-", False), ("pre@2", False),
    ("interval-regression-accuracy", False), ("rmse-std", False),
])
def test_xgb_losses_leave_out_the_metrics_xgboost_maximizes(metric, is_loss):
    hook_colls = tuple(smd.Collection(c, include_regex=smd.DEFAULT_COLLECTIONS[c])
                       for c in ("losses", "metrics"))
    for data in ("train", "validation_0", "eval1"):
        name = f"{data}-{metric}"
        assert hook_colls[0].matches(name) is is_loss, name
        assert hook_colls[1].matches(name), name
    for other in ("predictions", "labels", "trees/ID", "hyperparameters/a-b", "feature_importance/gain/a-b",
                  "scalar/x-y"):
        assert not any(c.matches(other) for c in hook_colls), other


def test_xgb_sklearn_regressor_and_classifier_with_the_hook_as_callback(tmp_path):
    assert sklearn.__version__  # the scikit-learn API is part of this environment
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 3))
    y = x[:, 0] - x[:, 1]
    reg_hook = smd.Hook(out_dir=str(tmp_path / "reg"), save_config=smd.SaveConfig(save_interval=1),
                        include_collections=["metrics", "losses", "feature_importance", "predictions"],
                        validation_data=(x[:10], y[:10]))
    model = xgb.XGBRegressor(n_estimators=3, max_depth=2, n_jobs=1, callbacks=[reg_hook])
    model.fit(x, y, eval_set=[(x[:10], y[:10])], verbose=False)
    reg_hook.close()
    trial = create_trial(str(tmp_path / "reg"))
    assert trial.steps() == [0, 1, 2]
    assert trial.tensor_names(collection="losses") == ["validation_0-rmse"]
    assert trial.tensor("validation_0-rmse").value(2)[0] == model.evals_result()["validation_0"]["rmse"][2]
    np.testing.assert_array_equal(trial.tensor("predictions").value(2),
                                  model.predict(x[:10]).astype(np.float32))
    assert trial.tensor_names(collection="feature_importance")

    clf_hook = smd.Hook(out_dir=str(tmp_path / "clf"), save_config=smd.SaveConfig(save_interval=1),
                        include_collections=["metrics", "losses"])
    clf = xgb.XGBClassifier(n_estimators=2, max_depth=2, n_jobs=1, eval_metric=["auc", "logloss"],
                            callbacks=[clf_hook])
    clf.fit(x, (y > 0).astype(int), eval_set=[(x, (y > 0).astype(int))], verbose=False)
    clf_hook.close()
    trial = create_trial(str(tmp_path / "clf"))
    assert trial.tensor_names(collection="metrics") == ["validation_0-auc", "validation_0-logloss"]
    assert trial.tensor_names(collection="losses") == ["validation_0-logloss"]


def test_xgb_reduction_config_applies_to_array_collections_only(tmp_path):
    data = make_data()
    hook = _hook(tmp_path / "run", data, include_collections=["metrics", "predictions", "trees"],
                 reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"]))
    _, cap = _train(hook, rounds=2, data=data)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    predictions = trial.tensor("predictions")
    with pytest.raises(TensorUnavailableForStep):
        predictions.value(1)  # reductions only, as asked
    want = cap.values["predictions"][1]
    assert predictions.reduction_value(1, "mean") == pytest.approx(float(want.mean()), rel=1e-6)
    assert predictions.reduction_value(1, "l2") == pytest.approx(float(np.linalg.norm(want)), rel=1e-6)
    _assert_equal(trial.tensor("trees/ID").value(1), cap.values["trees/ID"][1], "trees whole")
    _assert_equal(trial.tensor("train-rmse").value(1), cap.values["train-rmse"][1], "metrics whole")


def test_xgb_scalars_and_tensors_saved_between_rounds_and_after_training_are_kept(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))

    class UserCallback(xgb.callback.TrainingCallback):  # runs after the hook in each round
        def after_iteration(self, model, epoch, evals_log):
            hook.save_scalar("round_seen", epoch)
            hook.save_tensor("my_tensor", np.full(2, epoch, dtype=np.float32), "custom")
            return False

    dtrain, dval = make_data()
    xgb.train(PARAMS, dtrain, 3, evals=[(dval, "validation")], callbacks=[hook, UserCallback()],
              verbose_eval=False)
    hook.save_scalar("test_score", 0.5)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    # no step file was overwritten: each round still has its metric
    assert trial.tensor("validation-rmse").steps() == [0, 1, 2]
    # a value saved after the hook's callback of round k lands in round k + 1 (smdebug's order)
    assert trial.tensor("scalar/round_seen").steps() == [1, 2, 3]
    assert [trial.tensor("scalar/round_seen").value(s)[0] for s in (1, 2, 3)] == [0, 1, 2]
    assert [trial.tensor("my_tensor").value(s).tolist() for s in (1, 2, 3)] == [[0, 0], [1, 1], [2, 2]]
    assert trial.tensor("scalar/test_score").steps() == [3]
    assert trial.tensor_names(collection="custom") == ["my_tensor"]


def test_xgb_each_round_is_readable_when_training_returns(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    _train(hook, rounds=3, capture=False)
    trial = create_trial(str(tmp_path / "run"))  # before close(): the job is not finished yet
    assert trial.steps(show_incomplete_steps=True) == [0, 1, 2]
    assert trial.tensor("train-rmse").value(2).shape == (1,)
    hook.close()
    assert (tmp_path / "run" / paths.END_OF_JOB_MARKER).exists()


def test_xgb_worker_name_comes_from_xgboost_collective(tmp_path, monkeypatch):
    monkeypatch.setattr(xgb.collective, "is_distributed", lambda: True)
    monkeypatch.setattr(xgb.collective, "get_rank", lambda: 1)
    monkeypatch.setattr(xgb.collective, "get_world_size", lambda: 2)
    hook = smd.Hook(out_dir=str(tmp_path / "all"), include_workers="all")
    _train(hook, rounds=1, capture=False)
    hook.close()
    assert (tmp_path / "all" / "collections" / "000000000" / "worker_1_collections.json").exists()
    collections = json.loads(
        (tmp_path / "all" / "collections" / "000000000" / "worker_1_collections.json").read_text())
    assert collections["_meta"]["num_workers"] == 2
    one = smd.Hook(out_dir=str(tmp_path / "one"))  # include_workers="one": only worker_0 writes
    _train(one, rounds=1, capture=False)
    one.close()
    assert not (tmp_path / "one" / "events").exists()


def test_xgb_create_from_json_file_uses_xgboost_default_interval(tmp_path, monkeypatch):
    config = {
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"start_step": "1"},
        "CollectionConfigurations": [
            {"CollectionName": "metrics"},
            {"CollectionName": "feature_importance", "CollectionParameters": {"end_step": "12"}},
        ],
    }
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(path))
    hook = smd.Hook.create_from_json_file()
    hook.train_data, hook.validation_data = make_data()  # as smdebug's docs set them
    assert hook.save_config.get_save_config("GLOBAL").save_interval == 10
    fi = hook.get_collection("feature_importance").save_config.get_save_config("GLOBAL")
    assert (fi.save_interval, fi.start_step, fi.end_step) == (10, 1, 12)
    _train(hook, rounds=21, capture=False)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("train-rmse").steps() == [10, 20]
    assert trial.tensor("feature_importance/gain/alpha").steps() == [10]


def test_xgb_data_arguments_accept_dmatrix_arrays_and_files(tmp_path):
    rng = np.random.default_rng(0)
    table = np.column_stack([rng.normal(size=20), rng.normal(size=(20, 2))])
    np.savetxt(tmp_path / "train.csv", table, delimiter=",")
    hook = smd.Hook(out_dir=str(tmp_path / "run"), train_data=(str(tmp_path / "train.csv"), "text/csv"),
                    validation_data=(table[:, 1:], table[:, 0]))
    assert hook.train_data.num_row() == 20 and hook.train_data.num_col() == 2
    np.testing.assert_array_equal(hook.validation_data.get_label(), table[:, 0].astype(np.float32))
    (tmp_path / "val.libsvm").write_text("1 0:0.5 2:1.5\n0 1:-2\n\n2:0.5 0:1 # comment\n")
    hook.validation_data = (str(tmp_path / "val.libsvm"), "libsvm")
    np.testing.assert_array_equal(hook.validation_data.get_label(), [1, 0, 2])
    np.testing.assert_array_equal(hook.validation_data.get_data().toarray(),
                                  [[0.5, 0, 1.5], [0, -2, 0], [1, 0, 0]])
    with pytest.raises(MltraceValueError, match="not a csv file"):
        hook.train_data = (str(tmp_path / "val.libsvm"), "csv")
    with pytest.raises(MltraceValueError, match="not a local file"):
        hook.train_data = (str(tmp_path / "missing.csv"), "csv")
    with pytest.raises(MltraceValueError, match="content type"):
        smd.Hook(out_dir=str(tmp_path / "x"), train_data=(str(tmp_path / "train.csv"), "parquet"))
    with pytest.raises(MltraceTypeError, match="DMatrix"):
        smd.Hook(out_dir=str(tmp_path / "y"), validation_data="data.csv")
    with pytest.raises(MltraceTypeError, match="dict"):
        smd.Hook(out_dir=str(tmp_path / "z"), hyperparameters=[("eta", 0.1)])


def test_xgb_hyperparameters_that_are_no_array_are_skipped_with_a_warning(tmp_path, caplog):
    hyper = {"eta": 0.3, "interaction_constraints": [[0, 1], [2]], "nthread": None,
             "tree_method": "hist", "monotone": (1, 0, -1)}
    hook = smd.Hook(out_dir=str(tmp_path / "run"), include_collections=["hyperparameters"],
                    hyperparameters=hyper, save_config=smd.SaveConfig(save_interval=1))
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        _train(hook, rounds=2, capture=False)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(collection="hyperparameters") == [
        "hyperparameters/eta", "hyperparameters/monotone", "hyperparameters/tree_method"]
    assert trial.tensor("hyperparameters/monotone").value(0).tolist() == [1, 0, -1]
    assert trial.tensor("train-rmse").steps() == [0, 1]  # the hook stayed enabled
    assert "interaction_constraints" in caplog.text and "nthread" in caplog.text


@pytest.mark.filterwarnings(r"ignore:(?s).*are not used:UserWarning")  # gblinear ignores max_depth
def test_xgb_missing_data_and_gblinear_warn_once_and_training_goes_on(tmp_path, caplog):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["metrics", "predictions", "full_shap", "trees"])
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        bst, _ = _train(hook, rounds=3, params={"booster": "gblinear"}, capture=False)
    hook.close()
    assert bst.num_boosted_rounds() == 3
    assert create_trial(str(tmp_path / "run")).tensor_names() == ["train-rmse", "validation-rmse"]
    assert caplog.text.count("no validation_data") == 1
    assert caplog.text.count("tree boosters only") == 1


def test_xgb_cv_saves_fold_mean_and_std_metrics(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["metrics", "losses", "trees"])
    result = xgb.cv(PARAMS, make_data()[0], num_boost_round=2, nfold=2, callbacks=[hook], seed=0)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1]
    assert trial.tensor("test-rmse").value(1)[0] == pytest.approx(result["test-rmse-mean"].iloc[1])
    assert trial.tensor("test-rmse-std").value(1)[0] == pytest.approx(result["test-rmse-std"].iloc[1])
    assert "test-rmse-std" not in trial.tensor_names(collection="losses")


def test_xgb_stop_signal_of_a_rule_stops_boosting_and_ends_the_trial(tmp_path):
    out = tmp_path / "run"
    hook = smd.Hook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=1), stop_check_interval=0)
    out.mkdir(exist_ok=True)
    (out / paths.STOP_SIGNAL_FILE).write_text(json.dumps({"rule": "LossNotDecreasing", "step": 0}))
    bst, _ = _train(hook, rounds=10, capture=False)
    assert bst.num_boosted_rounds() == 1
    assert hook.stop_requested["rule"] == "LossNotDecreasing"
    assert (out / paths.END_OF_JOB_MARKER).exists()
    assert create_trial(str(out)).steps() == [0]


def test_xgb_internal_error_disables_the_hook_and_training_goes_on(tmp_path, monkeypatch, caplog):
    from mltrace.xgboost import _model

    calls = []

    def broken(model, rnd):
        calls.append(rnd)
        if rnd == 1:
            raise RuntimeError("boom")
        return {"Tree": np.zeros(1, dtype=np.int64)}

    monkeypatch.setattr(_model, "round_trees", broken)
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["metrics", "trees"])
    with caplog.at_level(logging.ERROR, logger="mltrace"):
        bst, _ = _train(hook, rounds=4, capture=False)
    hook.close()
    assert bst.num_boosted_rounds() == 4 and calls == [0, 1]
    assert "boom" in caplog.text
    # round 1's metrics, saved before the failure, are written when the hook disables itself
    assert create_trial(str(tmp_path / "run")).tensor("train-rmse").steps() == [0, 1]


def test_xgb_copied_hook_warns_that_it_saves_nothing(tmp_path, caplog):
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        clone = copy.deepcopy(hook)
    assert "saves nothing" in caplog.text
    assert clone.after_iteration(None, 0, {}) is False
    hook.close()


def test_xgb_hook_is_a_training_callback_and_module_names_match_smdebug():
    assert issubclass(smd.Hook, xgb.callback.TrainingCallback)
    for name in ("Hook", "SaveConfig", "SaveConfigMode", "ReductionConfig", "Collection", "modes",
                 "get_collection", "get_hook", "create_trial", "create_from_json_file"):
        assert hasattr(smd, name), name


def test_xgb_golden_trial_is_what_the_hook_writes_today(tmp_path):
    """tests/golden/mltrace_xgboost (read by real smdebug in the legacy suite) is still current,
    and mltrace's reader reads the committed files as recorded."""
    sys.path.insert(0, str(ROOT / "tests" / "golden"))
    try:
        import make_mltrace_xgboost_golden as golden
    finally:
        sys.path.remove(str(ROOT / "tests" / "golden"))
    committed = json.loads((ROOT / "tests" / "golden" / "mltrace_xgboost" / "expected.json").read_text())
    fresh = golden.build(tmp_path)
    assert {k: v for k, v in fresh.items() if k != "values"} == {
        k: v for k, v in committed.items() if k != "values"}
    for name, by_step in committed["values"].items():
        for step, entry in by_step.items():
            new = fresh["values"][name][step]
            assert (new["dtype"], new["shape"]) == (entry["dtype"], entry["shape"]), name
            if entry["dtype"] == "str":
                assert new["value"] == entry["value"], name
            else:
                np.testing.assert_allclose(np.array(new["value"], dtype=float),
                                           np.array(entry["value"], dtype=float), rtol=1e-5, err_msg=name)
    trial = create_trial(str(ROOT / "tests" / "golden" / "mltrace_xgboost" / "run"))
    assert trial.tensor_names() == committed["tensor_names"]
    for name, by_step in committed["values"].items():
        for step, entry in by_step.items():
            got = trial.tensor(name).value(int(step))
            want = [float("nan") if v == "NaN" else v for v in entry["value"]]
            assert got.reshape(-1).tolist() == want or np.array_equal(
                got.reshape(-1).astype(float), np.array(want, dtype=float), equal_nan=True), (name, step)


def test_xgb_example_plots_feature_importance_over_rounds(tmp_path):
    out = tmp_path / "example"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "xgboost" / "feature_importance.py"),
         "--out-dir", str(out), "--rounds", "12", "--plot", str(tmp_path / "fi.png")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "fi.png").stat().st_size > 1000
    assert "gain" in proc.stdout
    trial = create_trial(str(out))
    assert trial.steps() == [0, 2, 4, 6, 8, 10]
    assert trial.tensor_names(collection="feature_importance")
