"""Graph-mode (``tf.compat.v1``) training with mltrace's SessionHook in a MonitoredTrainingSession.

TensorFlow 2.21 still ships ``tf.compat.v1.train.SessionRunHook`` and ``MonitoredTrainingSession``
(``tf.estimator`` is gone: the hook goes into the session directly). A linear model is trained with
gradient descent on random data; the hook saves the trainable variables (weights/biases, read
before each run), the gradients of the wrapped optimizer, the losses of ``tf.compat.v1.losses``,
and, through ``include_regex``, a graph tensor by name.

Example (from the repository root):
    python examples/tensorflow/session_hook.py --out-dir ./demo-output/session_hook
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import mltrace.tensorflow as smd

v1 = tf.compat.v1


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default="./demo-output/session_hook")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-interval", type=int, default=5)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    true_w = np.array([[2.0], [-1.0], [0.5]], dtype=np.float32)
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        y = v1.placeholder(tf.float32, [None, 1], name="y")
        w = v1.get_variable("w", shape=[3, 1], initializer=v1.zeros_initializer())
        b = v1.get_variable("bias", shape=[1], initializer=v1.zeros_initializer())
        prediction = tf.identity(tf.matmul(x, w) + b, name="prediction")
        loss = v1.losses.mean_squared_error(y, prediction)

        hook = smd.SessionHook(
            out_dir=args.out_dir,
            save_config=smd.SaveConfig(save_interval=args.save_interval),
            include_collections=["weights", "biases", "gradients", "losses"],
            include_regex=["^prediction"],
        )
        optimizer = hook.wrap_optimizer(v1.train.GradientDescentOptimizer(0.1))
        train_op = optimizer.minimize(loss, global_step=v1.train.get_or_create_global_step())
        with v1.train.MonitoredTrainingSession(
            hooks=[hook],
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            log_step_count_steps=None,
        ) as sess:
            hook.set_mode(smd.modes.TRAIN)
            for _ in range(args.steps):
                xs = rng.standard_normal((16, 3)).astype(np.float32)
                sess.run(train_op, feed_dict={x: xs, y: xs @ true_w})
            hook.set_mode(smd.modes.EVAL)
            xs = rng.standard_normal((16, 3)).astype(np.float32)
            sess.run(loss, feed_dict={x: xs, y: xs @ true_w})
        hook.close()

    trial = smd.create_trial(args.out_dir)
    print(f"tensors: {trial.tensor_names()}")
    w = trial.tensor("w:0")
    for step in w.steps(mode=smd.modes.TRAIN):
        value = w.value(step, mode=smd.modes.TRAIN).ravel().round(3).tolist()
        print(f"TRAIN step {step}: w = {value}")
    return args.out_dir


if __name__ == "__main__":
    main()
    sys.exit(0)
