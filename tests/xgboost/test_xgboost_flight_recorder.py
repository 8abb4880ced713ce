"""The flight recorder on XGBoost 3.2 (mltrace.capture.flight_recorder through the hook's training
callback): every round's metrics are kept; a NaN metric, a jump of a loss above k x its running
median (a custom objective gone wrong) and hook.dump_flight_recorder() write the rounds around
it; collections named for the recorder are computed every round, strings are never kept."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import xgboost as xgb

import mltrace.xgboost as smd
from mltrace.format.flight_record import read_records
from mltrace.storage import open_storage
from mltrace.trials import create_trial
from tests.support.xgboost_training import make_data

PARAMS = {"max_depth": 2, "eta": 0.3, "base_score": 0.0}


def _train(out_dir: str, config: smd.FlightRecorderConfig, rounds: int = 20, **kwargs):
    train, val = make_data()
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=500),
                    flight_recorder=config, validation_data=val,
                    hyperparameters={"objective": "reg:squarederror", "max_depth": 2})
    callbacks = [hook, *kwargs.pop("callbacks", [])]
    xgb.train({**PARAMS, **kwargs.pop("params", {})}, train, num_boost_round=rounds,
              evals=[(train, "train"), (val, "validation")], callbacks=callbacks,
              verbose_eval=False, **kwargs)
    hook.close()
    return hook


def _dumps(out_dir: str):
    (record,) = read_records(open_storage(out_dir))
    return record.dumps


def test_a_nan_metric_dumps_the_rounds_around_it_and_is_named_first(tmp_path):
    bad = 12

    def rmse(preds: np.ndarray, dtrain: xgb.DMatrix):
        value = float(np.sqrt(np.mean((preds - dtrain.get_label()) ** 2)))
        # the validation set's value goes bad at that round (train's is computed first)
        return "myrmse", float("nan") if rmse.round == bad and rmse.calls % 2 else value

    rmse.round = rmse.calls = 0

    class RoundCounter(xgb.callback.TrainingCallback):
        def before_iteration(self, model, epoch, evals_log):
            rmse.round = epoch
            return False

    def counting(preds, dtrain):
        result = rmse(preds, dtrain)
        rmse.calls += 1
        return result

    out = str(tmp_path / "run")
    _train(out, smd.FlightRecorderConfig(steps=4, after_steps=2), custom_metric=counting,
           callbacks=[RoundCounter()], params={"disable_default_eval_metric": 1})
    trial = create_trial(out)
    assert trial.steps() == [0, 8, 9, 10, 11, 12, 13, 14]
    assert trial.tensor_names() == ["train-myrmse", "validation-myrmse"]
    for step in trial.steps():  # read back as saved steps are: shape [1], float64
        value = trial.tensor("train-myrmse").value(step)
        assert value.shape == (1,) and value.dtype == np.float64 and np.isfinite(value).all()
    assert np.isnan(trial.tensor("validation-myrmse").value(bad)).all()
    assert np.isfinite(trial.tensor("validation-myrmse").value(bad - 1)).all()
    (dump,) = _dumps(out)
    assert (dump.trigger, dump.step, dump.steps_before, dump.steps_after) == (
        "nonfinite", bad, [8, 9, 10, 11], [13, 14])
    first = trial.first_nonfinite()
    assert first is not None
    assert (first.tensor, first.step, first.position, first.worker) == (
        "validation-myrmse", bad, 1, "worker_0")


def test_a_loss_jump_of_a_custom_objective_dumps(tmp_path):
    bad, calls = 14, []

    def objective(preds: np.ndarray, dtrain: xgb.DMatrix):
        grad = preds - dtrain.get_label()
        if len(calls) == bad:
            grad = np.full_like(grad, 1e3)  # a broken gradient throws every prediction off
        calls.append(1)
        return grad, np.ones_like(grad)

    out = str(tmp_path / "run")
    config = smd.FlightRecorderConfig(steps=4, after_steps=2, collections=["metrics", "losses"],
                                      loss_spike=10.0, loss_window=5)
    _train(out, config, obj=objective, params={"eval_metric": "rmse"})
    (dump,) = _dumps(out)
    assert (dump.trigger, dump.step, dump.steps_before, dump.steps_after) == (
        "loss_spike", bad, [10, 11, 12, 13], [15, 16])
    assert dump.reason.startswith("train-rmse=") and "median" in dump.reason
    trial = create_trial(out)
    jump = trial.tensor("train-rmse").value(bad).item()
    assert jump > 10 * trial.tensor("train-rmse").value(bad - 1).item()
    assert trial.first_nonfinite() is None


def test_a_manual_dump_and_collections_named_for_the_recorder(tmp_path, caplog):
    class DumpAt(xgb.callback.TrainingCallback):
        def __init__(self) -> None:
            super().__init__()
            self.hook: smd.Hook | None = None

        def before_iteration(self, model, epoch, evals_log):
            if epoch == 9:  # between rounds 8 and 9: written at once
                assert self.hook is not None
                self.hook.dump_flight_recorder("the importance looks odd")
            return False

    dumper = DumpAt()
    out = str(tmp_path / "run")
    config = smd.FlightRecorderConfig(
        steps=3, after_steps=2, collections=["metrics", "predictions", "hyperparameters"],
        reductions=["min", "max", "mean", "l2"])
    train, val = make_data()
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=500),
                    include_collections=["metrics", "hyperparameters"], flight_recorder=config,
                    validation_data=val,
                    hyperparameters={"objective": "reg:squarederror", "max_depth": 2})
    dumper.hook = hook
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        booster = xgb.train(PARAMS, train, num_boost_round=15, evals=[(val, "validation")],
                            callbacks=[hook, dumper], verbose_eval=False)
    hook.close()
    (dump,) = _dumps(out)
    # asked between rounds: round 8, the last one done, is the dump's step
    assert (dump.trigger, dump.reason, dump.step, dump.steps_before, dump.steps_after) == (
        "manual", "the importance looks odd", 8, [6, 7], [9, 10])
    trial = create_trial(out)
    assert trial.steps() == [0, 6, 7, 8, 9, 10]
    # predictions are computed every round for the recorder, kept as reductions
    predictions = trial.tensor("predictions")
    expected = booster.predict(val, iteration_range=(0, 10))
    assert predictions.reduction_value(9, "mean") == pytest.approx(float(expected.mean()), rel=1e-5)
    assert predictions.reduction_value(7, "l2") > 0
    # hyperparameters (strings and numbers saved at round 0) are not kept by the recorder
    assert any("does not keep hyperparameters" in r.getMessage() for r in caplog.records)
    assert trial.tensor("hyperparameters/objective").steps() == [0]
    assert trial.tensor("hyperparameters/max_depth").steps() == [0]
