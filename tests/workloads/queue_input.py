"""A queue-based input pipeline as TF1 tutorials write it (string_input_producer, a reader,
shuffle_batch): the runner starts its queue runners and stops them at close.

    python queue_input.py DATA_DIR [resources]
"""
import glob
import os
import sys

import numpy as np
import tensorflow as tf

import parallax

data_dir = sys.argv[1]
resources = sys.argv[2] if len(sys.argv) > 2 else "localhost:0,1"
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
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)

runner = parallax.get_runner(graph, resources)
print(f"files {[os.path.basename(f) for f in mine]}", flush=True)
losses = [runner.run([train_op, loss])[1] for _ in range(60)]
print(f"worker {runner.worker_id} loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}",
      flush=True)
runner.close()
print(f"worker {runner.worker_id} closed", flush=True)
