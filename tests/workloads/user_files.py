"""What a user's script writes beside training: TensorBoard's graph, a Saver's checkpoint and
meta graph, export_meta_graph; some of it built after get_runner, as scripts do.

usage: user_files.py RESOURCES RUN_OPTION OUT
The chief writes OUT/events (FileWriter of the graph object given to get_runner),
OUT/runner_events (FileWriter of runner.graph), OUT/model (saver.save(runner, ...)),
OUT/later (a Saver built after get_runner), OUT/exported.meta, and OUT/values.npz (the
variables, as the runner fetches them).
"""
import os
import sys

import numpy as np
import tensorflow as tf

import parallax

resources, run_option, out = sys.argv[1:4]
tf.compat.v1.disable_eager_execution()
graph = tf.Graph()
with graph.as_default():
    ids = tf.compat.v1.placeholder(tf.int32, [None], name="ids")
    y = tf.compat.v1.placeholder(tf.float32, [None], name="y")
    embedding = tf.compat.v1.get_variable("embedding", [20, 4])
    w = tf.compat.v1.get_variable("w", [4], initializer=tf.compat.v1.ones_initializer())
    prediction = tf.reduce_sum(tf.nn.embedding_lookup(embedding, ids) * w, 1)
    loss = tf.reduce_mean(tf.square(prediction - y), name="loss")
    tf.compat.v1.summary.scalar("loss", loss)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=global_step)
    saver = tf.compat.v1.train.Saver()
    single_device_ops = len(graph.get_operations())

runner = parallax.get_runner(graph, resources, parallax.Config(run_option=run_option))
with graph.as_default():  # built after get_runner, as scripts often do
    merged = tf.compat.v1.summary.merge_all()
    init = tf.compat.v1.global_variables_initializer()
    norm = tf.norm(embedding, name="embedding_norm")
    later_saver = tf.compat.v1.train.Saver(max_to_keep=1)
runner.run(init)  # skipped: Parallax initialized the variables
rng = np.random.RandomState(runner.worker_id)
for step in range(5):
    feed = {ids: rng.randint(0, 20, 8), y: rng.randn(8)}
    _, summary = runner.run([train_op, merged], feed)
print(f"norm {runner.run(norm):.4f} ops {single_device_ops} -> {len(graph.get_operations())}",
      flush=True)
saver.save(runner, os.path.join(out, "model"), global_step=global_step)
later_saver.save(runner, os.path.join(out, "later"))
if runner.is_chief:
    for folder, graph_shown in (("events", graph), ("runner_events", runner.graph)):
        writer = tf.compat.v1.summary.FileWriter(os.path.join(out, folder), graph_shown)
        writer.add_summary(summary, 5)
        writer.close()
    with graph.as_default():
        tf.compat.v1.train.export_meta_graph(os.path.join(out, "exported.meta"))
    with graph.as_default():
        variables = tf.compat.v1.global_variables()
    np.savez(os.path.join(out, "values.npz"),
             **dict(zip([v.op.name for v in variables], runner.run(variables))))
runner.close()
