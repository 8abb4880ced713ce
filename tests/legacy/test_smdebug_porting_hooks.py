"""Issue 18, hooks, against real smdebug 1.0.34 (tests/porting/test_porting_hooks.py has the main suite's
side): the same scripts run with ``smdebug.<framework>`` and with ``mltrace.<framework>``.

1. ``save_tensor`` before the first step (PyTorch, MXNet): smdebug writes those values with the
   first step; mltrace writes the same names at the same step with the same values.
2. ``get_hook`` / ``set_hook`` / ``del_hook`` answer as smdebug's do, building the hook from the
   same JSON configuration file.
3. ``smdebug.pytorch`` and ``smdebug.mxnet``'s public names are all in ``mltrace.pytorch`` and
   ``mltrace.mxnet`` (also through ``import *``), and ``<framework>.hook.Hook`` imports.
4. Checkpoint state: a job preempted under smdebug resumes its step numbers under mltrace from the
   state smdebug kept, and a job preempted under mltrace resumes under smdebug.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
import smdebug.core.singleton_utils
import smdebug.mxnet
import smdebug.pytorch
import torch
from mxnet import autograd, gluon
from mxnet_models import batch, build_mlp
from smdebug.trials import create_trial as smd_create_trial

import mltrace.capture.hook
import mltrace.mxnet
import mltrace.pytorch
from mltrace.trials import create_trial

SUPPORT = Path(__file__).resolve().parents[1] / "support"
PRE_LOOP = {"before_forward": 1.0, "before_set_mode": 2.0, "after_set_mode": 3.0, "after_train": 4.0}


@pytest.fixture(autouse=True)
def _no_current_hook():
    mltrace.capture.hook.del_hook()
    smdebug.core.singleton_utils.del_hook()
    yield
    mltrace.capture.hook.del_hook()
    smdebug.core.singleton_utils.del_hook()


def _values_at_step_0(out_dir: str, names) -> dict[str, np.ndarray]:
    trial = smd_create_trial(out_dir)
    return {n: trial.tensor(n).value(0) for n in names if n in trial.tensor_names()
            and 0 in trial.tensor(n).steps()}


# -- 1. save_tensor before the first step ------------------------------------------------------
def _torch_job(lib: types.ModuleType, out_dir: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    hook = lib.Hook(out_dir=out_dir, save_config=lib.SaveConfig(save_interval=1))
    hook.register_module(model)
    hook.save_tensor("before_forward", np.full(2, PRE_LOOP["before_forward"]))
    hook.save_tensor("before_set_mode", np.full(2, PRE_LOOP["before_set_mode"]))
    hook.set_mode(lib.modes.TRAIN)
    hook.save_tensor("after_set_mode", np.full(2, PRE_LOOP["after_set_mode"]))
    model.train()
    hook.save_tensor("after_train", np.full(2, PRE_LOOP["after_train"]))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(3):
        model(torch.full((2, 3), float(i))).sum().backward()
        opt.step()
        opt.zero_grad()
    hook.close()


def _mxnet_job(lib: types.ModuleType, out_dir: str) -> None:
    net, loss_fn = build_mlp()
    hook = lib.Hook(out_dir=out_dir, save_config=lib.SaveConfig(save_interval=1))
    hook.register_block(net)
    hook.save_tensor("before_forward", np.full(2, PRE_LOOP["before_forward"]))
    hook.save_tensor("before_set_mode", np.full(2, PRE_LOOP["before_set_mode"]))
    hook.set_mode(lib.modes.TRAIN)
    hook.save_tensor("after_set_mode", np.full(2, PRE_LOOP["after_set_mode"]))
    hook.save_tensor("after_train", np.full(2, PRE_LOOP["after_train"]))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    for step in range(3):
        x, y = batch(net, step)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
    mx.nd.waitall()
    hook.close()


@pytest.mark.parametrize("job, smdebug_lib, mltrace_lib", [
    (_torch_job, smdebug.pytorch, mltrace.pytorch),
    (_mxnet_job, smdebug.mxnet, mltrace.mxnet),
])
def test_save_tensor_before_the_first_step_is_written_as_smdebug_writes_it(
        tmp_path, job, smdebug_lib, mltrace_lib):
    job(smdebug_lib, str(tmp_path / "smdebug"))
    job(mltrace_lib, str(tmp_path / "mltrace"))
    by_smdebug = _values_at_step_0(str(tmp_path / "smdebug"), PRE_LOOP)
    by_mltrace = _values_at_step_0(str(tmp_path / "mltrace"), PRE_LOOP)
    assert sorted(by_smdebug) == sorted(PRE_LOOP)  # smdebug's own behaviour, as the issue says
    assert sorted(by_mltrace) == sorted(by_smdebug)
    for name, value in by_smdebug.items():
        np.testing.assert_array_equal(by_mltrace[name], value, err_msg=name)
        np.testing.assert_array_equal(create_trial(str(tmp_path / "mltrace")).tensor(name).value(0),
                                      value)


# -- 2. get_hook / set_hook / del_hook -----------------------------------------------------------
def test_get_hook_set_hook_del_hook_answer_as_smdebugs(tmp_path, monkeypatch):
    config = tmp_path / "config.json"
    for lib_name in ("smdebug", "mltrace"):
        config.write_text(json.dumps({"LocalPath": str(tmp_path / lib_name),
                                      "HookParameters": {"save_interval": "3"}}))
        monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(config))
        pt = importlib.import_module(f"{lib_name}.pytorch")
        mxn = importlib.import_module(f"{lib_name}.mxnet")
        assert pt.get_hook() is None, lib_name
        hook = pt.get_hook(create_if_not_exists=True)
        assert isinstance(hook, pt.Hook) and pt.get_hook() is hook, lib_name
        assert hook.save_config.get_save_config(pt.modes.TRAIN).save_interval == 3, lib_name
        pt.del_hook()
        assert pt.get_hook() is None, lib_name
        pt.set_hook(hook)
        assert pt.get_hook() is hook, lib_name
        pt.del_hook()
        mx_hook = mxn.get_hook()  # MXNet's get_hook creates from the configuration
        assert isinstance(mx_hook, mxn.Hook) and mxn.get_hook() is mx_hook, lib_name
        for made in (hook, mx_hook):
            made.close()
        pt.del_hook()
        monkeypatch.delenv("SMDEBUG_CONFIG_FILE_PATH")
        assert mxn.get_hook() is None and pt.get_hook(create_if_not_exists=True) is None, lib_name


# -- 3. public names -----------------------------------------------------------------------------
def _public(module: types.ModuleType) -> set[str]:
    """Public names, leaving out the package's own submodules (``smdebug.pytorch.hook``)."""
    def submodule(value: object) -> bool:
        return isinstance(value, types.ModuleType) and value.__name__.startswith(module.__name__ + ".")

    return {n for n in dir(module) if not n.startswith("_") and not submodule(getattr(module, n))}


