"""A small Parallax job whose workers misbehave on request, for the supervision tests.

    python supervised.py MODE [resources] [redirect_path] [sparse] [run_option]
    MODE: ok | fail-worker-1 | hang | talk (hang, printing each step) | bad-fetch |
          long (PARALLAX_TEST_STEPS steps, 300 unless set, 0.05 s apart, then done) |
          diverge (worker 1 stops taking steps, the others wait for it in theirs) |
          caught-error (a run fails, the script catches it and goes on after a pause)
PARALLAX_TEST_HEARTBEAT_SECS, PARALLAX_TEST_STALL_SECS and PARALLAX_TEST_METRICS set
Config.heartbeat_timeout_secs, stall_timeout_secs and metrics_file; PARALLAX_TEST_PROFILE a
profile_dir where both workers' third run is profiled; PARALLAX_TEST_EXPORT export_graph_path.
"""
import os
import sys
import time

import parallax  # first: TensorFlow starts quietly (test_launch)
import tensorflow as tf

mode = sys.argv[1]
resources = sys.argv[2] if len(sys.argv) > 2 else "localhost:0,1"
redirect_path = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
with_sparse = len(sys.argv) > 4 and sys.argv[4] == "sparse"  # HYBRID: starts servers too
run_option = sys.argv[5] if len(sys.argv) > 5 else "HYBRID"
heartbeat = float(os.environ.get("PARALLAX_TEST_HEARTBEAT_SECS", 30))
stall = float(os.environ.get("PARALLAX_TEST_STALL_SECS", 300))

tf.compat.v1.disable_eager_execution()
graph = tf.Graph()
with graph.as_default():
    w = tf.compat.v1.get_variable("w", [4], initializer=tf.compat.v1.ones_initializer())
    loss = tf.reduce_sum(tf.square(w))
    num_shards, shard_id = parallax.num_shards_and_shard_id()
    if with_sparse:
        embedding = tf.compat.v1.get_variable("embedding", [10, 4])
        loss += tf.reduce_sum(tf.nn.embedding_lookup(embedding, [1, 2]) * w)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    fails_when_run = tf.debugging.check_numerics(tf.math.log(-w[0]), "log of a negative")

print(f"graph built for {mode}", flush=True)
profile_dir = os.environ.get("PARALLAX_TEST_PROFILE")
runner = parallax.get_runner(graph, resources, parallax.Config(
    redirect_path=redirect_path, run_option=run_option, heartbeat_timeout_secs=heartbeat,
    stall_timeout_secs=stall, metrics_file=os.environ.get("PARALLAX_TEST_METRICS"),
    profile_config=parallax.ProfileConfig(profile_dir, profile_steps=[3], profile_workers=[0, 1])
    if profile_dir else None, export_graph_path=os.environ.get("PARALLAX_TEST_EXPORT")))
print(f"worker {runner.worker_id} ready", flush=True)
if mode == "ok":
    print(f"worker {runner.worker_id} is shard {runner.run(shard_id)} of "
          f"{runner.run(num_shards)}", flush=True)
if mode == "fail-worker-1" and runner.worker_id == 1:
    raise RuntimeError("boom from worker 1")
if mode == "bad-fetch":
    runner.run("no_such_tensor:0")
if mode == "caught-error":
    try:
        runner.run(fails_when_run)
    except tf.errors.InvalidArgumentError:
        time.sleep(stall + 3)  # outside any run: not a stall
# The other modes would wait in allreduce forever.
steps = {"ok": 10, "caught-error": 10,
         "long": int(os.environ.get("PARALLAX_TEST_STEPS", 300))}.get(mode, 10 ** 9)
for step in range(steps):
    if mode == "diverge" and runner.worker_id == 1 and step == 3:
        time.sleep(600)
    runner.run(train_op, report={"loss": loss})
    if mode in ("hang", "talk", "long"):
        time.sleep(0.05)
    if mode == "talk":
        print(f"worker {runner.worker_id} step {step}", flush=True)
print(f"worker {runner.worker_id} done, loss {runner.run(loss):.4f}", flush=True)
