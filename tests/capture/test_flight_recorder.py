"""The flight recorder (mltrace.capture.flight_recorder) on a real PyTorch run: the steps around a
NaN are in the trial at full resolution, the first non-finite tensor is the one that was poisoned,
each trigger dumps, the memory budget holds, bad configurations fail at construction, and a dump
that cannot be written leaves training running."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

import mltrace.pytorch as smd
from mltrace.capture.json_config import parse_hook_config
from mltrace.capture.recorder_config import FlightRecorderConfig
from mltrace.exceptions import MltraceValueError
from mltrace.format.flight_record import read_records, record_key, write_request
from mltrace.storage import open_storage
from mltrace.trials import create_trial
from tests.support.flight_records import FIVE_REDUCTIONS
from tests.support.flight_training import POISONED, train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N, K = 20, 5
ACTS = ["fc1_output_0", "relu1_output_0", "fc2_output_0", "relu2_output_0", "fc3_output_0",
        "relu3_output_0", "fc4_output_0"]
GRADS = [f"gradient/Net_fc{i}.{p}" for i in range(1, 5) for p in ("weight", "bias")]


def _records(out_dir: str):
    return read_records(open_storage(out_dir))


def test_a_nan_at_a_random_step_dumps_the_steps_around_it_and_names_the_poisoned_tensor(tmp_path, caplog):
    poison = random.Random(15).randrange(40, 120)
    out = str(tmp_path / "run")
    with caplog.at_level(logging.ERROR, logger="mltrace"):
        train(out, steps=poison + 30, poison_step=poison)
    trial = create_trial(out)
    window = list(range(poison - N, poison + K + 1))
    assert trial.steps() == [0] + window  # save_interval=500 alone would have kept step 0
    for step in window:  # full resolution: every recorded tensor's reductions at every step
        for name in ACTS + GRADS:
            for red in FIVE_REDUCTIONS:
                assert np.isscalar(trial.tensor(name).reduction_value(step, red)) or \
                    trial.tensor(name).reduction_value(step, red).size == 1
        assert trial.tensor("MSELoss_output_0").value(step).size == 1
    # before the poisoned step all is finite; at it, fc2's output and what follows are NaN
    assert all(np.isfinite(trial.tensor(n).reduction_value(poison - 1, "max")) for n in ACTS + GRADS)
    assert np.isfinite(trial.tensor("relu1_output_0").reduction_value(poison, "max"))
    assert np.isnan(trial.tensor(POISONED).reduction_value(poison, "max"))
    (record,) = _records(out)
    (dump,) = record.dumps
    assert (dump.trigger, dump.step, dump.steps_before, dump.steps_after) == (
        "nonfinite", poison, window[:N], window[N + 1:])
    first = record.first_nonfinite
    assert first is not None and dump.first_nonfinite == first
    assert (first.tensor, first.step, first.mode, first.worker, first.phase) == (
        POISONED, poison, "GLOBAL", "worker_0", "forward")
    assert first.position == 2  # after fc1's and relu1's outputs, in call order
    assert first.nonfinite_tensors[:3] == [POISONED, "relu2_output_0", "fc3_output_0"]
    assert any(POISONED in r.getMessage() and "first non-finite" in r.getMessage().lower()
               for r in caplog.records)


def test_the_trial_says_which_steps_came_from_the_recorder(tmp_path):
    out = str(tmp_path / "run")
    train(out, steps=40, poison_step=30)
    record = json.loads((tmp_path / "run" / record_key("worker_0")).read_text())
    assert record["dumps"][0]["reason"].startswith(POISONED)
    assert sorted(record["dumps"][0]["steps_before"] + [30] + record["dumps"][0]["steps_after"]) == \
        create_trial(out).steps()[1:]


def test_raw_copies_are_kept_within_the_budget_and_the_oldest_dropped(tmp_path):
    # One step keeps raw copies of 7 activations (32x16 or 32x1 float32) and 8 gradients: about
    # 18 KB. A budget of 60 KB holds three steps, not twenty.
    budget = 60_000
    config = FlightRecorderConfig(steps=20, after_steps=2, collections=["gradients", "activations"],
                                  raw=True, memory_budget=budget)
    out = str(tmp_path / "run")
    run = train(out, steps=40, poison_step=30, recorder=config)
    assert 0 < run.max_ring_bytes <= budget
    (dump,) = _records(out)[0].dumps
    assert dump.steps_before == [27, 28, 29]
    trial = create_trial(out)
    assert trial.tensor(POISONED).value(29).shape == (32, 16)
    assert np.isnan(trial.tensor(POISONED).value(30)).all()
    assert np.isfinite(trial.tensor("fc1_output_0").value(30)).all()


def _inputs(steps: int) -> list[torch.Tensor]:
    """The model's input at each step of tests.support.flight_training.train (its data stream)."""
    data, xs = torch.Generator().manual_seed(1), []
    for _ in range(steps):
        xs.append(torch.randn(32, 8, generator=data))
        torch.randn(32, 1, generator=data)  # the targets
    return xs


