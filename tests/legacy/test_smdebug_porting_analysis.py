"""Real smdebug 1.0.34's reader and mltrace's answer the same analysis questions on the same files
(issue 18): ``has_passed_step`` in every mode, ``steps``, ``last_complete_step`` and
``last_index_token`` for smdebug's has_passed_step scenarios (complete and incomplete jobs, one
and three workers, two modes), each written once by mltrace's writer and once by smdebug's own
FileWriter; and analysis-side collections queried the same way through both readers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from smdebug.core.collection_manager import CollectionManager as SmdCollectionManager
from smdebug.core.modes import ModeKeys as SmdModeKeys
from smdebug.core.writer import FileWriter
from smdebug.trials import LocalTrial as SmdLocalTrial
from smdebug.trials import create_trial as smd_create_trial

from mltrace.modes import ModeKeys
from mltrace.trials import LocalTrial, create_trial
from tests.support.porting_trials import SCENARIOS, write_scenario

MODES = ("GLOBAL", "TRAIN", "EVAL")


def write_scenario_with_smdebug(path: Path, workers: dict[str, list[int]], ended: bool,
                                modes: dict[int, tuple[str, int]] | None = None) -> str:
    """The same trial as tests.support.porting_trials.write_scenario, written by smdebug's FileWriter."""
    manager = SmdCollectionManager()
    manager.add("default")
    manager.set_num_workers(len(workers))
    for worker in workers:
        manager.export(str(path), f"{worker}_collections.json")
    for worker, steps in workers.items():
        for step in steps:
            mode, mode_step = (modes or {}).get(step, ("GLOBAL", step))
            writer = FileWriter(trial_dir=str(path), step=step, worker=worker)
            writer.write_tensor(tdata=np.ones(2, dtype=np.float32), tname="gradients/dummy:0",
                                mode=SmdModeKeys[mode], mode_step=mode_step)
            writer.close()
    if ended:
        (path / "training_job_end.ts").touch()
    return str(path)


def _answers(trial, mode_keys) -> dict:
    """Every answer the two readers must agree on (the refreshing queries first, as a notebook
    asks them)."""
    out = {"workers": len(trial.workers()),
           "all_steps": {m: list(trial.steps(mode=mode_keys[m], show_incomplete_steps=True))
                         for m in MODES},
           "steps": {m: list(trial.steps(mode=mode_keys[m])) for m in MODES},
           "loaded_all_steps": trial.loaded_all_steps,
           "last_complete_step": trial.last_complete_step,
           "last_index_token": trial.last_index_token}
    out["has_passed_step"] = {(s, m): trial.has_passed_step(s, mode_keys[m]).name
                              for m in MODES for s in range(0, 82)}
    return out


@pytest.mark.parametrize("writer", ["mltrace", "smdebug"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_smdebug_and_mltrace_readers_agree(tmp_path, name, writer):
    workers, ended, modes, *_ = SCENARIOS[name]
    write = write_scenario if writer == "mltrace" else write_scenario_with_smdebug
    path = write(tmp_path / name, workers, ended, modes)
    ours = _answers(create_trial(path), {m: ModeKeys[m] for m in MODES})
    theirs = _answers(smd_create_trial(path), {m: SmdModeKeys[m] for m in MODES})
    assert ours == theirs
    assert ours["last_index_token"] is not None  # every scenario has a complete step


def test_analysis_side_collections_answer_as_smdebugs(tmp_path):
    workers = {"worker_0": list(range(6))}
    path = write_scenario_with_smdebug(tmp_path / "run", workers, True)
    ours, theirs = create_trial(path), smd_create_trial(path)
    assert type(ours) is LocalTrial and type(theirs) is SmdLocalTrial
    for trial in (ours, theirs):
        trial.collection("test").include("dummy")
        trial.collection("other").add_tensor_name("gradients/dummy:0")
        trial.collection("none").add_tensor_name("absent")
    for name in ("test", "other", "none", "default"):
        assert ours.tensor_names(collection=name) == theirs.tensor_names(collection=name)
        assert ours.tensor_names(collection=ours.collection(name)) == theirs.tensor_names(
            collection=theirs.collection(name))
    for trial in (ours, theirs):
        with pytest.raises(ValueError):
            trial.tensor_names(collection="test", regex="dummy")


def _train_with(smd_module, out_dir: Path):
    """TRAIN 3 steps, EVAL 3, TRAIN 2 with a PyTorch hook of ``smd_module`` (mltrace's or
    smdebug's), saving TRAIN steps every step and EVAL steps every other; the hook is returned
    open."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    save_config = smd_module.SaveConfig(mode_save_configs={
        smd_module.modes.TRAIN: smd_module.SaveConfigMode(save_interval=1),
        smd_module.modes.EVAL: smd_module.SaveConfigMode(save_interval=2)})
    hook = smd_module.Hook(out_dir=str(out_dir), save_config=save_config,
                           include_collections=["weights", "losses"])
    hook.register_module(model)
    loss_fn = torch.nn.MSELoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for mode, steps in (("TRAIN", 3), ("EVAL", 3), ("TRAIN", 2)):
        hook.set_mode(getattr(smd_module.modes, mode))
        for _ in range(steps):
            x, y = torch.randn(5, 4), torch.randn(5, 1)
            loss = loss_fn(model(x), y)
            if mode == "TRAIN":
                opt.zero_grad()
                loss.backward()
                opt.step()
    return hook


@pytest.mark.parametrize("writer", ["mltrace", "smdebug"])
def test_readers_agree_on_a_hook_run_while_it_runs_and_after(tmp_path, writer):
    """A run written by a real hook (mltrace's, then smdebug's), read while the job is still
    open (incomplete: no end marker) and again after close()."""
    import smdebug.pytorch as smd_torch

    import mltrace.pytorch as ml_torch

    hook = _train_with(ml_torch if writer == "mltrace" else smd_torch, tmp_path / "run")
    if writer == "mltrace":
        hook.flush()  # the files of every step so far, no end marker
    path = str(tmp_path / "run")
    keys = ({m: ModeKeys[m] for m in MODES}, {m: SmdModeKeys[m] for m in MODES})
    running = _answers(create_trial(path), keys[0])
    assert running == _answers(smd_create_trial(path), keys[1])
    assert running["loaded_all_steps"] is False and running["steps"]["EVAL"]
    hook.close()
    ended = _answers(create_trial(path), keys[0])
    assert ended == _answers(smd_create_trial(path), keys[1])
    assert ended["loaded_all_steps"] is True
