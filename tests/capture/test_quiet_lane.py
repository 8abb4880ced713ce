"""The quiet lane (mltrace.capture.quiet): a PyTorch step at which the hook has nothing to do is
begun in one call from the model's pre-hook, and every step that needs more still gets it: the
decided steps, a rule's stop request, a mode change, another model, a failure in the lane."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import mltrace.pytorch as smd
from mltrace import ModeKeys
from mltrace.exceptions import StopTrainingRequested
from mltrace.format import paths
from mltrace.trials import create_trial
from tests.support.torch_training import make_model, train


def _hook(out: Path, interval: int, **options: object) -> smd.Hook:
    return smd.Hook(out_dir=str(out), save_config=smd.SaveConfig(save_interval=interval),
                    include_collections=["weights", "gradients", "losses"], **options)


def _count_full_boundaries(hook: smd.Hook, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The steps whose boundary went the full way (Hook.begin_step), recorded as they begin."""
    full: list[int] = []
    begin_step = hook.begin_step

    def counted(step: int | None = None) -> None:
        begin_step(step)
        full.append(hook.step)

    monkeypatch.setattr(hook, "begin_step", counted)
    return full


def _train_with_loss(hook: smd.Hook, steps: int) -> None:
    """Register a model and its loss module with ``hook``, train, and close the hook."""
    model, loss_fn = make_model(), nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, hook, steps, loss_fn=loss_fn)
    hook.close()


def test_quiet_steps_take_the_lane_and_the_trial_is_the_same(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(tmp_path / "lane", 25, stop_check_interval=3600)  # one look, at step 0
    full = _count_full_boundaries(hook, monkeypatch)
    _train_with_loss(hook, 120)
    assert hook.step == 119
    # Steps 0, 25, 50, 75, 100 save. Each is decided in full, and so are the two after it: the
    # first ends the saved step, the second (nothing open any more) counts the quiet steps
    # ahead, which then take the lane: 15 of 120 boundaries go the full way.
    assert full == [0, 1, 2, 25, 26, 27, 50, 51, 52, 75, 76, 77, 100, 101, 102], full

    reference = _hook(tmp_path / "full", 25)
    reference.take_quiet_step = lambda *args, **kwargs: False  # every boundary the full way
    _train_with_loss(reference, 120)

    lane, ref = create_trial(str(tmp_path / "lane")), create_trial(str(tmp_path / "full"))
    assert lane.steps() == ref.steps() == [0, 25, 50, 75, 100]
    assert sorted(lane.tensor_names()) == sorted(ref.tensor_names())
    for name in ref.tensor_names():
        for step in ref.tensor(name).steps():
            assert (lane.tensor(name).value(step) == ref.tensor(name).value(step)).all(), (name, step)


def test_a_stop_request_is_seen_at_the_next_look_during_quiet_steps(tmp_path: Path) -> None:
    """The lane leaves a boundary to the full way once the stop signal is due for a look (here
    every 50 ms), so a rule's request ends training there, not at the next saved step."""
    hook = _hook(tmp_path, 1000, stop_check_interval=0.05)
    model = make_model()
    hook.register_module(model)
    x = torch.ones(8, 4)
    asked_at = None
    with pytest.raises(StopTrainingRequested):
        for step in range(400):
            if step == 30:
                (tmp_path / paths.STOP_SIGNAL_FILE).write_text('{"rule": "LossNotDecreasing", "step": 29}')
                asked_at = step
            model(x).pow(2).mean().backward()
            time.sleep(0.005)
    assert asked_at is not None
    assert hook.step - asked_at <= 20, f"stopped at step {hook.step}, asked at {asked_at}"
    assert hook.closed


def test_a_mode_change_between_quiet_steps_goes_the_full_way(tmp_path: Path) -> None:
    hook = _hook(tmp_path, 10)
    model = make_model()
    hook.register_module(model)
    train(model, hook, 13, mode=ModeKeys.TRAIN)  # steps 0-12; 3-9 and 12 quiet
    train(model, hook, 12, mode=ModeKeys.EVAL, start=13)
    hook.close()
    assert hook.mode_steps[ModeKeys.TRAIN] == 12 and hook.mode_steps[ModeKeys.EVAL] == 11
    trial = create_trial(str(tmp_path))
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 10]
    assert trial.steps(mode=ModeKeys.EVAL) == [0, 10]  # EVAL counts its own steps from 0


def test_a_second_model_and_activation_checkpointing_begin_no_step(tmp_path: Path) -> None:
    """Only the first registered model's forward is a step boundary, and its forward re-run by
    activation checkpointing inside backward is none either: on quiet steps too."""
    hook = _hook(tmp_path, 50)
    model = make_model(1)
    other = make_model(2)
    hook.register_module(model)
    hook.register_module(other)
    x = torch.ones(8, 4, requires_grad=True)
    for _ in range(30):
        out = torch.utils.checkpoint.checkpoint(model, x, use_reentrant=False)
        (out + other(x)).pow(2).mean().backward()
    hook.close()
    assert hook.step == 29


