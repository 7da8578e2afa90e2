"""A TF1 script driven by tf.compat.v1.train.MonitoredTrainingSession and hooks, as written but
for its first line (parallax.MonitoredTrainingSession), for tests/test_monitored.py.

    python monitored.py RESOURCES OUT_DIR RUN_OPTION MODE [LAST_STEP]
    MODE: steps (StopAtStepHook at LAST_STEP, 12 unless given) | stop-one (only the chief's
          hook, a chief-only hook, asks to stop, after global step 7) | plain (get_runner and a
          loop of 12 steps, for comparison)
Each worker writes OUT_DIR/worker_<id>.json: its hook's calls, the global steps it saw after
each run, its losses and final variables. Checkpoints and summaries go to OUT_DIR/train.
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

import parallax

resources, out, run_option, mode = sys.argv[1:5]
last_step = int(sys.argv[5]) if len(sys.argv) > 5 else 12
tf.compat.v1.disable_eager_execution()
rng = np.random.RandomState(0)
features = rng.randn(64, 4).astype(np.float32)
ids = rng.randint(0, 10, 64).astype(np.int64)
labels = rng.randn(64).astype(np.float32)

graph = tf.Graph()
with graph.as_default():  # MonitoredTrainingSession trains the default graph
    tf.compat.v1.set_random_seed(1)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    dataset = tf.data.Dataset.from_tensor_slices((features, ids, labels))
    x, i, y = tf.compat.v1.data.make_one_shot_iterator(
        parallax.shard(dataset).repeat().batch(8)).get_next()
    embedding = tf.compat.v1.get_variable("embedding", [10, 4])
    w = tf.compat.v1.get_variable("w", [4, 1])
    prediction = tf.matmul(x * tf.nn.embedding_lookup(embedding, i), w)[:, 0]
    loss = tf.reduce_mean(tf.square(prediction - y))
    tf.compat.v1.summary.scalar("loss", loss)
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=global_step)
    shard_id = parallax.num_shards_and_shard_id()[1]


class Recording(tf.compat.v1.train.SessionRunHook):
    """A user's hook: records its calls; asks for extra fetches; may ask to stop."""

    def __init__(self, stop_after=None):
        self.calls, self.steps, self.final = [], [], None
        self.stop_after = stop_after

    def begin(self):
        self.calls.append("begin")

    def after_create_session(self, session, coord):
        self.calls.append("after_create_session")
        self.worker_id = int(session.run(shard_id))

    def before_run(self, run_context):
        self.calls.append("before_run")
        return tf.compat.v1.train.SessionRunArgs({"step": global_step, "loss": loss})

    def after_run(self, run_context, run_values):
        self.calls.append("after_run")
        self.steps.append(int(run_values.results["step"]))
        if self.stop_after is not None and self.steps[-1] >= self.stop_after:
            run_context.request_stop()

    def end(self, session):
        self.calls.append("end")
        self.final = {v.op.name: session.run(v).tolist() for v in (embedding, w)}


def record(worker_id, **values):
    with open(os.path.join(out, f"worker_{worker_id}.json"), "w") as file:
        json.dump(values, file)


config = parallax.Config(run_option=run_option, stall_timeout_secs=float(
    os.environ.get("PARALLAX_TEST_STALL_SECS", 300)))
if mode == "plain":
    runner = parallax.get_runner(graph, resources, config)
    losses = [float(runner.run([train_op, loss])[1]) for _ in range(12)]
    record(runner.worker_id, losses=losses,
           final={v.op.name: runner.run(v).tolist() for v in (embedding, w)})
    sys.exit(0)

with graph.as_default():
    recording = Recording()
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=last_step),
             tf.compat.v1.train.NanTensorHook(loss),
             tf.compat.v1.train.LoggingTensorHook({"loss": loss}, every_n_iter=5), recording]
    with parallax.MonitoredTrainingSession(
            resources, config, checkpoint_dir=os.path.join(out, "train"),
            save_checkpoint_steps=5, save_summaries_steps=2, hooks=hooks,
            chief_only_hooks=[Recording(stop_after=7)] if mode == "stop-one" else None
    ) as session:
        while not session.should_stop():
            session.run(train_op)
    record(recording.worker_id, calls=recording.calls, steps=recording.steps,
           final=recording.final)
