"""SessionHook (tf.compat.v1 graph mode, MonitoredTrainingSession) and TornasoleHook: graph names,
values read back equal to what the session computed, unfed tensors skipped, modes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mltrace.tensorflow as smd
from mltrace.exceptions import MltraceTypeError
from mltrace.modes import ModeKeys
from mltrace.trials import create_trial

v1 = tf.compat.v1
LR = 0.1
X = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 1.0]], dtype=np.float32)
Y = np.array([[1.0], [0.0]], dtype=np.float32)


def _train(hook_factory, steps=3, eval_steps=1):
    """Linear regression trained with plain gradient descent; returns (hook, history)."""
    history = {"w": [], "b": [], "loss": [], "pred": []}
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        y = v1.placeholder(tf.float32, [None, 1], name="y")
        other = v1.placeholder(tf.float32, [None], name="other")
        w = v1.get_variable("w", initializer=tf.constant([[0.1], [0.2], [0.3]]))
        b = v1.get_variable("bias", initializer=tf.zeros([1]))
        pred = tf.identity(tf.matmul(x, w) + b, name="pred")
        tf.identity(other * 2.0, name="pred_unfed")  # needs a feed the runs never give
        loss = v1.losses.mean_squared_error(y, pred)
        hook = hook_factory()
        opt = hook.wrap_optimizer(v1.train.GradientDescentOptimizer(LR))
        train_op = opt.minimize(loss, global_step=v1.train.get_or_create_global_step())
        with v1.train.MonitoredTrainingSession(
            hooks=[hook],
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            log_step_count_steps=None,
        ) as sess:
            hook.set_mode(smd.modes.TRAIN)
            for _ in range(steps):
                _, lv, pv = sess.run([train_op, loss, pred], feed_dict={x: X, y: Y})
                history["loss"].append(lv)
                history["pred"].append(pv)
            hook.set_mode(smd.modes.EVAL)
            for _ in range(eval_steps):
                sess.run(loss, feed_dict={x: X, y: Y})
    hook.close()
    return hook, history


def _expected_weights(steps):
    """Gradient descent on the MSE by hand: (w, b, dw, db) before each step."""
    w, b = np.array([[0.1], [0.2], [0.3]], dtype=np.float32), np.zeros([1], dtype=np.float32)
    out = []
    for _ in range(steps):
        err = X @ w + b - Y
        dw, db = (2 * X.T @ err / len(X)).astype(np.float32), (2 * err.mean(0)).astype(np.float32)
        out.append((w.copy(), b.copy(), dw, db))
        w, b = w - LR * dw, b - LR * db
    return out


def test_session_hook_round_trip(tmp_path):
    out_dir = str(tmp_path / "run")
    _, history = _train(
        lambda: smd.SessionHook(
            out_dir=out_dir,
            save_config=smd.SaveConfig(save_interval=1),
            include_collections=[
                "weights",
                "biases",
                "gradients",
                "losses",
                "optimizer_variables",
                "default",
            ],
            include_regex=["^pred"],
        )
    )
    trial = create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2]
    assert trial.steps(mode=ModeKeys.EVAL) == [0]
    assert trial.tensor_names(collection="weights") == ["w:0"]
    assert trial.tensor_names(collection="biases") == ["bias:0"]
    assert trial.tensor_names(collection="losses") == ["mean_squared_error/value:0"]
    assert len(trial.tensor_names(collection="gradients")) == 2
    assert all(
        n.startswith("gradients/") and n.endswith(":0")
        for n in trial.tensor_names(collection="gradients")
    )
    assert "pred:0" in trial.tensor_names(collection="default")
    assert "pred_unfed:0" not in trial.tensor_names()  # depends on an unfed placeholder: skipped
    for step, (w, b, dw, db) in enumerate(_expected_weights(3)):
        # variables are read before the run: the values the step starts from
        np.testing.assert_allclose(trial.tensor("w:0").value(step), w, rtol=1e-6)
        np.testing.assert_allclose(trial.tensor("bias:0").value(step), b, rtol=1e-6, atol=1e-7)
        grads = sorted(
            (trial.tensor(n).value(step) for n in trial.tensor_names(collection="gradients")),
            key=np.size,
        )
        np.testing.assert_allclose(grads[0], db, rtol=1e-5)
        np.testing.assert_allclose(grads[1], dw, rtol=1e-5)
        assert (
            trial.tensor("mean_squared_error/value:0").value(step).item()
            == history["loss"][step].item()
        )
        np.testing.assert_array_equal(trial.tensor("pred:0").value(step), history["pred"][step])
    assert trial.tensor("w:0").steps(mode=ModeKeys.EVAL) == [0]
    assert (
        trial.tensor(trial.tensor_names(collection="gradients")[0]).steps(mode=ModeKeys.EVAL) == []
    )


def test_tornasole_hook_saves_weights_biases_gradients_by_default(tmp_path):
    out_dir = str(tmp_path / "run")
    scm = {
        smd.modes.TRAIN: smd.SaveConfigMode(save_interval=2),
        smd.modes.EVAL: smd.SaveConfigMode(save_interval=1),
    }
    hook, _ = _train(
        lambda: smd.TornasoleHook(out_dir=out_dir, save_config=scm), steps=4, eval_steps=2
    )
    assert isinstance(hook, smd.SessionHook)
    trial = create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 2]
    assert trial.steps(mode=ModeKeys.EVAL) == [0, 1]
    names = trial.tensor_names()
    assert {"w:0", "bias:0", "mean_squared_error/value:0"} <= set(names)
    assert len(trial.tensor_names(collection="gradients")) == 2


def test_session_hook_rejects_keras_optimizers_and_estimator_is_gone():
    hook = smd.SessionHook(out_dir="/tmp/never_written_mltrace_session", dry_run=True)
    with pytest.raises(MltraceTypeError, match="tf.compat.v1.train.Optimizer"):
        hook.wrap_optimizer(tf.keras.optimizers.SGD())
    assert smd.EstimatorHook is smd.SessionHook
    assert not hasattr(tf, "estimator")  # why EstimatorHook is only an alias (README)
    hook.close()
