"""mltrace.capture.forwarding.Forwarded: attributes a front object shows from one of its parts, on real
hooks (the TensorFlow front over its core hook, the XGBoost hook over its adapter)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xgboost as xgb

import mltrace.xgboost
from mltrace.capture.forwarding import Forwarded
from mltrace.exceptions import MltraceTypeError
from mltrace.modes import ModeKeys
from mltrace.tensorflow import KerasHook


class _Part:
    def __init__(self) -> None:
        self.size = 3
        self.label = "a"


class _Front:
    size = Forwarded[int]("part", "The part's size.")
    label = Forwarded[str]("part", "The part's label.", settable=True)

    def __init__(self) -> None:
        self.part = _Part()


def test_reads_follow_the_part_and_the_class_shows_the_descriptor_with_its_doc() -> None:
    front = _Front()
    assert front.size == 3
    front.part.size = 5
    assert front.size == 5
    assert isinstance(_Front.size, Forwarded) and _Front.size.__doc__ == "The part's size."


def test_read_only_unless_settable() -> None:
    front = _Front()
    with pytest.raises(AttributeError, match=r"_Front.size is read-only: it shows part.size"):
        front.size = 4
    assert front.part.size == 3 and "size" not in vars(front)
    front.label = "b"
    assert front.part.label == "b" and "label" not in vars(front)


def test_keras_hook_shows_its_core_hooks_settings_and_state(tmp_path: Path) -> None:
    hook = KerasHook(out_dir=str(tmp_path / "run"), include_collections=["losses"], dry_run=True)
    assert hook.out_dir == hook.core.out_dir == str(tmp_path / "run")
    assert hook.dry_run is True and hook.step == -1 and hook.mode is hook.core.mode
    assert hook.include_collections == hook.core.include_collections
    assert hook.collection_manager is hook.core.collection_manager
    hook.set_mode(ModeKeys.EVAL)
    assert hook.mode is ModeKeys.EVAL
    with pytest.raises(AttributeError, match="read-only"):
        hook.step = 7
    assert "Where the trial is written" in (KerasHook.out_dir.__doc__ or "")
    hook.close()
    assert hook.closed is True


def test_xgboost_hook_data_is_set_through_its_adapter_which_checks_it(tmp_path: Path) -> None:
    hook = mltrace.xgboost.Hook(out_dir=str(tmp_path / "run"))
    x, y = np.arange(12, dtype=np.float32).reshape(6, 2), np.arange(6, dtype=np.float32)
    hook.train_data = (x, y)
    assert isinstance(hook.train_data, xgb.DMatrix) and hook.train_data is hook.xgboost.train_data
    hook.hyperparameters = {"max_depth": 2}
    assert hook.xgboost.hyperparameters == {"max_depth": 2}
    with pytest.raises(MltraceTypeError, match="hyperparameters must be a dict"):
        hook.hyperparameters = [("max_depth", 2)]
    hook.close()