SAMPLE_TENSORS = ["samples/MSELoss/loss", "samples/Net/fingerprint"]


def test_a_dump_holds_the_per_sample_losses_and_fingerprints_of_every_kept_step(tmp_path):
    """With ``samples=True`` (model and loss registered) the recorder keeps the ``samples``
    collection whole: a NaN's dump says which batch each step trained on and each sample's loss.
    By default it keeps none (a recompute of the loss per step)."""
    assert FlightRecorderConfig().samples is False
    out = str(tmp_path / "run")
    run = train(out, steps=40, poison_step=30, recorder=FlightRecorderConfig(
        steps=20, after_steps=5, collections=["gradients", "activations", "losses"],
        reductions=list(FIVE_REDUCTIONS), samples=True))
    trial, xs = create_trial(out), _inputs(40)
    assert trial.tensor_names(collection="samples") == SAMPLE_TENSORS
    for step in range(10, 36):
        losses = trial.tensor("samples/MSELoss/loss").value(step)
        assert losses.dtype == np.float32 and losses.shape == (32,)
        fingerprints = trial.tensor("samples/Net/fingerprint").value(step)
        np.testing.assert_array_equal(fingerprints, smd.fingerprint(xs[step]))
        if step == 30:  # the poisoned step: every sample's loss is NaN, as the loss is
            assert np.isnan(losses).all()
        else:
            assert np.mean(losses, dtype=np.float64) == pytest.approx(run.losses[step], rel=1e-5)
    assert trial.tensor("samples/Net/fingerprint").steps() == [0] + list(range(10, 36))


def test_samples_false_keeps_none_and_the_budget_counts_them(tmp_path):
    def config(samples: bool) -> FlightRecorderConfig:
        return FlightRecorderConfig(steps=20, after_steps=5, collections=["gradients", "losses"],
                                    reductions=list(FIVE_REDUCTIONS), samples=samples)

    without = train(str(tmp_path / "without"), steps=40, poison_step=30, recorder=config(False))
    with_samples = train(str(tmp_path / "with"), steps=40, poison_step=30, recorder=config(True))
    trial = create_trial(str(tmp_path / "without"))
    assert trial.steps() == [0] + list(range(10, 36))
    assert not [n for n in trial.tensor_names() if n.startswith("samples/")]
    assert "samples" not in trial.collections()
    assert create_trial(str(tmp_path / "with")).tensor_names(collection="samples") == SAMPLE_TENSORS
    # 20 kept steps, each with 32 fingerprints (8 bytes), 32 losses (4) and two entries (64)
    assert with_samples.max_ring_bytes - without.max_ring_bytes == 20 * (32 * 8 + 32 * 4 + 2 * 64)
    parsed = parse_hook_config({"LocalPath": str(tmp_path / "json"), "FlightRecorder": {"samples": "true"}})
    assert parsed.hook_kwargs["flight_recorder"].samples is True


def test_a_loss_spike_dumps(tmp_path):
    config = FlightRecorderConfig(steps=10, after_steps=2, collections=["losses", "gradients"],
                                  loss_spike=10.0, loss_window=20)
    out = str(tmp_path / "run")
    run = train(out, steps=50, poison_step=None, recorder=config, loss_scale_at=35)
    (dump,) = _records(out)[0].dumps
    assert dump.trigger == "loss_spike" and dump.step == 35
    assert "MSELoss_output_0" in dump.reason and "median" in dump.reason
    assert create_trial(out).tensor("MSELoss_output_0").value(35).item() == pytest.approx(run.losses[35])
    assert dump.steps_before == list(range(25, 35)) and dump.steps_after == [36, 37]


