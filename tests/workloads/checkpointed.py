"""A job that resumes from its checkpoints. Input is a function of the global step, so a run
killed and started again sees exactly the batches an uninterrupted run sees.

    python checkpointed.py RESOURCES RUN_OPTION CKPT_DIR OUT_NPZ TOTAL_STEPS [SECONDS_PER_STEP]
        [MAX_RESTARTS]
"""
import sys
import time

import numpy as np
import tensorflow as tf

import parallax

resources, run_option, ckpt_dir, out, total = sys.argv[1:6]
total, pause = int(total), float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
max_restarts = int(sys.argv[7]) if len(sys.argv) > 7 else 0
VOCAB, BATCH = 30, 4

tf.compat.v1.disable_eager_execution()
graph = tf.Graph()
with graph.as_default():
    ids = tf.compat.v1.placeholder(tf.int64, [None, 3])
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    embedding = tf.compat.v1.get_variable(
        "embedding", [VOCAB, 4], initializer=tf.compat.v1.truncated_normal_initializer(seed=1))
    w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.ones_initializer())
    hidden = tf.reduce_mean(tf.nn.embedding_lookup(embedding, ids), axis=1)
    loss = tf.reduce_mean(tf.square(tf.squeeze(tf.matmul(hidden, w), 1) - labels))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, global_step=global_step)

config = parallax.Config(run_option=run_option, max_restarts=max_restarts,
                         ckpt_config=parallax.CheckpointConfig(ckpt_dir=ckpt_dir,
                                                               save_ckpt_steps=4))
runner = parallax.get_runner(graph, resources, config)
step = runner.run(global_step)
print(f"worker {runner.worker_id} starts at step {step}", flush=True)
while step < total:
    rng = np.random.RandomState(step * 100 + runner.worker_id)
    runner.run(train_op, {ids: rng.randint(0, VOCAB, (BATCH, 3)), labels: rng.randn(BATCH)})
    step = runner.run(global_step)
    if runner.is_chief:
        print(f"step {step}", flush=True)
    time.sleep(pause)
if runner.is_chief:
    with graph.as_default():
        variables = tf.compat.v1.global_variables()
    np.savez(out, **dict(zip([v.op.name for v in variables], runner.run(variables))))
runner.close()
print(f"worker {runner.worker_id} done at step {step}", flush=True)
