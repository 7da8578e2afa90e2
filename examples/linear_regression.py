"""Linear regression on synthetic data, trained data-parallel by Parallax.

    python examples/linear_regression.py [resource_file] [steps]
"""
import sys

import parallax  # first: before TensorFlow loads, so that it starts quietly
import numpy as np
import tensorflow as tf

RESOURCES = sys.argv[1] if len(sys.argv) > 1 else "cluster_specs/localhost"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 60
BATCH_PER_WORKER = 32

tf.compat.v1.disable_eager_execution()
rng = np.random.RandomState(0)
true_w, true_b = rng.randn(8, 1).astype(np.float32), np.float32(0.5)
features = rng.randn(BATCH_PER_WORKER * 64, 8).astype(np.float32)
labels = features @ true_w + true_b + 0.01 * rng.randn(len(features), 1).astype(np.float32)

graph = tf.Graph()
with graph.as_default():
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat()
    x, y = tf.compat.v1.data.make_one_shot_iterator(
        parallax.shard(dataset).batch(BATCH_PER_WORKER)).get_next()
    w = tf.compat.v1.get_variable("w", [8, 1], initializer=tf.compat.v1.zeros_initializer())
    b = tf.compat.v1.get_variable("b", [], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=global_step)

runner = parallax.get_runner(graph, RESOURCES)
for step in range(1, STEPS + 1):
    _, loss_value = runner.run([train_op, loss])
    if runner.is_chief and (step == 1 or step % 10 == 0):
        print(f"step {step:4d}  loss {loss_value:.5f}  global_step {runner.run(global_step)}",
              flush=True)
