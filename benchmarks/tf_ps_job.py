"""The benchmark models on TensorFlow's own parameter servers, as its users write it: a
ClusterSpec, a Server per task, variables spread over the ps tasks by replica_device_setter,
SyncReplicasOptimizer for synchronous training, a MonitoredTrainingSession. One ps task and
several worker tasks per host, each started by hand (here: by the benchmark harness):

    python benchmarks/tf_ps_job.py --workload lm --ps h1:2222,h2:2222 \
        --workers h1:2223,h1:2224,h2:2223,h2:2224 --job worker --task 0 --out DIR
"""
import argparse
import os
import time

import tensorflow as tf

import meter
from workloads import WORKLOADS, session_config


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    meter.add_arguments(parser)
    parser.add_argument("--ps", required=True, help="comma-separated host:port of the ps tasks")
    parser.add_argument("--workers", required=True, help="comma-separated host:port")
    parser.add_argument("--job", choices=["ps", "worker"], required=True)
    parser.add_argument("--task", type=int, required=True)
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec({"ps": args.ps.split(","), "worker": args.workers.split(",")})
    server = tf.distribute.Server(cluster, job_name=args.job, task_index=args.task,
                                  config=session_config())
    if args.job == "ps":
        server.join()
    workload = WORKLOADS[args.workload]
    num_workers, is_chief = cluster.num_tasks("worker"), args.task == 0
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{args.task}", cluster=cluster)):
        loss = workload.build_loss(workload.input_batch(
            lambda dataset: dataset.shard(num_workers, args.task)))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
            workload.make_optimizer(), replicas_to_aggregate=num_workers,
            total_num_replicas=num_workers)
        train_op = workload.minimize(loss, optimizer, global_step)
        ready = tf.compat.v1.Variable(0, trainable=False, name="workers_ready")
        done = tf.compat.v1.Variable(0, trainable=False, name="workers_done")
        report_ready, report_done = ready.assign_add(1), done.assign_add(1)
    config = session_config()
    config.device_filters.extend(["/job:ps", f"/job:worker/task:{args.task}"])
    if not is_chief:
        # A worker other than the chief that finds the variables uninitialized sleeps 30 s
        # before it looks again (SessionManager's recovery_wait_secs, which
        # MonitoredTrainingSession does not take): it waits here for the chief instead.
        _wait_for_the_chiefs_initialization(server.target, config)
    with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=is_chief, config=config,
            hooks=[optimizer.make_session_run_hook(is_chief)]) as session:
        # A worker other than the chief polls for the chief's initialization every 30 s
        # (SessionManager); without a start barrier the chief's first steps, fed by its own
        # gradients alone (SyncReplicasOptimizer counts gradients, not workers), are measured.
        session.run(report_ready)
        while session.run(ready) < num_workers:
            time.sleep(0.05)
        meter.measure(lambda: session.run(train_op), args.out, is_chief, args.warmup,
                      args.window, args.windows, system="tf-ps", workers=num_workers,
                      placement=meter.placement(train_op.graph), **workload.details(num_workers))
        # SyncReplicasOptimizer counts gradients, not workers: a worker that left would leave
        # the others waiting for gradients forever. Everyone trains on until all are done; a
        # step still waiting when the last one left gives up after a while.
        session.run(report_done)
        give_up = tf.compat.v1.RunOptions(timeout_in_ms=10_000)
        try:
            while session.run(done) < num_workers:
                session.run(train_op, options=give_up)
        except tf.errors.DeadlineExceededError:
            pass
        # Closing the session would wait for the chief's queue runner, blocked on gradients
        # that no longer come; the records are written.
        os._exit(0)  # pylint: disable=protected-access


def _wait_for_the_chiefs_initialization(target, config, poll_seconds=0.1):
    """Until the global variables (on the ps tasks) are initialized: what the worker's
    MonitoredTrainingSession waits for before it starts."""
    uninitialized = tf.compat.v1.report_uninitialized_variables(
        tf.compat.v1.global_variables())
    with tf.compat.v1.Session(target, config=config) as session:
        while session.run(uninitialized).size:
            time.sleep(poll_seconds)


if __name__ == "__main__":
    main()
