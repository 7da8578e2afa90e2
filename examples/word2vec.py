"""Skip-gram word embeddings with NCE on a synthetic corpus. The embedding and the NCE weights
get sparse (IndexedSlices) gradients, which Parallax finds and synchronizes as sparse.

    python examples/word2vec.py [resource_file] [steps]
"""
import sys

import numpy as np
import tensorflow as tf

import parallax

RESOURCES = sys.argv[1] if len(sys.argv) > 1 else "cluster_specs/localhost"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 200
VOCAB, DIM, WINDOW, NEGATIVES, BATCH_PER_WORKER = 1000, 32, 2, 16, 64


def synthetic_pairs(num_words, seed=0):
    """(center, context) pairs from a corpus where word w is mostly followed by w+1: a
    structure skip-gram can learn."""
    rng = np.random.RandomState(seed)
    corpus = np.cumsum(rng.choice([1, 1, 1, 2, 5], size=num_words)) % VOCAB
    centers, contexts = [], []
    for offset in range(1, WINDOW + 1):
        centers += [corpus[:-offset], corpus[offset:]]
        contexts += [corpus[offset:], corpus[:-offset]]
    order = rng.permutation(sum(len(c) for c in centers))
    return (np.concatenate(centers)[order].astype(np.int64),
            np.concatenate(contexts)[order].astype(np.int64)[:, None])


tf.compat.v1.disable_eager_execution()
graph = tf.Graph()
with graph.as_default():
    dataset = tf.data.Dataset.from_tensor_slices(synthetic_pairs(50000)).repeat()
    centers, contexts = tf.compat.v1.data.make_one_shot_iterator(
        parallax.shard(dataset).batch(BATCH_PER_WORKER)).get_next()
    embeddings = tf.compat.v1.get_variable(
        "embeddings", [VOCAB, DIM], initializer=tf.compat.v1.random_uniform_initializer(-1, 1))
    nce_weights = tf.compat.v1.get_variable(
        "nce_weights", [VOCAB, DIM],
        initializer=tf.compat.v1.truncated_normal_initializer(stddev=DIM ** -0.5))
    nce_biases = tf.compat.v1.get_variable(
        "nce_biases", [VOCAB], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.reduce_mean(tf.nn.nce_loss(
        weights=nce_weights, biases=nce_biases, labels=contexts,
        inputs=tf.nn.embedding_lookup(embeddings, centers),
        num_sampled=NEGATIVES, num_classes=VOCAB))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss, global_step=global_step)

runner = parallax.get_runner(graph, RESOURCES)
for step in range(1, STEPS + 1):
    _, loss_value = runner.run([train_op, loss])
    if runner.is_chief and (step == 1 or step % 20 == 0):
        print(f"step {step:4d}  loss {loss_value:.4f}", flush=True)