class _Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1e20  # finite, but its square (in the l2 norm and the std) is not


def test_finite_values_whose_norm_overflows_are_not_a_trigger(tmp_path):
    """The per-step check sums the step's reductions: an l2 norm or std that overflowed makes
    the sum infinite although every value is finite; min and max then say the tensor is fine."""
    out = str(tmp_path / "run")
    smd.get_collection("activations").include(r"^scale_output_0$")
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=500),
                    include_collections=["losses"], flight_recorder=FlightRecorderConfig(
                        steps=5, after_steps=1, collections=["activations"], loss_spike=None,
                        reductions=["min", "max", "l2"]))
    model = torch.nn.Sequential()
    model.add_module("fc", torch.nn.Linear(4, 8))
    model.add_module("scale", _Scale())
    hook.register_module(model)
    for _ in range(8):
        (model(torch.randn(16, 4)) * 0.0).sum().backward()
    assert _records(out) == []  # nothing fired
    hook.dump_flight_recorder("look at the ring")
    model(torch.randn(16, 4))
    hook.close()
    trial = create_trial(out)
    step = trial.steps()[-2]
    reduced = {r: float(trial.tensor("scale_output_0").reduction_value(step, r)) for r in ("min", "max", "l2")}
    assert np.isfinite([reduced["min"], reduced["max"]]).all() and reduced["l2"] == np.inf
    assert (_records(out)[0].dumps[0].trigger, _records(out)[0].first_nonfinite) == ("manual", None)


def test_a_manual_dump_mid_step_is_written_at_the_steps_end(tmp_path):
    def on_step(hook, step):
        if step == 12:
            hook.dump_flight_recorder("the validation curve looks odd")

    out = str(tmp_path / "run")
    train(out, steps=20, poison_step=None, on_step=on_step)
    (dump,) = _records(out)[0].dumps
    assert (dump.trigger, dump.step, dump.reason) == ("manual", 12, "the validation curve looks odd")
    assert dump.steps_before == list(range(0, 12)) and dump.steps_after == [13, 14, 15, 16, 17]
    assert create_trial(out).steps() == list(range(0, 18))


def test_a_rules_request_dumps_at_the_next_look(tmp_path):
    out = str(tmp_path / "run")

    def on_step(hook, step):
        if step == 15:  # what the dumpflightrecorder rule action writes into the trial
            write_request(open_storage(out), "loss flat", rule="LossNotDecreasing", step=14)

    train(out, steps=25, poison_step=None, on_step=on_step, stop_check_interval=0)
    (dump,) = _records(out)[0].dumps
    assert dump.trigger == "rule" and dump.reason == "rule LossNotDecreasing asked for a dump: loss flat"
    assert dump.step == 16  # looked for at the boundary that begins step 16


