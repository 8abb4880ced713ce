"""examples/tensorflow/session_hook.py with its mltrace lines removed: plain ``tf.compat.v1``
graph-mode training in a MonitoredTrainingSession.

Run it under ``mltrace run`` with session_hook.json (the original's hook in smdebug's
configuration format). The optimizer is wrapped when ``minimize`` applies its gradients, the
session gets the SessionHook, and each run that fetches the training op is a TRAIN step, any
other run an EVAL step (the original sets those modes by hand)::

    mltrace run --config examples/zero_change/session_hook.json examples/zero_change/session_hook.py

tests/launch/test_launch_examples.py checks that it leaves the trial the original leaves.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="tf.compat.v1 graph-mode training, no mltrace lines")
    parser.add_argument("--steps", type=int, default=20)
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

        optimizer = v1.train.GradientDescentOptimizer(0.1)
        train_op = optimizer.minimize(loss, global_step=v1.train.get_or_create_global_step())
        with v1.train.MonitoredTrainingSession(
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            log_step_count_steps=None,
        ) as sess:
            for _ in range(args.steps):
                xs = rng.standard_normal((16, 3)).astype(np.float32)
                sess.run(train_op, feed_dict={x: xs, y: xs @ true_w})
            xs = rng.standard_normal((16, 3)).astype(np.float32)
            final = sess.run(loss, feed_dict={x: xs, y: xs @ true_w})
    print(f"final loss: {final:.5f}")


if __name__ == "__main__":
    main()
    sys.exit(0)
