"""A job whose input is tf.data, that saves the input's position with its checkpoints and
resumes it (docs/checkpoints.md), for tests/test_checkpoints.py. Its inputs: `dataset`, a
shuffled and repeated dataset given to parallax.shard before its batching; `both`, that and
TFRecord files each worker takes its share of by parallax.num_shards_and_shard_id().

    python resumable.py --resources R --run-option O --ckpt DIR --out NPZ --steps S
        [--batch B] [--input dataset|both] [--loop plain|monitored] [--kill-at WORKER:STEP]
        [--max-restarts N] [--split (Config(split_variables=True))] [--pause SECONDS]
    python resumable.py --one-device --out NPZ --steps S [--batch B]

B is the combined batch: each of N workers draws B / N examples a step. A worker of
--kill-at kills itself (SIGKILL) when it reaches STEP, in the job's first attempt only.
The chief writes the variables at the end to NPZ, and those it started from to NPZ.start.npz.
"""
import argparse
import os
import signal
import time

import numpy as np
import tensorflow as tf

import parallax

EXAMPLES, VOCAB, FILES = 200, 40, 4

parser = argparse.ArgumentParser()
parser.add_argument("--resources")
parser.add_argument("--run-option", default="HYBRID")
parser.add_argument("--ckpt")
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--batch", type=int, default=12)
parser.add_argument("--input", choices=["dataset", "both"], default="dataset")
parser.add_argument("--loop", choices=["plain", "monitored"], default="plain")
parser.add_argument("--kill-at")
parser.add_argument("--max-restarts", type=int, default=0)
parser.add_argument("--split", action="store_true")
parser.add_argument("--pause", type=float, default=0.0)  # seconds after each step
parser.add_argument("--one-device", action="store_true")
args = parser.parse_args()


def example(index):
    ids = (index * tf.constant([7, 13, 29], tf.int64) + index // 5) % VOCAB
    return ids, tf.sin(tf.cast(index, tf.float32))


def files():
    """TFRecord files of examples EXAMPLES.., made once (by the driver, which runs first)."""
    folder = os.path.join(os.path.dirname(os.path.abspath(args.out)), "records")
    names = [os.path.join(folder, f"part-{i}.tfrecord") for i in range(FILES)]
    if not all(os.path.exists(name) for name in names):
        os.makedirs(folder, exist_ok=True)
        for i, name in enumerate(names):
            with tf.io.TFRecordWriter(name + ".tmp") as writer:
                for index in range(EXAMPLES + i * 50, EXAMPLES + i * 50 + 50):
                    writer.write(tf.train.Example(features=tf.train.Features(feature={
                        "index": tf.train.Feature(int64_list=tf.train.Int64List(
                            value=[index]))})).SerializeToString())
            os.replace(name + ".tmp", name)
    return names


def batches(per_worker):
    shuffled = tf.data.Dataset.range(EXAMPLES).shuffle(50, seed=3).repeat().map(example)
    draws = [parallax.shard(shuffled).batch(per_worker).prefetch(2)]
    if args.input == "both":
        count, index = parallax.num_shards_and_shard_id()
        records = (tf.data.Dataset.from_tensor_slices(files()).shard(count, index)
                   .flat_map(tf.data.TFRecordDataset).repeat()
                   .map(lambda record: tf.io.parse_single_example(
                       record, {"index": tf.io.FixedLenFeature([], tf.int64)})["index"])
                   .map(example).batch(per_worker))
        draws.append(records)
    return [tf.compat.v1.data.make_one_shot_iterator(d).get_next() for d in draws]


tf.compat.v1.disable_eager_execution()
graph = tf.Graph()
with graph.as_default():
    embedding = tf.compat.v1.get_variable(
        "embedding", [VOCAB, 4], initializer=tf.compat.v1.truncated_normal_initializer(seed=1))
    w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.ones_initializer())
    loss = 0.0
    for ids, labels in batches(args.batch // parallax.num_workers()):
        hidden = tf.reduce_mean(tf.nn.embedding_lookup(embedding, ids), axis=1)
        loss += tf.reduce_mean(tf.square(tf.squeeze(tf.matmul(hidden, w), 1) - labels))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, global_step=global_step)
    variables = tf.compat.v1.global_variables()
    shard_id = parallax.num_shards_and_shard_id()[1]


def write(path, values):
    np.savez(path, **dict(zip([v.op.name for v in variables], values)))


def kill_at(worker_id, step):
    """SIGKILL this worker at --kill-at's step, once (the restarted job goes on)."""
    if not args.kill_at:
        return
    victim, at = (int(part) for part in args.kill_at.split(":"))
    marker = os.path.join(args.ckpt, f"killed-{victim}")
    if worker_id == victim and step == at and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


if args.one_device:
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(args.steps):
            session.run(train_op)
        write(args.out, session.run(variables))
    raise SystemExit(0)

# A monitored session saves to its checkpoint_dir: the job is run again by hand.
saves = (parallax.CheckpointConfig(ckpt_dir=args.ckpt, save_ckpt_steps=3)
         if args.loop == "plain" else parallax.CheckpointConfig())
config = parallax.Config(run_option=args.run_option, max_restarts=args.max_restarts,
                         split_variables=args.split, ckpt_config=saves)
if args.loop == "plain":
    runner = parallax.get_runner(graph, args.resources, config)
    step = runner.run(global_step)
    if runner.is_chief:
        write(args.out + ".start.npz", runner.run(variables))
    print(f"worker {runner.worker_id} starts at step {step}", flush=True)
    while step < args.steps:
        kill_at(runner.worker_id, step)
        runner.run(train_op)
        step = runner.run(global_step)
        time.sleep(args.pause)
    if runner.is_chief:
        write(args.out, runner.run(variables))
    runner.close()
else:
    class Ends(tf.compat.v1.train.SessionRunHook):
        """The chief's variables at the start and at the end."""

        def after_create_session(self, session, coord):
            write(args.out + ".start.npz", session.run(variables))
            print(f"worker 0 starts at step {session.run(global_step)}", flush=True)

        def end(self, session):
            write(args.out, session.run(variables))

    class Kill(tf.compat.v1.train.SessionRunHook):
        def after_run(self, run_context, run_values):
            session = run_context.session
            kill_at(session.run(shard_id), session.run(global_step))
            time.sleep(args.pause)

    with graph.as_default(), parallax.MonitoredTrainingSession(
            args.resources, config, checkpoint_dir=args.ckpt, save_checkpoint_steps=3,
            save_summaries_steps=None, log_step_count_steps=None,
            hooks=[tf.compat.v1.train.StopAtStepHook(last_step=args.steps), Kill()],
            chief_only_hooks=[Ends()]) as session:
        while not session.should_stop():
            session.run(train_op)