def test_a_failure_in_the_lane_stops_the_hook_not_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    hook = _hook(tmp_path, 5)
    model = make_model()
    hook.register_module(model)
    train(model, hook, 8)  # saves steps 0 and 5; 7 is quiet, the lane is ready for 8
    assert hook.clock.quiet > 0

    def broken(step: int | None = None) -> None:
        raise RuntimeError("a bug in the clock")

    monkeypatch.setattr(hook.clock, "advance", broken)
    with caplog.at_level(logging.ERROR, logger="mltrace.capture.hook"):
        train(model, hook, 5, start=8)  # training goes on
    assert hook.disabled
    assert "the quiet lane: RuntimeError: a bug in the clock" in caplog.text
    hook.close()
    assert create_trial(str(tmp_path)).steps() == [0, 5]  # what was written stays readable


def test_no_forward_hook_stays_on_a_model_whose_outputs_are_not_saved(tmp_path: Path) -> None:
    """The hook that saves what a compiled forward recorded runs only where module outputs can
    be saved: any hook takes a module off torch's hook-less fast path for every call."""
    hook = _hook(tmp_path / "params", 10)
    model = make_model()
    hook.register_module(model)
    train(model, hook, 2)
    assert len(model._forward_pre_hooks) == 1
    assert not any(m._forward_hooks for m in model.modules())
    hook.close()

    hook = smd.Hook(out_dir=str(tmp_path / "outputs"), save_config=smd.SaveConfig(save_interval=10),
                    include_regex=[r"Sequential_output_0"])
    model = make_model()
    hook.register_module(model)
    train(model, hook, 2)
    # one hook saves the model's output, then what a compiled run recorded
    assert len(model._forward_hooks) == 1
    assert not any(m._forward_hooks for m in list(model.modules())[1:])
    hook.close()
    assert create_trial(str(tmp_path / "outputs")).tensor("Sequential_output_0").steps() == [0]


def test_what_torch_compile_returned_gets_the_boundary_in_its_forward_not_a_hook(tmp_path: Path) -> None:
    """The compiled wrapper's call keeps torch's hook-less fast path: the boundary wraps the
    compiled call torch keeps in its ``forward`` attribute, and steps are counted and saved."""
    torch._dynamo.reset()
    hook = _hook(tmp_path, 5)
    compiled = torch.compile(make_model(), backend="aot_eager")
    hook.register_module(compiled)
    train(compiled, hook, 12)
    hook.close()
    assert not compiled._forward_pre_hooks and not compiled._forward_hooks
    assert hook.step == 11
    trial = create_trial(str(tmp_path))
    assert trial.tensor("gradient/Sequential_0.weight").steps() == [0, 5, 10]
    torch._dynamo.reset()


def test_steps_the_flight_recorder_records_take_the_lane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder's boundary (its step's end, the next one's begin) is done in the lane too;
    what it records is checked against full boundaries in tests/capture/test_flight_recorder.py."""
    hook = _hook(tmp_path, 1000, stop_check_interval=3600,
                 flight_recorder=smd.FlightRecorderConfig(steps=10, collections=["gradients"]))
    full = _count_full_boundaries(hook, monkeypatch)
    model = make_model()
    hook.register_module(model)
    train(model, hook, 60)
    assert hook.recorder is not None and len(hook.recorder.ring) == 10
    hook.close()
    # step 0 saves; 1 ends it and counts the recorder's next steps ahead (at most 100)
    assert full == [0, 1], full


def test_a_loss_modules_inputs_are_saved_where_a_collection_asks_for_them(tmp_path: Path) -> None:
    """A loss registered before the first step learns at its first saving step which of its
    sides some collection can hold: here its inputs (the prediction and the target), on every
    step, with their values."""
    hook = smd.Hook(out_dir=str(tmp_path), save_config=smd.SaveConfig(save_interval=1),
                    include_regex=[r"^MSELoss_input_\d$"])
    model, loss_fn = nn.Linear(3, 1), nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    x, y = torch.ones(2, 3), torch.full((2, 1), 7.0)
    predictions = []
    for _ in range(3):
        prediction = model(x)
        predictions.append(prediction.detach().clone())
        loss_fn(prediction, y).backward()
    hook.close()
    trial = create_trial(str(tmp_path))
    assert trial.tensor("MSELoss_input_1").steps() == [0, 1, 2]
    for step, prediction in enumerate(predictions):
        torch.testing.assert_close(torch.from_numpy(trial.tensor("MSELoss_input_0").value(step)), prediction)
        assert (trial.tensor("MSELoss_input_1").value(step) == 7.0).all()