@pytest.mark.parametrize("framework", ["pytorch", "mxnet"])
def test_framework_modules_have_every_public_name_smdebugs_have(framework):
    theirs = _public(importlib.import_module(f"smdebug.{framework}"))
    assert {"Hook", "CollectionKeys", "get_hook", "set_hook", "del_hook"} <= theirs
    ours = importlib.import_module(f"mltrace.{framework}")
    assert theirs <= _public(ours), theirs - _public(ours)
    assert theirs <= set(ours.__all__), theirs - set(ours.__all__)  # from mltrace.<fw> import *
    hook_module = importlib.import_module(f"mltrace.{framework}.hook")
    assert hook_module.Hook is ours.Hook
    collection_module = importlib.import_module(f"mltrace.{framework}.collection")
    assert collection_module.Collection is ours.Collection


# -- 4. checkpoint state across smdebug and mltrace ---------------------------------------------
def _run_job(lib: str, out_dir: Path, ckpt_dir: Path, config: Path, die_at: int | None = None) -> None:
    args = [sys.executable, str(SUPPORT / "resume_training.py"), str(out_dir), str(ckpt_dir), lib, "12"]
    env = {**os.environ, "CHECKPOINT_CONFIG_FILE_PATH": str(config), "SMDEBUG_LOG_LEVEL": "error",
           "MLTRACE_LOG_LEVEL": "error"}
    subprocess.run(args + ([str(die_at)] if die_at is not None else []), env=env, check=True,
                   timeout=300, capture_output=True)


@pytest.mark.parametrize("first, second", [("smdebug", "mltrace"), ("mltrace", "smdebug")])
def test_a_job_preempted_under_one_resumes_its_steps_under_the_other(tmp_path, first, second):
    _run_job("mltrace", tmp_path / "ref", tmp_path / "unused", tmp_path / "absent.json")
    ckpt_dir, config = tmp_path / "checkpoints", tmp_path / "checkpointconfig.json"
    config.write_text(json.dumps({"LocalPath": str(ckpt_dir)}))
    _run_job(first, tmp_path / "run", ckpt_dir, config, die_at=9)  # checkpoints after 3 and 7
    states = json.loads((ckpt_dir / "metadata.json").read_text())
    assert [s["latest-global-step-seen"] for s in states] == [3, 7]
    _run_job(second, tmp_path / "run", ckpt_dir, config)  # resumes from the checkpoint of step 7
    ref = create_trial(str(tmp_path / "ref"))
    for trial in (create_trial(str(tmp_path / "run")), smd_create_trial(str(tmp_path / "run"))):
        assert trial.steps() == list(range(12))
        for name in ref.tensor_names():
            for step in ref.steps():
                np.testing.assert_allclose(trial.tensor(name).value(step), ref.tensor(name).value(step),
                                           rtol=1e-6, err_msg=f"{name} at step {step}")
