"""A DeepFM-like click-through model whose feature embeddings are dynamic: a row is made for an
id the first time it appears (parallax.dynamic_embedding), so no vocabulary is built and no id
is hashed into a shared bucket. The input is Criteo-like and synthetic: 39 fields whose ids
follow a Zipf law, so that new ids keep appearing at every step.

    python examples/dynamic_embeddings.py --single               # one device, a plain session
    python examples/dynamic_embeddings.py --resources "127.0.0.1:0,1;127.0.0.2:0,1"
    python -m parallax.verify examples/dynamic_embeddings.py \\
        --resources "127.0.0.1:0,1;127.0.0.2:0,1" --steps 10

Both tables (the second-order embeddings and the first-order weights) live on the parameter
servers, split over every machine by a hash of the id; the deep layers are allreduced (HYBRID).
"""
import argparse

import parallax  # first: before TensorFlow loads, so that it starts quietly
import numpy as np
import tensorflow as tf

FIELDS, DIM = 39, 8
EXAMPLES, BATCH_PER_WORKER = 4096, 32
CAPACITY = 200_000  # ids each table can hold (all fields together)


def criteo_like(count: int, seed: int = 0):
    """`count` examples of FIELDS ids each, field f's ids drawn from a Zipf law and made
    distinct across fields, and a click label the ids of two fields decide."""
    rng = np.random.RandomState(seed)
    ids = rng.zipf(1.3, size=(count, FIELDS)).astype(np.int64) % 10**9
    ids += np.arange(FIELDS, dtype=np.int64) * 10**9  # field f: f*1e9 + its id
    labels = ((ids[:, 0] + ids[:, 1]) % 3 == 0).astype(np.float32)
    return ids, labels


def dense(inputs: tf.Tensor, units: int, name: str) -> tf.Tensor:
    kernel = tf.compat.v1.get_variable(f"{name}/kernel", [inputs.shape[-1], units])
    bias = tf.compat.v1.get_variable(f"{name}/bias", [units],
                                     initializer=tf.compat.v1.zeros_initializer())
    return tf.matmul(inputs, kernel) + bias


def build(capacity: int = CAPACITY) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)  # the dense layers' first values: a reproducible demo
        dataset = tf.data.Dataset.from_tensor_slices(criteo_like(EXAMPLES)).repeat()
        ids, labels = tf.compat.v1.data.make_one_shot_iterator(
            parallax.shard(dataset).batch(BATCH_PER_WORKER)).get_next(name="batch")
        embeddings = parallax.dynamic_embedding(
            "embeddings", dim=DIM, capacity=capacity,
            initializer=tf.initializers.TruncatedNormal(stddev=0.05))
        weights = parallax.dynamic_embedding("first_order", dim=1, capacity=capacity,
                                             initializer=0.0)
        embedded = embeddings.lookup(ids)  # [batch, FIELDS, DIM]
        first_order = tf.reduce_sum(weights.lookup(ids)[:, :, 0], 1)
        summed = tf.reduce_sum(embedded, 1)
        second_order = 0.5 * tf.reduce_sum(
            tf.square(summed) - tf.reduce_sum(tf.square(embedded), 1), 1)
        deep = tf.nn.relu(dense(tf.reshape(embedded, [-1, FIELDS * DIM]), 32, "deep"))
        logit = first_order + second_order + dense(deep, 1, "out")[:, 0]
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logit))
        tf.compat.v1.add_to_collection("loss", loss)
        tf.compat.v1.add_to_collection("ids_held", embeddings.size())  # fetched after a step
        global_step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.add_to_collection("train", tf.compat.v1.train.AdagradOptimizer(
            0.05).minimize(loss, global_step=global_step))
    return graph


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", default="127.0.0.1:0,1;127.0.0.2:0,1")
    parser.add_argument("--run-option", default="HYBRID")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--single", action="store_true",
                        help="train on one device, in a plain session")
    parser.add_argument("--ckpt-dir", help="save checkpoints here (and resume from them)")
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--metrics-file", help="the driver appends the job's progress here "
                        "(the ids each server holds among it)")
    options = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    graph = build()
    train, loss, held = (graph.get_collection(name)[0] for name in ("train", "loss", "ids_held"))
    if options.single:
        with graph.as_default():
            session = tf.compat.v1.Session()
            session.run(tf.compat.v1.global_variables_initializer())
        run, chief = session.run, True
    else:
        checkpoints = parallax.CheckpointConfig(
            ckpt_dir=options.ckpt_dir, save_ckpt_steps=options.save_steps
        ) if options.ckpt_dir else parallax.CheckpointConfig()
        runner = parallax.get_runner(graph, options.resources, parallax.Config(
            run_option=options.run_option, ckpt_config=checkpoints,
            metrics_file=options.metrics_file))
        run, chief = runner.run, runner.is_chief
    step = run(tf.compat.v1.train.get_global_step(graph))  # a resumed job goes on from there
    while step < options.steps:
        _, loss_value = run([train, loss])
        step += 1
        if chief and (step == 1 or step % 10 == 0):
            print(f"step {step:4d}  loss {loss_value:.4f}  ids in the table {run(held)}",
                  flush=True)


if __name__ == "__main__":
    main()
