"""A queue-based input pipeline as TF1 tutorials write it (string_input_producer, a reader,
shuffle_batch): the runner starts its queue runners and stops them at close; with --monitored,
the loop is a parallax.MonitoredTrainingSession's with a StopAtStepHook.

    python queue_input.py DATA_DIR [resources] [--monitored]
"""
import glob
import os
import sys

import numpy as np
import tensorflow as tf

import parallax

monitored = "--monitored" in sys.argv
arguments = [a for a in sys.argv[1:] if a != "--monitored"]
data_dir = arguments[0]
resources = arguments[1] if len(arguments) > 1 else "localhost:0,1"
STEPS = 60
files = sorted(glob.glob(os.path.join(data_dir, "part-*.csv")))

tf.compat.v1.disable_eager_execution()
graph = tf.Graph()
with graph.as_default():
    mine = parallax.shard(files)
    filenames = tf.compat.v1.train.string_input_producer(mine, shuffle=False)
    _, line = tf.compat.v1.TextLineReader().read(filenames)
    x, y = tf.io.decode_csv(line, record_defaults=[[0.0], [0.0]])
    xs, ys = tf.compat.v1.train.shuffle_batch([x, y], batch_size=8, capacity=64,
                                              min_after_dequeue=16, seed=1)
    w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
    b = tf.compat.v1.get_variable("b", [], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.reduce_mean(tf.square(w * xs + b - ys))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step)

if monitored:
    with graph.as_default():
        with parallax.MonitoredTrainingSession(resources, hooks=[
                tf.compat.v1.train.StopAtStepHook(last_step=STEPS)]) as session:
            print(f"files {[os.path.basename(f) for f in mine]}", flush=True)
            losses = []
            while not session.should_stop():
                losses.append(session.run([train_op, loss])[1])
else:
    runner = parallax.get_runner(graph, resources)
    print(f"files {[os.path.basename(f) for f in mine]}", flush=True)
    losses = [runner.run([train_op, loss])[1] for _ in range(STEPS)]
    runner.close()
print(f"{len(losses)} steps, loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}; "
      "closed", flush=True)
