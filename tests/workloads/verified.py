"""A script as a user writes it, for `python -m parallax.verify`: tf.data input sharded with
parallax.shard, an embedding (a parameter server in PS and HYBRID), a dense layer with
dropout, Adam, a fed learning rate, a global step.

    python verified.py RESOURCES STEPS [--run-option R] [--sum-gradients] [--sampled]
                       [--verify-steps N]

--sum-gradients: Config(average_dense=False), not what one device computes (verify fails);
--sampled: a sampled softmax, whose candidates each worker draws for its whole batch (verify
cannot compare); --verify-steps: Config(verify_steps=N).
"""
import argparse

import numpy as np
import tensorflow as tf

import parallax

parser = argparse.ArgumentParser()
parser.add_argument("resources")
parser.add_argument("steps", type=int)
parser.add_argument("--run-option", default="HYBRID")
parser.add_argument("--sum-gradients", action="store_true")
parser.add_argument("--sampled", action="store_true")
parser.add_argument("--verify-steps", type=int, default=0)
args = parser.parse_args()

tf.compat.v1.disable_eager_execution()
VOCABULARY, CLASSES, BATCH = 50, 5, 8
rng = np.random.RandomState(0)
ids = rng.randint(0, VOCABULARY, size=(256, 3)).astype(np.int64)
labels = (ids.sum(axis=1) % CLASSES).astype(np.int64)

graph = tf.Graph()
with graph.as_default():
    tf.compat.v1.set_random_seed(1)
    dataset = parallax.shard(tf.data.Dataset.from_tensor_slices((ids, labels)))
    words, label = tf.compat.v1.data.make_one_shot_iterator(
        dataset.shuffle(64, seed=3).repeat().batch(BATCH)).get_next()
    embedding = tf.compat.v1.get_variable("embedding", [VOCABULARY, 16])
    kernel = tf.compat.v1.get_variable("hidden/kernel", [16, 32])
    bias = tf.compat.v1.get_variable("hidden/bias", [32], initializer=tf.zeros_initializer())
    hidden = tf.nn.relu(tf.matmul(
        tf.reduce_mean(tf.nn.embedding_lookup(embedding, words), axis=1), kernel) + bias)
    hidden = tf.nn.dropout(hidden, rate=0.3)
    if args.sampled:
        weights = tf.compat.v1.get_variable("softmax_w", [CLASSES, 32])
        biases = tf.compat.v1.get_variable("softmax_b", [CLASSES])
        loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
            weights, biases, tf.reshape(label, [-1, 1]), hidden, num_sampled=2,
            num_classes=CLASSES))
    else:
        logits = tf.matmul(hidden, tf.compat.v1.get_variable("logits/kernel", [32, CLASSES]))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=label, logits=logits))
    rate = tf.compat.v1.placeholder(tf.float32, [], name="rate")
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train = tf.compat.v1.train.AdamOptimizer(rate).minimize(loss, global_step=global_step)

config = parallax.Config(run_option=args.run_option, average_dense=not args.sum_gradients,
                         verify_steps=args.verify_steps)
runner = parallax.get_runner(graph, args.resources, config)
for step in range(args.steps):
    _, value = runner.run([train, loss], feed_dict={rate: 0.05})
    if runner.is_chief and step % 5 == 0:
        print(f"step {step} loss {value:.4f}", flush=True)
