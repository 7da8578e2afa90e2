"""A script as a user writes it, for `python -m parallax.verify`: tf.data input sharded with
parallax.shard, an embedding (a parameter server in PS and HYBRID), a dense layer with
dropout, Adam, a fed learning rate, a global step.

    python verified.py RESOURCES STEPS [--run-option R] [--sum-gradients] [--sampled]
                       [--padded] [--heads] [--as-bert CHECKPOINT] [--order-sensitive]

--sum-gradients: Config(average_dense=False), not what one device computes (verify fails);
--sampled: a sampled softmax, whose candidates each worker draws for its whole batch (verify
cannot compare); --padded: a tagger of sentences of
words as strings, each worker's batch padded to its longest sentence by `padded_batch`, dropout
over every token, a loss divided by the batch's count of words (not padding); --heads: with
--padded, the dropout drawn for 2 heads x the batch, as multi-head attention often does it (not
one draw per example: verify cannot compare); --as-bert: as BERT's run_classifier writes it,
batches of a fixed size (drop_remainder=True) whose size the graph's shapes are built from,
dropout drawn over the batch's words flattened (batch x words rows, by a reshape), and the
embedding and the hidden kernel initialized from CHECKPOINT by init_from_checkpoint;
--order-sensitive: a bias before a batch normalization, whose gradient is zero up to rounding
and which Adam moves by about its rate a step all the same: one device on the same rows in
another order ends far from itself (verify judges it by that).
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
parser.add_argument("--padded", action="store_true")
parser.add_argument("--heads", action="store_true")
parser.add_argument("--as-bert", metavar="CHECKPOINT")
parser.add_argument("--order-sensitive", action="store_true")
args = parser.parse_args()

tf.compat.v1.disable_eager_execution()
VOCABULARY, CLASSES, BATCH = 50, 5, 8
rng = np.random.RandomState(0)
ids = rng.randint(0, VOCABULARY, size=(256, 3)).astype(np.int64)
labels = (ids.sum(axis=1) % CLASSES).astype(np.int64)


def padded_tagger():
    """Words as strings in sentences of 2 to 9, a tag for each word: the loss."""
    lengths = rng.randint(2, 10, size=256)
    words = np.array([[f"w{rng.randint(VOCABULARY)}" if i < n else "" for i in range(9)]
                      for n in lengths])
    tags = rng.randint(0, CLASSES, size=words.shape)
    dataset = parallax.shard(tf.data.Dataset.from_tensor_slices((words, lengths, tags)))
    dataset = dataset.map(lambda w, n, t: (w[:n], t[:n])).repeat()
    sentences, tag = tf.compat.v1.data.make_one_shot_iterator(
        dataset.padded_batch(BATCH, padded_shapes=([None], [None]),
                             padding_values=(b"<pad>", np.int64(0)))).get_next()
    mask = tf.cast(tf.not_equal(sentences, "<pad>"), tf.float32)
    embedding = tf.compat.v1.get_variable("embedding", [VOCABULARY, 16])
    embedded = tf.nn.embedding_lookup(
        embedding, tf.strings.to_hash_bucket_fast(sentences, VOCABULARY))
    if args.heads:
        heads = tf.nn.dropout(tf.concat(tf.split(embedded, 2, axis=2), axis=0), rate=0.3)
        embedded = tf.concat(tf.split(heads, 2, axis=0), axis=2)
    else:
        embedded = tf.nn.dropout(embedded, rate=0.3)
    hidden = tf.nn.relu(tf.tensordot(
        embedded, tf.compat.v1.get_variable("hidden/kernel", [16, 32]), 1))
    logits = tf.tensordot(hidden, tf.compat.v1.get_variable("logits/kernel", [32, CLASSES]), 1)
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tag, logits=logits)
    return tf.reduce_sum(cross_entropy * mask) / tf.reduce_sum(mask)


def bag_of_words():
    """Three word ids an example, their embeddings' mean, a hidden layer with dropout: loss."""
    dataset = parallax.shard(tf.data.Dataset.from_tensor_slices((ids, labels)))
    words, label = tf.compat.v1.data.make_one_shot_iterator(dataset.shuffle(64, seed=3).repeat(
        ).batch(BATCH, drop_remainder=bool(args.as_bert))).get_next()
    embedding = tf.compat.v1.get_variable("embedding", [VOCABULARY, 16])
    kernel = tf.compat.v1.get_variable("hidden/kernel", [16, 32])
    bias = tf.compat.v1.get_variable("hidden/bias", [32], initializer=tf.zeros_initializer())
    embedded = tf.nn.embedding_lookup(embedding, words)
    if args.as_bert:
        batch, length = words.shape.as_list()  # static, as BERT's get_shape_list reads them
        rows = tf.reshape(embedded, [batch * length, 16])
        rows = tf.nn.dropout(tf.matmul(rows, tf.compat.v1.get_variable("words/kernel", [16, 16])),
                             rate=0.1)
        embedded = tf.reshape(rows, [batch, length, 16])
        tf.compat.v1.train.init_from_checkpoint(args.as_bert, {"embedding": "embedding",
                                                               "hidden/kernel": "hidden/kernel"})
    hidden = tf.nn.relu(tf.matmul(tf.reduce_mean(embedded, axis=1), kernel) + bias)
    hidden = tf.nn.dropout(hidden, rate=0.3)
    if args.order_sensitive:
        normalized = tf.matmul(hidden, tf.compat.v1.get_variable("normalized/kernel", [32, 32]))
        normalized += tf.compat.v1.get_variable("normalized/bias", [32],
                                                initializer=tf.zeros_initializer())
        mean, variance = tf.nn.moments(normalized, axes=[0])
        hidden = (normalized - mean) * tf.math.rsqrt(variance + 1e-3)
    if args.sampled:
        weights = tf.compat.v1.get_variable("softmax_w", [CLASSES, 32])
        biases = tf.compat.v1.get_variable("softmax_b", [CLASSES])
        return tf.reduce_mean(tf.nn.sampled_softmax_loss(
            weights, biases, tf.reshape(label, [-1, 1]), hidden, num_sampled=2,
            num_classes=CLASSES))
    logits = tf.matmul(hidden, tf.compat.v1.get_variable("logits/kernel", [32, CLASSES]))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=label, logits=logits))


graph = tf.Graph()
with graph.as_default():
    tf.compat.v1.set_random_seed(1)
    loss = padded_tagger() if args.padded else bag_of_words()
    rate = tf.compat.v1.placeholder(tf.float32, [], name="rate")
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train = tf.compat.v1.train.AdamOptimizer(rate).minimize(loss, global_step=global_step)

config = parallax.Config(run_option=args.run_option, average_dense=not args.sum_gradients)
runner = parallax.get_runner(graph, args.resources, config)
for step in range(args.steps):
    _, value = runner.run([train, loss], feed_dict={rate: 0.05})
    if runner.is_chief and step % 5 == 0:
        print(f"step {step} loss {value:.4f}", flush=True)
