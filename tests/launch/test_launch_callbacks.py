"""mltrace.launch.callbacks.SessionCallback: the one hook ``mltrace run`` adds to the callbacks of
Keras's and XGBoost's training calls, with a real xgboost.train signature and real hooks."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
import xgboost as xgb

import mltrace.xgboost
from mltrace.capture import hook as core_hook
from mltrace.launch.callbacks import SessionCallback
from mltrace.launch.session import Session
from mltrace.modes import ModeKeys

TRAIN = inspect.signature(xgb.train)


@pytest.fixture(autouse=True)
def _no_current_hook() -> Iterator[None]:
    core_hook.del_hook()
    yield
    core_hook.del_hook()


def _bound(**kwargs: object) -> inspect.BoundArguments:
    return TRAIN.bind({"max_depth": 2}, "dtrain", **kwargs)


def test_the_hook_is_created_once_and_appended_to_each_call(tmp_path: Path) -> None:
    # a save key in the file: the framework's save_defaults fill the keys it leaves out
    doc = {"LocalPath": str(tmp_path / "run"), "HookParameters": {"start_step": "0"}}
    callback = SessionCallback(Session(doc), "xgboost")
    mine = xgb.callback.EvaluationMonitor()
    first = _bound(callbacks=[mine])
    hook = callback.add_to(first, mltrace.xgboost.Hook, {"save_interval": 7})
    assert isinstance(hook, mltrace.xgboost.Hook)
    assert first.arguments["callbacks"] == [mine, hook]  # the script's callbacks stay first
    assert hook.save_config.get_save_config(ModeKeys.TRAIN).save_interval == 7  # save_defaults

    second = _bound()  # no callbacks at all
    assert callback.add_to(second, mltrace.xgboost.Hook) is hook
    assert second.arguments["callbacks"] == [hook]
    hook.close()


def test_a_call_that_passes_its_own_hook_keeps_its_arguments(tmp_path: Path) -> None:
    session = Session({"LocalPath": str(tmp_path / "run")})
    own = mltrace.xgboost.Hook(out_dir=str(tmp_path / "own"))
    bound = _bound(callbacks=(own,))
    assert SessionCallback(session, "xgboost").add_to(bound, mltrace.xgboost.Hook) is None
    assert bound.arguments["callbacks"] == (own,)
    assert session.hooks == []
    own.close()


def test_a_script_with_a_hook_of_its_own_gets_none(tmp_path: Path) -> None:
    session = Session({"LocalPath": str(tmp_path / "run")})
    own = mltrace.xgboost.Hook(out_dir=str(tmp_path / "own"))  # the current hook, not the session's
    callback = SessionCallback(session, "xgboost")
    bound = _bound(callbacks=[])
    assert callback.add_to(bound, mltrace.xgboost.Hook) is None
    assert bound.arguments["callbacks"] == [] and callback.hook is None
    assert "xgboost" in session.off
    own.close()