def test_an_exception_escaping_the_script_dumps_before_exit(tmp_path):
    out = str(tmp_path / "run")
    spec = {"steps": 40, "poison_step": 25, "fault": "raise"}
    done = subprocess.run([sys.executable, "-m", "tests.support.flight_training", out, json.dumps(spec)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "injected failure at step 25" in done.stderr
    (dump,) = _records(out)[0].dumps
    assert dump.trigger == "exception" and "RuntimeError: injected failure" in dump.reason
    assert dump.step == 25 and dump.steps_before == list(range(5, 25))
    trial = create_trial(out)
    assert 25 in trial.steps()  # the step that failed, as far as it ran (its forward)
    assert trial.tensor("fc4_output_0").reduction_value(25, "mean") is not None


def test_a_dump_that_cannot_be_written_is_logged_and_training_goes_on(tmp_path):
    out = str(tmp_path / "run")
    spec = {"steps": 40, "poison_step": 25, "fault": "disk_full",
            "recorder": None}
    spec.pop("recorder")
    done = subprocess.run([sys.executable, "-m", "tests.support.flight_training", out, json.dumps(spec)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(json.loads(done.stdout.strip().splitlines()[-1])["losses"]) == 40  # every step ran
    assert "flight recorder: nonfinite at step 25" in done.stderr
    assert "File too large" in done.stderr  # the cause of the lost files, named
    trial = create_trial(out)
    assert 0 in trial.steps()  # what was written before the disk filled is still there


def test_the_recorder_keeps_nothing_without_a_trigger_and_writes_no_record(tmp_path):
    out = str(tmp_path / "run")
    run = train(out, steps=60, poison_step=None)
    assert create_trial(out).steps() == [0]
    assert _records(out) == []
    assert run.max_ring_bytes > 0


def test_flight_recorder_config_is_exported_everywhere():
    import mltrace.xgboost

    assert mltrace.FlightRecorderConfig is smd.FlightRecorderConfig is FlightRecorderConfig
    assert mltrace.xgboost.FlightRecorderConfig is FlightRecorderConfig


def test_the_json_config_takes_a_flight_recorder_key(tmp_path):
    config = parse_hook_config({"LocalPath": str(tmp_path / "run"), "FlightRecorder": {
        "steps": "30", "after_steps": "4", "collections": "gradients,losses", "raw": "false",
        "loss_spike": "none"}})
    recorder = config.hook_kwargs["flight_recorder"]
    assert (recorder.steps, recorder.after_steps, recorder.collections, recorder.loss_spike) == (
        30, 4, ["gradients", "losses"], None)
    hook = smd.Hook(**config.hook_kwargs)
    assert hook.recorder is not None and hook.recorder.config.steps == 30
    hook.close()


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps=0"),
    ({"after_steps": 0}, "after_steps=0"),
    ({"steps": -5}, "steps=-5"),
    ({"memory_budget": 0}, "memory_budget=0"),
    ({"reductions": ["mean", "meen"]}, "meen"),
    ({"loss_spike": 0.5}, "loss_spike=0.5"),
])
def test_invalid_settings_fail_at_construction(kwargs, message):
    with pytest.raises(MltraceValueError, match=message):
        FlightRecorderConfig(**kwargs)


def test_an_unknown_collection_fails_when_the_hook_is_built(tmp_path):
    with pytest.raises(MltraceValueError, match="no collection 'gradient'.*did you mean 'gradients'"):
        smd.Hook(out_dir=str(tmp_path / "run"),
                 flight_recorder=FlightRecorderConfig(collections=["gradient"]))


def test_an_unknown_key_of_a_dict_config_is_named():
    with pytest.raises(MltraceValueError, match=r"unknown key\(s\) \['step'\]"):
        FlightRecorderConfig.parse({"step": 10})


def test_a_budget_too_small_for_one_step_fails_when_the_model_is_registered(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), flight_recorder=FlightRecorderConfig(
        collections=["gradients"], raw=True, memory_budget=10_000))
    with pytest.raises(MltraceValueError, match="cannot hold one step.*raw=False"):
        hook.register_module(torch.nn.Linear(100, 100))  # 40 KB of gradient per step
    hook.close()


def test_dump_without_a_recorder_says_how_to_get_one(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    with pytest.raises(MltraceValueError, match="flight_recorder=FlightRecorderConfig"):
        hook.dump_flight_recorder("why")
    hook.close()


def test_a_step_the_grad_scaler_skipped_is_not_a_trigger_but_a_nan_loss_is(tmp_path):
    # Mixed precision: a GradScaler meets inf gradients by design (here at once: a huge initial
    # scale) and skips the optimizer step; the recorder must not dump for that. A NaN loss
    # later is a real failure.
    out = str(tmp_path / "run")
    model, loss_fn = torch.nn.Linear(4, 1), torch.nn.MSELoss()
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=500),
                    flight_recorder=FlightRecorderConfig(steps=5, after_steps=1,
                                                         collections=["gradients", "losses"]))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)
    hook.register_grad_scaler(scaler)
    skipped = []
    for step in range(15):
        x = torch.randn(8, 4)
        if step == 10:
            x[0, 0] = float("nan")
        opt.zero_grad()
        scale = scaler.get_scale()
        y = torch.randn(8, 1) * (100.0 if step == 0 else 1.0)  # loss x scale overflows at step 0
        scaler.scale(loss_fn(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < scale)
    hook.close()
    assert skipped[0]  # the scaler did skip step 0, with inf gradients
    (dump,) = _records(out)[0].dumps
    assert dump.trigger == "nonfinite" and dump.step == 10
    assert dump.first_nonfinite is not None and dump.first_nonfinite.tensor == "MSELoss_output_0"


def test_steps_the_hook_saved_itself_keep_their_files_and_get_the_recorders_records(tmp_path):
    out = str(tmp_path / "run")
    run = train(out, steps=45, poison_step=35, save_config=smd.SaveConfig(save_interval=10))
    trial = create_trial(out)
    assert trial.steps() == [0, 10] + list(range(15, 41))
    for step in (10, 20, 30):  # saved by the save config, and inside the dump's window or not
        assert trial.tensor("MSELoss_output_0").value(step).item() == pytest.approx(run.losses[step])
    for step in (20, 30):  # in the window: the recorder's records are in the hook's own file
        assert np.isfinite(trial.tensor(POISONED).reduction_value(step, "mean"))
    (dump,) = _records(out)[0].dumps
    assert dump.steps_before == list(range(15, 35))


def test_after_its_last_dump_the_recorder_stops_recording(tmp_path, caplog):
    def on_step(hook, step):
        if step in (5, 20):
            hook.dump_flight_recorder(f"look at {step}")
        if step == 25:
            assert hook.recorder.enabled is False and hook.recorder.ring_bytes == 0
            assert not hook.step_active  # the callbacks are back to skipping steps

    config = FlightRecorderConfig(steps=3, after_steps=2, max_dumps=1,
                                  collections=["gradients", "activations", "losses"])
    out = str(tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        train(out, steps=30, poison_step=None, recorder=config, on_step=on_step)
    (dump,) = _records(out)[0].dumps
    assert (dump.step, dump.steps_before, dump.steps_after) == (5, [2, 3, 4], [6, 7])
    assert any("max_dumps" in r.getMessage() for r in caplog.records)


def test_steps_that_only_record_take_the_quiet_path_and_record_what_the_full_path_does(tmp_path, monkeypatch):
    """Between steps that only record (nothing of the hook's own due), the hook skips its own
    begin and end (Recording.end_quiet_step and begin_quiet_step) and the PyTorch callbacks hand
    tensors straight to the recorder; the dump must be the same as with every boundary decided
    in full (the plan never says a step is quiet)."""
    from mltrace.capture.plan import SavePlan

    decided: list[int] = []
    begin = SavePlan.begin
    monkeypatch.setattr(SavePlan, "begin", lambda plan, mode, mode_step:
                        decided.append(mode_step) or begin(plan, mode, mode_step))
    quiet = str(tmp_path / "quiet")
    train(quiet, steps=40, poison_step=30)
    assert len(decided) <= 5, decided  # step 0 and a few more: not one per step (40)
    monkeypatch.setattr(SavePlan, "quiet_steps", lambda plan, mode, mode_step: 0)
    full = str(tmp_path / "full")
    train(full, steps=40, poison_step=30)
    a, b = create_trial(quiet), create_trial(full)
    assert a.steps() == b.steps() == [0] + list(range(10, 36))
    assert sorted(a.tensor_names()) == sorted(b.tensor_names())
    for name in ACTS + GRADS:
        for step in a.steps()[1:]:
            for red in FIVE_REDUCTIONS:
                np.testing.assert_array_equal(a.tensor(name).reduction_value(step, red),
                                              b.tensor(name).reduction_value(step, red),
                                              err_msg=f"{name} {red} step {step}")
    def dumps(out):
        return [(d.trigger, d.step, d.steps_before, d.steps_after, d.first_nonfinite.tensor)
                for d in _records(out)[0].dumps]

    assert dumps(quiet) == dumps(full) == [("nonfinite", 30, list(range(10, 30)), list(range(31, 36)),
                                            POISONED)]


def test_a_min_max_recorder_dumps_the_values_and_the_first_non_finite_tensor_of_the_full_one(tmp_path):
    """The same run recorded with min and max alone (one aminmax per tensor, its results kept in
    their order) and with the default reductions (min and max among five): the dumped min and
    max are equal, and so is the first non-finite tensor."""
    runs = {}
    for label, reductions in (("minmax", ["min", "max"]), ("default", None)):
        out = str(tmp_path / label)
        config = smd.FlightRecorderConfig(steps=10, after_steps=3,
                                          collections=["gradients", "activations", "losses"],
                                          **({"reductions": reductions} if reductions else {}))
        train(out, steps=30, poison_step=20, recorder=config)
        runs[label] = out
    a, b = create_trial(runs["minmax"]), create_trial(runs["default"])
    assert a.steps() == b.steps() == [0] + list(range(10, 24))
    names = [n for n in b.tensor_names() if n.startswith(("gradient/", "fc", "relu"))]
    assert len(names) >= 15
    for name in names:
        for step in a.steps()[1:]:
            for red in ("min", "max"):
                np.testing.assert_array_equal(a.tensor(name).reduction_value(step, red),
                                              b.tensor(name).reduction_value(step, red),
                                              err_msg=f"{name} {red} step {step}")
    first = [read_records(open_storage(out))[0].first_nonfinite for out in runs.values()]
    assert [f.tensor for f in first] == [POISONED, POISONED]
    assert first[0].nonfinite_tensors == first[1].nonfinite_tensors


class _Twice(torch.nn.Module):
    """Calls one layer twice a step: its outputs are ``lin_output_0`` and ``lin_output_1``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.relu(self.lin(x)))


def _recording_twice(out_dir: str, activations: str, steps: int) -> tuple[smd.Hook, _Twice]:
    """A hook saving every 500 steps whose recorder keeps ``steps`` steps of the activations
    (``activations``: their regex), on a registered _Twice."""
    torch.manual_seed(0)
    smd.get_collection("activations").include(activations)
    hook = smd.Hook(out_dir=out_dir, include_collections=["losses"],
                    save_config=smd.SaveConfig(save_interval=500),
                    flight_recorder=FlightRecorderConfig(steps=steps, after_steps=1,
                                                         collections=["activations"]))
    model = _Twice()
    hook.register_module(model)
    return hook, model


def _first_call_max(model: _Twice, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.linear(x, model.lin.weight, model.lin.bias).max())


def test_a_module_called_twice_a_step_is_recorded_under_both_names(tmp_path):
    hook, model = _recording_twice(str(tmp_path / "run"), r"^lin_output_\d$", steps=5)
    x = torch.ones(2, 4)
    first = _first_call_max(model, x)
    for step in range(8):
        second = float(model(x).detach().max())
        if step == 6:
            hook.dump_flight_recorder("look")
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == list(range(8))  # 0 due to the hook, 1-5 before the dump, 6 and 7
    for step in (3, 6):
        assert trial.tensor("lin_output_0").reduction_value(step, "max") == pytest.approx(first)
        assert trial.tensor("lin_output_1").reduction_value(step, "max") == pytest.approx(second)
    assert "lin_output_2" not in trial.tensor_names()  # counted from 0 again at every step


def test_a_name_added_to_a_recorded_collection_during_training_is_recorded_from_the_next_step(tmp_path):
    """The recorder remembers how it keeps each name (most steps look nothing up) until the
    collections' memberships change: ``save_tensor(..., collections_to_write=...)`` adds a
    module output to a recorded collection at step 3, and it is recorded from step 4 on."""
    hook, model = _recording_twice(str(tmp_path / "run"), r"^lin_output_1$", steps=10)
    x = torch.ones(2, 4)
    for step in range(8):  # no optimizer: the weights stay as they are
        model(x)
        if step == 3:
            hook.save_tensor("lin_output_0", torch.zeros(1), collections_to_write="activations")
        if step == 6:
            hook.dump_flight_recorder("look")
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("lin_output_1").steps() == list(range(8))
    # step 3 holds the value saved by hand; the module's output is recorded from step 4 on
    assert trial.tensor("lin_output_0").steps() == [3, 4, 5, 6, 7]
    assert trial.tensor("lin_output_0").reduction_value(5, "max") == pytest.approx(_first_call_max(model, x))


def test_an_adapter_that_cannot_record_is_refused_with_the_fix(tmp_path):
    """The flight recorder needs a RecordingAdapter; a hook built on a framework adapter that
    is not one says so when it is built, naming the adapter and the fix."""
    from mltrace.capture.adapter import Adapter
    from mltrace.capture.hook import Hook as CoreHook
    from mltrace.capture.options import HookOptions

    options = HookOptions(out_dir=str(tmp_path / "run"), flight_recorder=FlightRecorderConfig())
    with pytest.raises(MltraceValueError, match="Adapter.*cannot record.*without flight_recorder"):
        CoreHook(options, Adapter())
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
