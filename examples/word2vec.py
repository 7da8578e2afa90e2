"""TensorFlow's word2vec_basic tutorial (skip-gram with NCE), ported to Parallax as a user
would: Python batches fed through feed_dict, a loss summary, a Saver, similarity.eval() at the
end. Each change is marked 'Parallax:'. The tutorial downloads text8; this one draws a corpus
where word w is mostly followed by w+1, a structure skip-gram can learn.

The embedding and the NCE weights get sparse (IndexedSlices) gradients, which Parallax finds
and synchronizes as sparse.

    python examples/word2vec.py [resource_file] [steps] [log_dir] [--async]

--async trains asynchronously (parallax.Config(sync=False)): each worker applies its own
gradients to the servers' variables as they arrive.
"""
import collections
import os
import sys
import tempfile

import parallax  # Parallax: first, before TensorFlow loads (it starts quietly)
import numpy as np
import tensorflow as tf

ARGS = [a for a in sys.argv[1:] if a != "--async"]
RESOURCES = ARGS[0] if len(ARGS) > 0 else "cluster_specs/localhost"
NUM_STEPS = int(ARGS[1]) if len(ARGS) > 1 else 200
LOG_DIR = ARGS[2] if len(ARGS) > 2 else os.path.join(tempfile.gettempdir(), "parallax-word2vec")
SYNC = "--async" not in sys.argv[1:]
VOCABULARY_SIZE = 1000
BATCH_SIZE = 64  # Parallax: per worker; a step trains on BATCH_SIZE * num_workers pairs
EMBEDDING_SIZE = 32
SKIP_WINDOW = 2  # how many words to consider left and right
NUM_SKIPS = 4  # how many times to reuse an input to generate a label
NUM_SAMPLED = 16  # negative examples to sample
VALID_EXAMPLES = np.arange(0, 100, 10)  # words whose nearest neighbours are shown at the end

np.random.seed(0)  # Parallax: every worker draws the same batches, and feeds its rows of them
data = (np.cumsum(np.random.RandomState(0).choice([1, 1, 1, 2, 5], size=50000))
        % VOCABULARY_SIZE).tolist()
data_index = 0


def generate_batch(batch_size, num_skips, skip_window):
    """The tutorial's batch generator: (center word, context word) pairs along the corpus."""
    global data_index
    batch = np.ndarray(shape=(batch_size,), dtype=np.int32)
    labels = np.ndarray(shape=(batch_size, 1), dtype=np.int32)
    span = 2 * skip_window + 1
    buffer = collections.deque(maxlen=span)
    if data_index + span > len(data):
        data_index = 0
    buffer.extend(data[data_index:data_index + span])
    data_index += span
    for i in range(batch_size // num_skips):
        context_words = [w for w in range(span) if w != skip_window]
        words_to_use = np.random.choice(context_words, num_skips, replace=False)
        for j, context_word in enumerate(words_to_use):
            batch[i * num_skips + j] = buffer[skip_window]
            labels[i * num_skips + j, 0] = buffer[context_word]
        if data_index == len(data):
            buffer.extend(data[0:span])
            data_index = span
        else:
            buffer.append(data[data_index])
            data_index += 1
    data_index = (data_index + len(data) - span) % len(data)
    return batch, labels


tf.compat.v1.disable_eager_execution()
graph = tf.Graph()
with graph.as_default():
    train_inputs = tf.compat.v1.placeholder(tf.int32, shape=[None])
    train_labels = tf.compat.v1.placeholder(tf.int32, shape=[None, 1])
    valid_dataset = tf.constant(VALID_EXAMPLES, dtype=tf.int32)

    embeddings = tf.Variable(
        tf.random.uniform([VOCABULARY_SIZE, EMBEDDING_SIZE], -1.0, 1.0, seed=1))
    embed = tf.nn.embedding_lookup(embeddings, train_inputs)
    nce_weights = tf.Variable(tf.random.truncated_normal(
        [VOCABULARY_SIZE, EMBEDDING_SIZE], stddev=1.0 / np.sqrt(EMBEDDING_SIZE), seed=2))
    nce_biases = tf.Variable(tf.zeros([VOCABULARY_SIZE]))

    loss = tf.reduce_mean(tf.nn.nce_loss(
        weights=nce_weights, biases=nce_biases, labels=train_labels, inputs=embed,
        num_sampled=NUM_SAMPLED, num_classes=VOCABULARY_SIZE))
    tf.compat.v1.summary.scalar("loss", loss)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(1.0).minimize(loss)

    # Cosine similarity between the validation words and every word.
    norm = tf.sqrt(tf.reduce_sum(tf.square(embeddings), 1, keepdims=True))
    normalized_embeddings = embeddings / norm
    valid_embeddings = tf.nn.embedding_lookup(normalized_embeddings, valid_dataset)
    similarity = tf.matmul(valid_embeddings, normalized_embeddings, transpose_b=True)

    merged = tf.compat.v1.summary.merge_all()
    saver = tf.compat.v1.train.Saver()

# Parallax: the runner replaces `with tf.compat.v1.Session(graph=graph) as session:` and the
# run of the variables' initializer.
runner = parallax.get_runner(graph, RESOURCES, parallax.Config(sync=SYNC))
writer = tf.compat.v1.summary.FileWriter(LOG_DIR, graph) if runner.is_chief else None
losses = []
for step in range(1, NUM_STEPS + 1):
    # Parallax: every worker generates the combined batch and feeds its own rows of it.
    batch_inputs, batch_labels = generate_batch(BATCH_SIZE * runner.num_workers, NUM_SKIPS,
                                                SKIP_WINDOW)
    mine = slice(runner.worker_id, None, runner.num_workers)
    feed_dict = {train_inputs: batch_inputs[mine], train_labels: batch_labels[mine]}
    _, summary, loss_val = runner.run([optimizer, merged, loss], feed_dict=feed_dict)
    losses.append(loss_val)
    if writer is not None:  # Parallax: the chief writes the summaries
        writer.add_summary(summary, step)
    if (step == 1 or step % 20 == 0) and runner.is_chief:
        print(f"step {step:4d}  loss {np.mean(losses):.4f}", flush=True)  # since the last line
        losses = []

if runner.is_chief:  # Parallax: a run that updates nothing, the chief's alone
    with runner.as_default():
        sim = similarity.eval()
    for i, word in enumerate(VALID_EXAMPLES):
        nearest = (-sim[i, :]).argsort()[1:6]
        print(f"nearest to {word}: {', '.join(str(w) for w in nearest)}", flush=True)
# Parallax: the runner stands for the session; only the chief writes the files.
print(f"saved {saver.save(runner, os.path.join(LOG_DIR, 'model.ckpt'))}", flush=True)
if writer is not None:
    writer.close()
runner.close()
