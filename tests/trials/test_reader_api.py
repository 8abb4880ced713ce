"""The reader's public API (what Tensor, the rules and the plugins build on), Trial's keyword
checks, and rule listeners that get their options explicitly (no environment variable between
modules)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import pytest

import mltrace.pytorch as smd
from mltrace import plugins
from mltrace.exceptions import (
    CorruptRecordError,
    MltraceTypeError,
    MltraceValueError,
    NoMoreData,
    StepUnavailable,
    TensorUnavailable,
)
from mltrace.modes import ModeKeys
from mltrace.rules import rule_invoker
from mltrace.rules.builtin.vanishing_gradient import VanishingGradient
from mltrace.trials import Location, TensorEntries, Trial, create_trial
from tests.support.source_scan import private_reaches
from tests.support.torch_training import make_model, train

REPO = Path(__file__).resolve().parents[2]
WEIGHT = "Sequential_0.weight"


@pytest.fixture(scope="module")
def trial_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """3 TRAIN steps (global 0-2) then 2 EVAL steps (global 3-4), every step saved."""
    out = tmp_path_factory.mktemp("reader") / "run"
    model = make_model()
    hook = smd.Hook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"])
    hook.register_module(model)
    train(model, hook, 3, mode=smd.modes.TRAIN)
    train(model, hook, 2, mode=smd.modes.EVAL)
    hook.close()
    return str(out)


def test_index_entries_and_step_conversions(trial_dir: str) -> None:
    trial = create_trial(trial_dir)
    entries = trial.index_entries(WEIGHT)
    assert isinstance(entries, TensorEntries)
    assert sorted(entries.values) == [0, 1, 2, 3, 4]
    assert all(isinstance(loc, Location) for by_worker in entries.values.values()
               for loc in by_worker.values())
    with pytest.raises(TensorUnavailable):
        trial.index_entries("no/such/tensor")
    with pytest.raises(KeyError):  # smdebug-era callers caught KeyError
        trial.index_entries("no/such/tensor")
    assert trial.tensor_count() == len(trial.tensor_names())

    assert list(trial.saved_steps()) == [0, 1, 2, 3, 4]
    assert list(trial.saved_steps(ModeKeys.EVAL)) == [0, 1]
    assert list(trial.saved_steps("train")) == [0, 1, 2]
    assert trial.to_global_step(1, ModeKeys.EVAL) == 4
    assert trial.to_global_step(1, "eval") == 4
    assert trial.to_global_step(2) == 2
    assert trial.to_global_step(99) is None and trial.to_global_step(5, ModeKeys.EVAL) is None
    assert trial.to_mode_steps({0, 1, 2, 3, 4}, ModeKeys.EVAL) == [0, 1]
    assert trial.to_mode_steps([4, 0, 3]) == [0, 3, 4]
    assert all(trial.is_step_complete(s) for s in range(5))


def test_record_reads_match_tensor_values(trial_dir: str) -> None:
    trial = create_trial(trial_dir)
    tensor = trial.tensor(WEIGHT)
    entries = trial.index_entries(WEIGHT)
    locations = [entries.values[s][min(entries.values[s])] for s in range(5)]
    one = trial.read_tensor(locations[4], WEIGHT, 1, ModeKeys.EVAL)
    np.testing.assert_array_equal(one, tensor.value(1, mode=ModeKeys.EVAL))
    many = trial.read_tensors(locations)
    for step, array in zip(range(5), many):
        np.testing.assert_array_equal(array, tensor.value(step))
    assert trial.reload_step(0) is False  # the index on disk is the one read

    loc = locations[0]
    assert loc.crc32c is not None
    damaged = dataclasses.replace(loc, crc32c=loc.crc32c ^ 1)
    with pytest.raises(CorruptRecordError):
        trial.read_tensor(damaged, WEIGHT, 0)
    with pytest.raises(CorruptRecordError):
        trial.read_tensors([damaged])

    wall = trial.step_wall_time(0)
    assert wall is not None and abs(wall - time.time()) < 3600
    assert trial.step_wall_time(99) is None


def test_raise_for_missing_step(tmp_path: Path) -> None:
    model = make_model()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=2),
                    include_collections=["weights"])
    hook.register_module(model)
    train(model, hook, 4)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert list(trial.saved_steps()) == [0, 2]
    with pytest.raises(StepUnavailable):
        trial.raise_for_missing_step(1)
    with pytest.raises(NoMoreData):
        trial.raise_for_missing_step(7)
    with pytest.raises(NoMoreData):
        trial.raise_for_missing_step(7, "global", WEIGHT)


# -- keyword arguments --------------------------------------------------------------------------
def test_unknown_keywords_are_named_with_the_valid_ones(trial_dir: str) -> None:
    with pytest.raises(MltraceTypeError) as info:
        create_trial(trial_dir, timout=5)
    message = str(info.value)
    assert "'timout'" in message and "did you mean 'timeout'?" in message
    for valid in ("range_steps", "timeout", "poll_interval", "out_dir"):
        assert valid in message
    assert isinstance(info.value, TypeError)

    with pytest.raises(MltraceTypeError, match="'rnage_steps' \\(did you mean 'range_steps'"):
        Trial(trial_dir, rnage_steps=(0, 2))
    with pytest.raises(MltraceTypeError, match="'zzz'"):  # nothing close: no suggestion
        Trial(trial_dir, zzz=1)


def test_smdebug_keywords_are_accepted(trial_dir: str) -> None:
    trial = create_trial(trial_dir, check=True, index_mode=True, cache=False, parallel=False,
                         output_dir="/opt/ml/processing/outputs/", range_steps=(0, 3))
    assert trial.steps() == [0, 1, 2]
    with pytest.raises(MltraceValueError, match="profiler"):
        create_trial(trial_dir, profiler=True)


# -- rule listeners get their options explicitly -------------------------------------------------
class _Recorder:
    def __init__(self, options: dict) -> None:
        self.options = options
        self.events: list[str] = []

    def started(self, rule, result) -> None:
        self.events.append("started")

    def step_evaluated(self, rule, result, step, met) -> None:
        self.events.append("step")

    def finished(self, rule, result) -> None:
        self.events.append("finished")


@pytest.fixture()
def recording_listeners(monkeypatch: pytest.MonkeyPatch) -> list[_Recorder]:
    """Replace the listener registry by one whose "mlflow" factory records its options."""
    made: list[_Recorder] = []
    registry: plugins.Registry = plugins.Registry("mltrace.tests.no_such_group")

    def factory(options: dict) -> _Recorder:
        made.append(_Recorder(options))
        return made[-1]

    registry.register("mlflow", factory)
    monkeypatch.setattr(plugins, "rule_listeners", registry)
    monkeypatch.delenv(rule_invoker.MLFLOW_PARENT_RUN_ENV, raising=False)
    return made


def test_invoke_rule_passes_listener_options(trial_dir: str,
                                             recording_listeners: list[_Recorder]) -> None:
    rule = VanishingGradient(create_trial(trial_dir), threshold=0.0)
    rule_invoker.invoke_rule(rule, end_step=3,
                             listener_options={"mlflow": {"parent_run_id": "abc"}})
    [listener] = recording_listeners
    assert listener.options == {"parent_run_id": "abc"}
    assert listener.events[0] == "started" and listener.events[-1] == "finished"
    rule_invoker.invoke_rule(VanishingGradient(create_trial(trial_dir)), end_step=1)
    assert recording_listeners[1].options == {}  # one listener per execution, its own options


def test_cli_parent_run_id_travels_as_an_option_not_through_the_environment(
        trial_dir: str, recording_listeners: list[_Recorder],
        monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--trial-dir", trial_dir, "--rule-name", "VanishingGradient", "--threshold", "0",
            "--end-step", "2", "--no-progress"]
    assert rule_invoker.main([*args, "--mlflow-parent-run-id", "from-flag"]) == 0
    assert recording_listeners[-1].options == {"parent_run_id": "from-flag"}
    assert rule_invoker.MLFLOW_PARENT_RUN_ENV not in os.environ
    # The environment variable stays a documented input of the CLI (read by main only).
    monkeypatch.setenv(rule_invoker.MLFLOW_PARENT_RUN_ENV, "from-env")
    assert rule_invoker.main(args) == 0
    assert recording_listeners[-1].options == {"parent_run_id": "from-env"}
    assert rule_invoker.main([*args, "--mlflow-parent-run-id", "flag-wins"]) == 0
    assert recording_listeners[-1].options == {"parent_run_id": "flag-wins"}


def test_mlflow_listener_takes_the_parent_as_an_option() -> None:
    from mltrace_mlflow.rules import create_listener

    listener = create_listener({"parent_run_id": "r1"})
    assert listener is not None and listener.parent_run_id == "r1"
    assert create_listener().parent_run_id is None  # type: ignore[union-attr]
    with pytest.raises(MltraceValueError, match="parent_run_id"):
        create_listener({"parent_id": "r1"})


# -- no private-member reaches on the read side --------------------------------------------------
READ_SIDE = ["mltrace/trials/tensor.py", "mltrace/trials/trial.py", "mltrace/trials/index.py",
             "mltrace/plugins.py", "mltrace/storage/__init__.py", "mlflow_plugin/rules.py",
             "mlflow_plugin/context.py",
             *sorted(str(p.relative_to(REPO)) for p in (REPO / "mltrace/rules").rglob("*.py"))]


def test_read_side_reaches_into_no_private_member() -> None:
    reaches = [f"{f}:{line}: {name}" for f in READ_SIDE for name, line in private_reaches(REPO / f)]
    assert reaches == []
