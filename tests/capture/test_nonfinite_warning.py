"""The training log's warning when a saved value turns NaN or infinite (mltrace.capture.
nonfinite_warning): exactly one warning per run, naming the tensor and the step, with no rule and
no flight recorder; later steps only counted (at close, INFO); only values already on the host
are looked at (one vectorised check per step's reductions); and the check never raises into
training."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn

import mltrace.pytorch as smd
from mltrace.capture import nonfinite_warning
from mltrace.capture.clock import StepClock
from mltrace.capture.hook import Hook, HookOptions
from mltrace.capture.nonfinite_warning import NonFiniteWarning
from mltrace.config import ReductionConfig, SaveConfig
from mltrace.format.tensors import BFloat16Bits
from mltrace.modes import ModeKeys
from mltrace.trials import create_trial
from tests.support.torch_training import make_model

LOSS = "MSELoss_output_0"


def _train(out_dir: str, steps: int = 8, poisoned: int | None = 3) -> smd.Hook:
    """SGD on a tiny model, gradients as reductions only; one target NaN at step ``poisoned``,
    which turns the loss, the gradients and then every weight NaN."""
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"])
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(
        reductions=["min", "max", "nan_count"], norms=["l2"])
    model, loss_fn = make_model(), nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    for i in range(steps):
        x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 1, generator=gen)
        if i == poisoned:
            y[0, 0] = float("nan")
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    hook.close()
    return hook


def _nonfinite_records(caplog, level: int = logging.WARNING) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("mltrace") and r.levelno == level
            and ("non-finite" in r.getMessage() or "NaN" in r.getMessage())]


def test_a_nan_loss_logs_exactly_one_warning_naming_the_tensor_and_the_step(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mltrace")
    hook = _train(str(tmp_path / "run"))
    assert hook.recorder is None and not hook.disabled  # no flight recorder, no rule
    (warning,) = _nonfinite_records(caplog)
    text = warning.getMessage()
    assert f"step 3 (TRAIN step 3): {LOSS} (NaN)" in text
    # the gradients of that step, by their reductions, each tensor once
    assert "gradient/Sequential_0.weight (min NaN, max NaN, nan_count 12, l2 NaN)" in text
    (summary,) = _nonfinite_records(caplog, logging.INFO)
    assert "5 step(s) saved a non-finite value, from step 3 (TRAIN step 3, MSELoss_output_0) to step 7" in summary.getMessage()
    assert np.isnan(create_trial(str(tmp_path / "run")).tensor(LOSS).value(3))  # saved as ever


def test_finite_training_says_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mltrace")
    _train(str(tmp_path / "run"), poisoned=None)
    assert not _nonfinite_records(caplog) and not _nonfinite_records(caplog, logging.INFO)


def test_a_nan_scalar_and_an_infinite_reduction_of_a_numpy_hook(tmp_path, caplog):
    """The core hook with numpy values: save_scalar and the reductions it hands over as records."""
    caplog.set_level(logging.WARNING, logger="mltrace")
    hook = Hook(HookOptions(out_dir=str(tmp_path / "run"), save_config=SaveConfig(save_interval=1),
                            include_collections=["grads"]))
    hook.get_collection("grads").include("^g$")
    hook.get_collection("grads").reduction_config = ReductionConfig(norms=["l2"])
    for step in range(4):
        hook.begin_step()
        hook.save_tensor("g", np.array([1.0, np.inf if step == 2 else 2.0]), "grads")
        hook.save_scalar("lr", float("nan") if step >= 2 else 0.1)
    hook.close()
    (warning,) = _nonfinite_records(caplog)
    text = warning.getMessage()
    assert "step 2 (GLOBAL step 2)" in text
    assert "g (l2 +inf)" in text and "scalar/lr (NaN)" in text


def test_only_values_already_on_the_host_are_checked(tmp_path, monkeypatch):
    """A finite run: one vectorised check of each step's reductions and none of a large raw
    tensor, no copy made for it (the check reads what the hook writes anyway)."""
    sizes: list[int] = []
    real = np.isfinite
    monkeypatch.setattr(nonfinite_warning.np, "isfinite", lambda a: sizes.append(np.size(a)) or real(a))
    _train(str(tmp_path / "run"), steps=5, poisoned=None)
    # per step: the 4 gradients' 4 reductions in one call; weights (<= 32 elements) raw each
    assert sizes.count(16) == 5 and max(sizes) <= 32 and len(sizes) <= 5 * 5
    w = NonFiniteWarning()
    big = np.full(nonfinite_warning.MAX_CHECKED_ELEMENTS + 1, np.nan, dtype=np.float32)
    sizes.clear()
    w.check("big", big)
    assert sizes == [] and w.found == []  # past the limit: seen through its reductions only


def test_checks_see_bfloat16_integers_and_counts(caplog):
    caplog.set_level(logging.WARNING, logger="mltrace")
    w = NonFiniteWarning()
    w.check("ints", np.array([1, 2, 3]))
    w.check("bf16", np.array([0x7FC0], dtype=np.uint16).view(BFloat16Bits))  # a bfloat16 NaN
    w.check_records([("ok", np.float32(1.0)), ("neg", np.array(-np.inf, dtype=np.float32))])
    integer = [False, True]
    w.check_block([("t", [("max", False), ("nan_count", False)], None)], integer, np.array([1.0, 2.0]))
    clock = StepClock()
    clock.set_mode(ModeKeys.TRAIN)
    clock.advance()
    w.end_step(clock)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "bf16 (NaN); also not finite at that step: neg (-inf), t (nan_count 2)" in warning
    assert "ints" not in warning


def test_the_check_never_raises_into_training(tmp_path, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(nonfinite_warning.np, "isfinite", broken)
    monkeypatch.setattr(nonfinite_warning.math, "isfinite", broken)
    caplog.set_level(logging.DEBUG, logger="mltrace")
    hook = _train(str(tmp_path / "run"))
    assert not hook.disabled
    assert create_trial(str(tmp_path / "run")).steps() == list(range(8))
    assert any("non-finite check" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_one_warning_however_many_tensors_and_steps_turn(kind, caplog):
    caplog.set_level(logging.WARNING, logger="mltrace")
    w = NonFiniteWarning()
    clock = StepClock()
    bad = np.nan if kind == "nan" else np.inf
    for _ in range(50):
        clock.advance()
        w.check_records([(f"t{i}", np.float32(bad)) for i in range(200)])
        w.end_step(clock)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "t0 (" in warning and "and 194 more" in warning and "step 0 (GLOBAL step 0)" in warning
    assert w.steps == 50 and w.last_step == 49
