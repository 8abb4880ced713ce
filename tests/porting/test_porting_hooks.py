"""Issue 18, hooks: smdebug 1.0.34 behaviours a ported script relies on (each checked against
smdebug's source; tests/legacy/test_smdebug_porting_hooks.py runs real smdebug on the same cases).

1. ``save_tensor`` before the first step is kept and written with the first step.
2. A step's files are on disk when training ends (Keras' on_train_end, a tf.compat.v1 session's
   end, XGBoost's after_training, ``hook.flush()``), the TensorBoard folder exists once the export
   starts, and a hook left open writes nothing into an out_dir someone re-created.
3. ``get_hook`` / ``set_hook`` / ``del_hook`` in the four framework modules, ``get_hook`` building
   the hook from the JSON configuration when asked.
4. smdebug's import paths and each framework module's public names (smdebug's lists below are
   copied from its ``__init__.py`` files; the legacy suite compares with the installed package).
5. A job restarted from a checkpoint continues its step numbers (checkpoint state beside the
   checkpoints, named by CHECKPOINT_CONFIG_FILE_PATH).
6. SessionHook with ``save_all``: ``gradients`` holds the wrapped optimizer's gradients only.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import torch
import xgboost as xgb

import mltrace.capture.hook
import mltrace.pytorch as smd
import mltrace.tensorflow as smd_tf
import mltrace.xgboost as smd_xgb
from mltrace.exceptions import MltraceValueError
from mltrace.modes import ModeKeys
from mltrace.trials import create_trial

SUPPORT = Path(__file__).resolve().parents[1] / "support"
v1 = tf.compat.v1


@pytest.fixture(autouse=True)
def _no_current_hook():
    """Each test starts and ends with no current hook (get_hook is process-wide)."""
    mltrace.capture.hook.del_hook()
    yield
    mltrace.capture.hook.del_hook()


def _torch_loop(hook: smd.Hook, model: torch.nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        model(torch.full((2, 3), float(i))).sum().backward()
        opt.step()
        opt.zero_grad()
        hook.save_tensor("in_loop", np.array([i, i], dtype=np.float32))


# -- 1. save_tensor before the first step ------------------------------------------------------
def test_pytorch_save_tensor_before_the_first_step_is_written_with_step_0(tmp_path):
    out_dir = str(tmp_path / "run")
    model = torch.nn.Linear(3, 2)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    hook.register_module(model)
    hook.save_tensor("before_forward", np.ones(2))
    hook.save_tensor("before_set_mode", np.full(2, 2.0))
    hook.set_mode(smd.modes.TRAIN)
    hook.save_tensor("after_set_mode", np.full(2, 3.0))
    model.train()
    config = np.full(2, 4.0)
    hook.save_tensor("after_train", config, "config")
    config[:] = -1  # the caller's array changes: the value saved stays
    _torch_loop(hook, model, 3)
    hook.close()
    trial = create_trial(out_dir)
    for name, value in (("before_forward", 1.0), ("before_set_mode", 2.0), ("after_set_mode", 3.0),
                        ("after_train", 4.0)):
        assert trial.tensor(name).steps() == [0], name
        np.testing.assert_array_equal(trial.tensor(name).value(0), np.full(2, value))
    assert trial.tensor("in_loop").steps() == [0, 1, 2]
    assert trial.tensor_names(collection="config") == ["after_train"]
    assert "before_forward" in trial.tensor_names(collection="default")


def test_save_tensor_before_training_fills_a_collection_named_in_include_collections(tmp_path):
    out_dir = str(tmp_path / "run")
    model = torch.nn.Linear(3, 2)
    hook = smd.Hook(out_dir=out_dir, include_collections=["setup"])
    hook.register_module(model)
    hook.save_tensor("input_sample", np.arange(3.0), "setup")  # "setup" exists only this way
    hook.save_tensor("input_sample", np.arange(3.0) * 2, "setup")  # the later value wins
    _torch_loop(hook, model, 1)
    hook.close()
    trial = create_trial(out_dir)
    np.testing.assert_array_equal(trial.tensor("input_sample").value(0), np.arange(3.0) * 2)


def _keras_model() -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(2, name="d")],
                                name="net")
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    return model


def _keras_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((8, 4)).astype("float32"), rng.standard_normal((8, 2)).astype("float32")


def test_keras_save_tensor_before_fit_is_written_with_the_first_step(tmp_path):
    out_dir = str(tmp_path / "run")
    hook = smd_tf.KerasHook(out_dir=out_dir, save_config=smd_tf.SaveConfig(save_interval=1))
    hook.save_tensor("initial_state", np.eye(2), "custom")
    hook.save_scalar("lr", 0.1)
    x, y = _keras_data()
    _keras_model().fit(x, y, batch_size=4, epochs=1, callbacks=[hook], verbose=0)
    trial = create_trial(out_dir)  # before close: fit's end made its steps readable
    assert trial.tensor("initial_state").steps() == [0]
    np.testing.assert_array_equal(trial.tensor("initial_state").value(0), np.eye(2))
    assert trial.tensor("scalar/lr").steps() == [0]
    assert trial.steps() == [0, 1]
    hook.close()


# -- 2. files on disk at training-end boundaries -----------------------------------------------
def test_keras_fit_end_writes_and_waits_for_the_last_steps_files(tmp_path):
    out_dir = str(tmp_path / "run")
    hook = smd_tf.KerasHook(out_dir=out_dir, save_config=smd_tf.SaveConfig(save_interval=1),
                            include_collections=["weights", "losses"], export_tensorboard=True)
    x, y = _keras_data()
    model = _keras_model()
    for epochs in (1, 2):  # twice: also a second fit in the same hook
        model.fit(x, y, batch_size=2, epochs=epochs, callbacks=[hook], verbose=0)
        trial = create_trial(out_dir)
        last = trial.steps()[-1]
        assert trial.has_passed_step(last).name == "AVAILABLE"
        assert trial.tensor("loss").value(last) is not None
        # the TensorBoard summaries of the loss are there too, before close
        events = list((tmp_path / "run" / "tensorboard" / "TRAIN").glob("events.out.tfevents.*"))
        assert events and events[0].stat().st_size > 100
    assert trial.steps() == list(range(12))
    hook.close()


def _session_train(hook_factory, steps: int = 3) -> tuple:
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        y = v1.placeholder(tf.float32, [None, 1], name="y")
        w = v1.get_variable("w", initializer=tf.constant([[0.1], [0.2], [0.3]]))
        loss = v1.losses.mean_squared_error(y, tf.matmul(x, w))
        hook = hook_factory()
        opt = hook.wrap_optimizer(v1.train.GradientDescentOptimizer(0.1))
        train_op = opt.minimize(loss)
        with v1.train.MonitoredTrainingSession(hooks=[hook], save_checkpoint_secs=None,
                                               save_summaries_steps=None,
                                               log_step_count_steps=None) as sess:
            for _ in range(steps):
                sess.run(train_op, feed_dict={x: np.ones((2, 3), np.float32),
                                              y: np.ones((2, 1), np.float32)})
        # The session ended: what a notebook reads now, in the same process.
        trial = create_trial(hook.out_dir)
        seen = (trial.steps(), trial.tensor_names(collection="gradients"), len(trial.tensor_names()))
    hook.close()
    return seen, create_trial(hook.out_dir)


def test_session_end_makes_every_step_readable_in_the_same_process(tmp_path):
    for run in range(4):  # the issue saw the last steps missing in 3 of 4 runs
        out_dir = str(tmp_path / f"run{run}")
        (steps, grads, count), trial = _session_train(lambda d=out_dir: smd_tf.SessionHook(
            out_dir=d, save_config=smd_tf.SaveConfig(save_interval=1),
            include_collections=["weights", "gradients", "losses"]), steps=5)
        assert steps == [0, 1, 2, 3, 4] and len(grads) == 1
        assert count == len(trial.tensor_names())


def test_xgboost_after_training_leaves_steps_and_tensorboard_on_disk(tmp_path):
    out_dir = tmp_path / "run"
    rng = np.random.default_rng(0)
    dtrain = xgb.DMatrix(rng.standard_normal((40, 3)), label=rng.standard_normal(40))
    hook = smd_xgb.Hook(out_dir=str(out_dir), export_tensorboard=True,
                        save_config=smd_xgb.SaveConfig(save_interval=1))
    xgb.train({"max_depth": 2}, dtrain, 3, evals=[(dtrain, "train")], callbacks=[hook],
              verbose_eval=False)
    assert create_trial(str(out_dir)).steps() == [0, 1, 2]
    events = list((out_dir / "tensorboard" / "GLOBAL").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100  # written before close, not at the 5 s flush
    hook.close()


def test_tensorboard_folder_exists_once_the_export_starts(tmp_path):
    tb_dir = tmp_path / "tb"
    hook = smd.Hook(out_dir=str(tmp_path / "run"), tensorboard_dir=str(tb_dir))
    model = torch.nn.Linear(3, 2)
    hook.register_module(model)
    assert not tb_dir.exists()  # nothing made before training starts
    model(torch.ones(1, 3))
    assert tb_dir.is_dir()
    hook.close()


def test_hook_flush_makes_the_current_step_readable_and_later_values_go_to_the_next(tmp_path):
    out_dir = str(tmp_path / "run")
    model = torch.nn.Linear(3, 2)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients"])
    hook.register_module(model)
    _torch_loop(hook, model, 2)
    hook.flush()  # what the Transformers and Lightning callbacks call at train end
    trial = create_trial(out_dir)
    assert trial.steps() == [0, 1]
    assert trial.tensor("gradient/Linear_weight").steps() == [0, 1]
    assert "in_loop" in trial.tensor_names(step=1)
    hook.save_tensor("after_flush", np.ones(1))
    hook.close()
    assert create_trial(out_dir).tensor("after_flush").steps() == [2]


def test_a_hook_left_open_writes_nothing_into_an_out_dir_re_created_for_another_run(tmp_path, caplog):
    out_dir = str(tmp_path / "run")
    model = torch.nn.Linear(3, 2)
    first = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                     include_collections=["weights", "first_only"])
    first.get_collection("first_only").include("^first_")
    first.register_module(model)
    _torch_loop(first, model, 2)
    first.save_tensor("first_after_loop", np.ones(1), "first_only")  # would make one more step
    # The notebook's next run: the folder deleted and made again, a new hook, no close() before.
    # (Deleted once the files of steps 0 and 1 are on disk, as after a finished cell; rmtree
    # would trip over a temporary file the writer renames while it walks the folder.)
    first.writer.flush()
    shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    smd.del_hook()
    model2 = torch.nn.Linear(3, 2)
    second = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                      include_collections=["biases"])
    second.register_module(model2)
    _torch_loop(second, model2, 1)
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        first.close()  # e.g. at interpreter exit
    assert any("deleted or replaced" in r.getMessage() for r in caplog.records)
    trial = create_trial(out_dir)
    assert not trial.loaded_all_steps  # the first hook did not mark the second run finished
    second.close()
    trial = create_trial(out_dir)
    assert trial.loaded_all_steps and trial.steps() == [0]
    assert "first_only" not in trial.collections()
    assert not any(n.startswith("first_") for n in trial.tensor_names())


# -- 3. get_hook / set_hook / del_hook ---------------------------------------------------------
def _config(tmp_path: Path, out_dir: str) -> str:
    path = tmp_path / "debughookconfig.json"
    path.write_text(json.dumps({"LocalPath": out_dir, "HookParameters": {"save_interval": "2"},
                                "CollectionConfigurations": [{"CollectionName": "weights"}]}))
    return str(path)


def test_pytorch_get_hook_set_hook_del_hook_as_smdebug(tmp_path, monkeypatch):
    assert smd.get_hook() is None
    assert smd.get_hook(create_if_not_exists=True) is None  # no configuration: none, as smdebug
    config = _config(tmp_path, str(tmp_path / "from_json"))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", config)
    assert smd.get_hook() is None  # only looks unless asked to create
    hook = smd.get_hook(create_if_not_exists=True)
    assert isinstance(hook, smd.Hook) and hook.out_dir == str(tmp_path / "from_json")
    assert hook.include_collections[0] == "weights" and hook.save_config.get_save_config(
        ModeKeys.TRAIN).save_interval == 2
    assert smd.get_hook() is hook and mltrace.capture.hook.get_hook() is hook
    assert smd.get_hook(create_if_not_exists=True) is hook  # exists: returned, not rebuilt
    smd.del_hook()
    assert smd.get_hook() is None and mltrace.capture.hook.get_hook() is None
    smd.set_hook(hook)
    assert smd.get_hook() is hook
    other = smd.get_hook(json_config_path=_config(tmp_path, str(tmp_path / "other")))
    assert other is hook  # a current hook wins over any configuration (smdebug's rule)
    with pytest.raises(TypeError, match="set_hook needs an mltrace hook"):
        smd.set_hook("not a hook")
    hook.close()


def test_framework_get_hook_returns_only_its_frameworks_hook(tmp_path):
    keras_hook = smd_tf.KerasHook(out_dir=str(tmp_path / "k"))
    assert smd_tf.get_hook() is keras_hook and smd_tf.get_hook("keras") is keras_hook
    assert smd_tf.get_hook("session") is None
    assert smd.get_hook() is None and smd_xgb.get_hook(create_if_not_exists=False) is None
    assert mltrace.capture.hook.get_hook() is keras_hook.core  # what `mltrace run` asks
    smd_tf.del_hook()
    assert smd_tf.get_hook() is None
    smd_tf.set_hook(keras_hook)
    assert smd_tf.get_hook("keras") is keras_hook
    with pytest.raises(MltraceValueError, match="hook_type"):
        smd_tf.get_hook(create_if_not_exists=True)
    with pytest.raises(MltraceValueError, match="'estimator', 'keras', 'session'"):
        smd_tf.get_hook("Keras")
    keras_hook.close()


def test_tensorflow_and_xgboost_get_hook_create_from_the_json_configuration(tmp_path, monkeypatch):
    monkeypatch.setenv("MLTRACE_CONFIG_FILE_PATH", _config(tmp_path, str(tmp_path / "tf")))
    session_hook = smd_tf.get_hook("session", create_if_not_exists=True)
    assert isinstance(session_hook, smd_tf.SessionHook) and session_hook.out_dir == str(tmp_path / "tf")
    assert smd_tf.get_hook("keras") is None
    keras_hook = smd_tf.get_hook("keras", create_if_not_exists=True)  # a script run after another
    assert isinstance(keras_hook, smd_tf.KerasHook) and smd_tf.get_hook() is keras_hook
    smd_tf.del_hook()
    xgb_hook = smd_xgb.get_hook()  # smdebug's XGBoost get_hook creates when it can
    assert isinstance(xgb_hook, smd_xgb.Hook) and smd_xgb.get_hook() is xgb_hook
    for hook in (session_hook, keras_hook, xgb_hook):
        hook.close()


# -- 4. import paths and public names ----------------------------------------------------------
# smdebug 1.0.34's package-level names (from its __init__.py files; the legacy suite checks
# PyTorch and MXNet against the installed smdebug, which has neither TensorFlow nor XGBoost).
SMDEBUG_TENSORFLOW = {"ReductionConfig", "SaveConfig", "SaveConfigMode", "modes", "CollectionKeys",
                      "create_trial", "Collection", "KerasHook", "SessionHook", "EstimatorHook",
                      "del_hook", "get_hook", "set_hook"}
SMDEBUG_XGBOOST = {"SaveConfig", "SaveConfigMode", "modes", "Collection", "CollectionKeys",
                   "create_trial", "Hook", "del_hook", "get_hook", "set_hook"}


@pytest.mark.parametrize("module, names", [("mltrace.tensorflow", SMDEBUG_TENSORFLOW),
                                           ("mltrace.xgboost", SMDEBUG_XGBOOST)])
def test_star_import_brings_every_name_smdebug_had(module, names):
    scope: dict = {}
    exec(f"from {module} import *", scope)  # noqa: S102 - the statement users write
    assert names <= set(scope), names - set(scope)


def test_smdebug_module_paths_import():
    from mltrace.pytorch.collection import Collection, CollectionKeys  # noqa: F401
    from mltrace.pytorch.hook import Hook
    from mltrace.tensorflow.collection import Collection as TFCollection  # noqa: F401
    from mltrace.tensorflow.keras import KerasHook
    from mltrace.tensorflow.session import EstimatorHook, SessionHook  # noqa: F401
    from mltrace.xgboost.hook import Hook as XGBHook

    assert Hook is smd.Hook and KerasHook is smd_tf.KerasHook and XGBHook is smd_xgb.Hook
    scope: dict = {}
    exec("from mltrace.pytorch import *", scope)  # noqa: S102
    assert {"CollectionKeys", "Hook", "get_hook", "set_hook", "del_hook"} <= set(scope)


# -- 5. resuming a preempted job ---------------------------------------------------------------
def _run_job(out_dir: Path, ckpt_dir: Path, config: Path, steps: int, die_at: int | None = None) -> None:
    args = [sys.executable, str(SUPPORT / "resume_training.py"), str(out_dir), str(ckpt_dir), "mltrace",
            str(steps)] + ([str(die_at)] if die_at is not None else [])
    env = {**os.environ, "CHECKPOINT_CONFIG_FILE_PATH": str(config), "MLTRACE_LOG_LEVEL": "error"}
    subprocess.run(args, env=env, check=True, timeout=300)


def test_a_job_restarted_from_its_checkpoint_continues_its_step_numbers(tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    config = tmp_path / "checkpointconfig.json"
    config.write_text(json.dumps({"LocalPath": str(ckpt_dir)}))
    # Reference: the same 12 steps without interruption (no checkpoint configuration).
    _run_job(tmp_path / "ref", tmp_path / "unused", tmp_path / "absent.json", 12)
    # Checkpoints after steps 3 and 7; preempted during step 9; restarted: resumes at step 8.
    _run_job(tmp_path / "run", ckpt_dir, config, 12, die_at=9)
    states = json.loads((ckpt_dir / "metadata.json").read_text())
    assert [s["latest-global-step-seen"] for s in states] == [3, 7]
    assert states[-1]["latest-mode-step"]["TRAIN"] == 7 and states[-1]["training-run"] == 0
    _run_job(tmp_path / "run", ckpt_dir, config, 12)
    ref, run = create_trial(str(tmp_path / "ref")), create_trial(str(tmp_path / "run"))
    assert run.loaded_all_steps and run.steps() == ref.steps() == list(range(12))
    assert run.steps(mode=ModeKeys.TRAIN) == list(range(12))
    for name in ref.tensor_names():
        for step in ref.steps():
            np.testing.assert_array_equal(run.tensor(name).value(step), ref.tensor(name).value(step),
                                          err_msg=f"{name} at step {step}")


# -- 6. SessionHook save_all: gradients -----------------------------------------------------------
def test_session_save_all_gradients_are_the_optimizers_only(tmp_path):
    (_, grads, count), trial = _session_train(lambda: smd_tf.SessionHook(
        out_dir=str(tmp_path / "run"), save_all=True, save_config=smd_tf.SaveConfig(save_interval=1)))
    assert trial.tensor_names(collection="gradients") == grads == [
        "gradients/MatMul_grad/tuple/control_dependency_1:0"]
    assert count > 20  # save_all still saved the backprop intermediates, in collection "all"
    assert trial.collection("gradients").include_regex == []
