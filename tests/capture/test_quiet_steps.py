"""Quiet steps: boundaries where the hook only counts (SavePlan.quiet_steps, mltrace.capture.quiet).

Most steps of a training save nothing; the hook skips its per-step work there. These tests check
that what is saved, and at which global and mode steps, is exactly what deciding every step
gives, whatever happens between boundaries (mode changes, scalars, tensors saved by hand, a
flush, a config changed during training).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import mltrace.pytorch as smd
from mltrace.capture.plan import QUIET_LIMIT
from mltrace.config import SaveConfigMode
from mltrace.modes import ModeKeys
from mltrace.trials import create_trial
from tests.support.torch_training import make_model, train


@pytest.mark.parametrize("interval,start,end,steps", [
    (1, 0, None, []), (7, 0, None, []), (5, 12, None, [3, 40]), (4, 0, 9, [2, 30]),
    (3, 0, 0, [5]), (10, 3, 50, []), (1000, 0, None, [999, 1001]),
])
def test_next_save_step_is_the_first_due_step(interval: int, start: int, end: int | None,
                                              steps: list[int]) -> None:
    cfg = SaveConfigMode(save_interval=interval, start_step=start, end_step=end, save_steps=steps)
    due = [s for s in range(1200) if cfg.should_save_step(s)]
    for step in range(1100):
        expected = next((s for s in due if s >= step), None)
        found = cfg.next_save_step(step)
        if expected is None:  # nothing due in the window looked at: nothing due ever
            assert found is None or found >= 1200, (step, found)
        else:
            assert found == expected, (step, found, expected)


def _saved(out_dir: Path) -> dict[str, list[tuple[int, str, int]]]:
    """Tensor name -> [(global step, mode, mode step)] as the trial has them."""
    trial = create_trial(str(out_dir))
    out: dict[str, list[tuple[int, str, int]]] = {}
    for name in trial.tensor_names():
        out[name] = []
        for step in trial.tensor(name).steps():
            mode, mode_step = trial.mode_modestep(step)
            assert mode is not None and mode_step is not None
            out[name].append((step, mode.name, mode_step))
    return out


def _script(out_dir: Path, quiet: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, list[tuple[int, str, int]]], int]:
    """A run that saves every 7 TRAIN steps and every 3 EVAL steps, switches modes, saves scalars
    and tensors by hand between and inside steps, flushes, and changes a config mid-run (the
    global step of that change is returned with what the trial holds)."""
    if not quiet:  # the reference: every boundary decided in full
        monkeypatch.setattr("mltrace.capture.plan.SavePlan.quiet_steps", lambda self, mode, step: 0)
    torch.manual_seed(0)
    model = make_model()
    cfg = smd.SaveConfig({ModeKeys.TRAIN: SaveConfigMode(save_interval=7),
                          ModeKeys.EVAL: SaveConfigMode(save_interval=3)})
    hook = smd.Hook(out_dir=str(out_dir), save_config=cfg,
                    include_collections=["weights", "gradients", "losses", "mine"])
    hook.register_module(model)
    # saved by hand at TRAIN step 23, the step open when it is given
    mine = hook.get_collection("mine")
    mine.add_tensor_name("by_hand")
    mine.save_config = smd.SaveConfig(end_step=0, save_steps=[23, 24])
    train(model, hook, 20, mode=smd.modes.TRAIN)  # ends inside a run of quiet TRAIN steps
    hook.set_mode(smd.modes.EVAL)  # TRAIN's quiet steps must not carry over into EVAL
    model(torch.ones(2, 4))  # EVAL step 0 is due
    model(torch.ones(2, 4))  # EVAL step 1 is not
    hook.save_scalar("eval_1", 1.0)
    hook.save_scalar("between", 1.0)
    train(model, hook, 5, mode=smd.modes.EVAL)
    train(model, hook, 4, mode=smd.modes.TRAIN)
    hook.save_tensor("by_hand", np.arange(3.0), "mine")
    train(model, hook, 9, mode=smd.modes.TRAIN)
    hook.flush()
    train(model, hook, 6, mode=smd.modes.TRAIN)
    hook.save_scalar("inside", 2.0)  # in TRAIN step 38, between quiet ones (7 and 42 are due)
    train(model, hook, 12, mode=smd.modes.TRAIN)
    changed_at = hook.step
    hook.get_collection("weights").save_config = smd.SaveConfig(save_interval=2)
    train(model, hook, 2 * QUIET_LIMIT + 10, mode=smd.modes.TRAIN)
    hook.close()
    return _saved(out_dir), changed_at


def test_quiet_steps_save_what_deciding_every_step_saves(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    quiet, changed_at = _script(tmp_path / "quiet", True, monkeypatch)
    with monkeypatch.context() as patched:
        every, _ = _script(tmp_path / "every", False, patched)
    assert quiet.keys() == every.keys()
    assert quiet["scalar/between"] and quiet["scalar/inside"] and quiet["by_hand"]
    assert [m for _, m, _ in quiet["scalar/eval_1"]] == ["EVAL"]
    assert quiet["scalar/eval_1"][0][2] == 1
    weights = [n for n in every if n.startswith("Sequential") and "output" not in n]
    assert weights
    for name in every:
        if name not in weights:
            assert quiet[name] == every[name], name
            continue
        # a save config changed during training takes effect within QUIET_LIMIT steps
        settled = changed_at + QUIET_LIMIT + 1
        assert [x for x in quiet[name] if x[0] <= changed_at] == [x for x in every[name] if x[0] <= changed_at]
        assert [x for x in quiet[name] if x[0] >= settled] == [x for x in every[name] if x[0] >= settled]
        assert set(quiet[name]) <= set(every[name])


def test_a_quiet_run_counts_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(out_dir: Path) -> tuple[list[int], int, dict[ModeKeys, int]]:
        model = make_model()
        hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=50),
                        include_collections=["weights"])
        hook.register_module(model)
        train(model, hook, 230, mode=smd.modes.TRAIN)
        train(model, hook, 130, mode=smd.modes.EVAL)
        step, mode_steps = hook.step, dict(hook.mode_steps)
        hook.close()
        return create_trial(str(out_dir)).steps(), step, mode_steps

    quiet = run(tmp_path / "quiet")
    monkeypatch.setattr("mltrace.capture.plan.SavePlan.quiet_steps", lambda self, mode, step: 0)
    assert quiet == run(tmp_path / "every")
    assert quiet[1] == 359 and quiet[2][ModeKeys.TRAIN] == 229 and quiet[2][ModeKeys.EVAL] == 129
    assert quiet[0] == [0, 50, 100, 150, 200, 230, 280, 330]


def test_xgboost_rounds_take_quiet_steps_and_save_what_deciding_every_round_saves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """XGBoost numbers its steps (the boosting round): a round that is the next counted step
    may be quiet; a training resumed from a saved model jumps to its round and is decided."""
    xgb = pytest.importorskip("xgboost")
    import mltrace.xgboost as smd_xgb

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4))
    data = xgb.DMatrix(x, label=x[:, 0] + rng.normal(scale=0.1, size=200))
    params = {"max_depth": 2, "nthread": 1, "seed": 0}

    def run(out_dir: Path) -> tuple[dict[str, list[tuple[int, str, int]]], int]:
        first = smd_xgb.Hook(out_dir=str(out_dir / "a"), save_config=smd_xgb.SaveConfig(save_interval=7),
                             include_collections=["metrics", "feature_importance"])
        booster = xgb.train(params, data, 30, evals=[(data, "train")], callbacks=[first])
        first.close()
        # resumed from the saved model by a new hook: its first round is round 30
        second = smd_xgb.Hook(out_dir=str(out_dir / "b"), save_config=smd_xgb.SaveConfig(save_interval=7),
                              include_collections=["metrics", "feature_importance"])
        xgb.train(params, data, 25, evals=[(data, "train")], callbacks=[second], xgb_model=booster)
        step = second.step
        second.close()
        return {**_saved(out_dir / "a"), **{f"b/{k}": v for k, v in _saved(out_dir / "b").items()}}, step

    from mltrace.capture.quiet import QuietLane

    skipped = []
    lane = QuietLane._quiet_lane

    def counted_lane(hook):
        take = lane(hook)
        return lambda step=None, look=False: skipped.append(take(step, look)) or skipped[-1]

    with monkeypatch.context() as spied:
        spied.setattr(QuietLane, "_quiet_lane", counted_lane)
        quiet, last = run(tmp_path / "quiet")
    assert sum(skipped) >= 30  # most rounds were only counted (37 of 55)
    monkeypatch.setattr("mltrace.capture.plan.SavePlan.quiet_steps", lambda self, mode, step: 0)
    every, _ = run(tmp_path / "every")
    assert quiet == every
    assert last == 54
    assert [s for s, _, _ in quiet["train-rmse"]] == [0, 7, 14, 21, 28]
    assert [s for s, _, _ in quiet["b/train-rmse"]] == [35, 42, 49]
