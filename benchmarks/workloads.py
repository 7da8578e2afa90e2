"""The three benchmark models, each a single-device tf.compat.v1 graph on synthetic data, built
the same way for every system (Parallax, Horovod, TF parameter servers); only what a system's
users change around the model (sharding the input, wrapping the optimizer) differs.

    cnn: dense, a small ResNet-style CNN (Keras 3 Conv2D/Dense layers) on 32x32 images.
    cnn-bn: cnn with fused batch normalization after each convolution of its blocks.
    lm:  sparse, LM1B-like: 100k x 64 input embedding, an LSTM, sampled softmax over a
         100k-row output embedding (Adagrad, gradients clipped by global norm; the tables
         split in shards, as the LM1B reference does for its parameter servers).
    lm-whole: lm with each table one variable, as a user who does not partition writes it.
    nmt: mixed, encoder-decoder: 50k source and 20k target embeddings, LSTM encoder and
         decoder, sampled softmax over the target vocabulary (Adam, clipped).
    tags: 'sparse' but nearly dense: a 1000-row tag embedding that every batch reads almost
         whole, then a classifier (Adam): HYBRID's rule puts it on a server, AUTO allreduces it.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import keras
import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # dense / sparse / mixed
    batch_per_worker: int
    unit: str  # what throughput counts: images or words
    units_per_sample: int
    build_dataset: Callable[[int], tf.data.Dataset]  # seed -> dataset of single examples
    build_loss: Callable[[tuple], tf.Tensor]  # a batch from the dataset -> scalar loss
    make_optimizer: Callable[[], tf.compat.v1.train.Optimizer]
    clip_norm: Optional[float] = None  # clip_by_global_norm, as the LM and NMT references do
    loop_steps: int = 0  # iterations of its recurrent loops (a variable read there, each time)

    def details(self, workers: int) -> dict:
        """What a benchmark record says about the workload a step of `workers` trained."""
        return {"workload": self.name, "unit": self.unit,
                "units_per_step": workers * self.batch_per_worker * self.units_per_sample,
                "clips_gradients": self.clip_norm is not None}

    def input_batch(self, shard: Callable[[tf.data.Dataset], tf.data.Dataset]):
        """This worker's next batch; `shard` is the system's own way of splitting the data."""
        dataset = shard(self.build_dataset(0)).repeat().batch(self.batch_per_worker,
                                                              drop_remainder=True)
        return tf.compat.v1.data.make_one_shot_iterator(dataset.prefetch(2)).get_next()

    def minimize(self, loss, optimizer, global_step):
        """The train op as the model's own code writes it; a system's optimizer wrapper
        (Horovod's, SyncReplicasOptimizer) goes in `optimizer`."""
        grads_and_vars = optimizer.compute_gradients(loss)
        if self.clip_norm:
            grads, variables = zip(*grads_and_vars)
            grads, _ = tf.clip_by_global_norm(grads, self.clip_norm)
            grads_and_vars = list(zip(grads, variables))
        # Batch norm's moving statistics (cnn-bn), as TF1 code orders them before the step.
        with tf.control_dependencies(tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.UPDATE_OPS)):
            return optimizer.apply_gradients(grads_and_vars, global_step=global_step)


def _zipf_ids(rng, vocab, shape):
    """Word ids with the skew of natural text: a few words are most of the tokens."""
    return (np.minimum(rng.zipf(1.2, size=shape), vocab) - 1).astype(np.int64)


# --- (a) dense: a small ResNet-style CNN ---------------------------------------------------
IMAGE, CLASSES = 32, 10


def _cnn_dataset(seed, examples=1024):
    rng = np.random.RandomState(seed)
    images = rng.uniform(-1, 1, (examples, IMAGE, IMAGE, 3)).astype(np.float32)
    labels = rng.randint(0, CLASSES, examples).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((images, labels))


def _batch_norm(x):
    """Batch normalization as TF1 code builds it: fused, in training mode, its moving
    statistics updated by ops in UPDATE_OPS (Parallax combines the workers' statistics)."""
    with tf.compat.v1.variable_scope(None, default_name="batch_norm"):
        channels = [x.shape[-1]]
        scale = tf.compat.v1.get_variable("scale", channels, initializer=tf.ones_initializer())
        offset = tf.compat.v1.get_variable("offset", channels,
                                           initializer=tf.zeros_initializer())
        statistics = [tf.compat.v1.get_variable(name, channels, initializer=initial,
                                                trainable=False)
                      for name, initial in (("moving_mean", tf.zeros_initializer()),
                                            ("moving_variance", tf.ones_initializer()))]
        y, mean, variance = tf.compat.v1.nn.fused_batch_norm(x, scale, offset)
        for moving, batch in zip(statistics, (mean, variance)):
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS,
                                           moving.assign_sub(0.01 * (moving - batch)))
        return y


def _residual_block(x, filters, stride, normalize):
    conv = keras.layers.Conv2D
    y = conv(filters, 3, strides=stride, padding="same")(x)
    y = conv(filters, 3, padding="same")(tf.nn.relu(normalize(y)))
    if stride != 1 or x.shape[-1] != filters:
        x = conv(filters, 1, strides=stride)(x)
    return tf.nn.relu(x + normalize(y))


def _cnn_loss(batch, normalize=lambda x: x):
    """cnn-bn: with `normalize` _batch_norm, after each convolution of the blocks."""
    images, labels = batch
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(images)
    for filters, stride in [(32, 1), (64, 2), (64, 1), (128, 2), (128, 1)]:
        x = _residual_block(x, filters, stride, normalize)
    logits = keras.layers.Dense(CLASSES)(tf.reduce_mean(x, axis=[1, 2]))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))


# --- (b) sparse: LM1B-like language model ---------------------------------------------------
LM_VOCAB, LM_DIM, LM_HIDDEN, LM_STEPS, LM_SAMPLED = 100_000, 64, 64, 20, 1024


def _lm_dataset(seed, examples=512):
    tokens = _zipf_ids(np.random.RandomState(seed), LM_VOCAB, (examples, LM_STEPS + 1))
    return tf.data.Dataset.from_tensor_slices((tokens[:, :-1], tokens[:, 1:]))


# Tables are split in row shards (tf.compat.v1 partitioned variables), each its own variable,
# so that a system with several parameter servers can spread one table's traffic over them;
# id i is row i // SHARDS of shard i % SHARDS ('mod'), so frequent words spread over shards.
SHARDS = 4


def _sharded(partitioned=True):
    """The tables' partitioner; None for 'lm-whole', whose tables are single variables as a
    user who does not partition writes them (Parallax's AUTO splits them itself)."""
    return tf.compat.v1.fixed_size_partitioner(SHARDS) if partitioned else None


def _sampled_softmax(hidden, labels, vocab, name, partitioned=True):
    weights = tf.compat.v1.get_variable(
        f"{name}_softmax_w", [vocab, hidden.shape[-1]], partitioner=_sharded(partitioned),
        initializer=tf.compat.v1.random_normal_initializer(stddev=hidden.shape[-1] ** -0.5))
    biases = tf.compat.v1.get_variable(f"{name}_softmax_b", [vocab],
                                       partitioner=_sharded(partitioned),
                                       initializer=tf.compat.v1.zeros_initializer())
    return tf.reduce_mean(tf.compat.v1.nn.sampled_softmax_loss(
        weights=weights, biases=biases, labels=tf.reshape(labels, [-1, 1]),
        inputs=tf.reshape(hidden, [-1, hidden.shape[-1]]), num_sampled=LM_SAMPLED,
        num_classes=vocab, partition_strategy="mod"))


def _embedding(name, vocab, ids, partitioned=True):
    table = tf.compat.v1.get_variable(
        name, [vocab, LM_DIM], partitioner=_sharded(partitioned),
        initializer=tf.compat.v1.random_uniform_initializer(-0.1, 0.1))
    return tf.compat.v1.nn.embedding_lookup(table, ids, partition_strategy="mod")


def _lm_loss(batch, partitioned=True):
    inputs, targets = batch
    hidden = keras.layers.LSTM(LM_HIDDEN, return_sequences=True)(
        _embedding("embedding", LM_VOCAB, inputs, partitioned))
    return _sampled_softmax(hidden, targets, LM_VOCAB, "lm", partitioned)


# --- (c) mixed: NMT-like encoder-decoder ----------------------------------------------------
NMT_SOURCE_VOCAB, NMT_TARGET_VOCAB, NMT_HIDDEN, NMT_STEPS = 50_000, 20_000, 128, 16


def _nmt_dataset(seed, examples=512):
    rng = np.random.RandomState(seed)
    source = _zipf_ids(rng, NMT_SOURCE_VOCAB, (examples, NMT_STEPS))
    target = _zipf_ids(rng, NMT_TARGET_VOCAB, (examples, NMT_STEPS + 1))
    return tf.data.Dataset.from_tensor_slices((source, target[:, :-1], target[:, 1:]))


def _nmt_loss(batch):
    source, target_in, target_out = batch
    _, state_h, state_c = keras.layers.LSTM(NMT_HIDDEN, return_state=True)(
        _embedding("source_embedding", NMT_SOURCE_VOCAB, source))
    decoded = keras.layers.LSTM(NMT_HIDDEN, return_sequences=True)(
        _embedding("target_embedding", NMT_TARGET_VOCAB, target_in),
        initial_state=[state_h, state_c])
    projected = keras.layers.Dense(LM_DIM)(decoded)
    return _sampled_softmax(projected, target_out, NMT_TARGET_VOCAB, "nmt")


# --- (d) where HYBRID's rule is wrong: a small vocabulary read whole by every batch ----------
TAGS_VOCAB, TAGS_PER_EXAMPLE, TAGS_CLASSES = 1000, 200, 20


def _tags_dataset(seed, examples=512):
    rng = np.random.RandomState(seed)
    tags = rng.randint(0, TAGS_VOCAB, (examples, TAGS_PER_EXAMPLE)).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((tags, rng.randint(0, TAGS_CLASSES, examples)))


def _tags_loss(batch):
    """A bag of tags per example (a 1000 x 64 embedding; a batch's 6400 tags touch nearly
    every row, so its 'sparse' gradient is as large as the table), then a classifier."""
    tags, labels = batch
    table = tf.compat.v1.get_variable("tag_embedding", [TAGS_VOCAB, LM_DIM])
    hidden = keras.layers.Dense(128, activation="relu")(
        tf.reduce_mean(tf.nn.embedding_lookup(table, tags), axis=1))
    logits = keras.layers.Dense(TAGS_CLASSES)(hidden)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int64), logits=logits))


WORKLOADS = {
    "cnn": Workload("cnn", "dense", 32, "images", 1, _cnn_dataset, _cnn_loss,
                    lambda: tf.compat.v1.train.MomentumOptimizer(0.01, 0.9)),
    "cnn-bn": Workload("cnn-bn", "dense", 32, "images", 1, _cnn_dataset,
                       functools.partial(_cnn_loss, normalize=_batch_norm),
                       lambda: tf.compat.v1.train.MomentumOptimizer(0.01, 0.9)),
    "lm": Workload("lm", "sparse", 32, "words", LM_STEPS, _lm_dataset, _lm_loss,
                   lambda: tf.compat.v1.train.AdagradOptimizer(0.2), clip_norm=1.0,
                   loop_steps=LM_STEPS),
    # lm with single-variable tables: what AUTO makes of tables nobody partitioned
    "lm-whole": Workload("lm-whole", "sparse", 32, "words", LM_STEPS, _lm_dataset,
                         functools.partial(_lm_loss, partitioned=False),
                         lambda: tf.compat.v1.train.AdagradOptimizer(0.2), clip_norm=1.0,
                         loop_steps=LM_STEPS),
    "nmt": Workload("nmt", "mixed", 32, "words", NMT_STEPS, _nmt_dataset, _nmt_loss,
                    lambda: tf.compat.v1.train.AdamOptimizer(1e-3), clip_norm=5.0,
                    loop_steps=NMT_STEPS),
    "tags": Workload("tags", "sparse", 32, "examples", 1, _tags_dataset, _tags_loss,
                     lambda: tf.compat.v1.train.AdamOptimizer(1e-3)),
}


def session_config() -> tf.compat.v1.ConfigProto:
    """Every system's workers alike: one thread for an op's kernel (several workers share the
    machine's cores), a few for independent ops and blocking queue/accumulator ops."""
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                    inter_op_parallelism_threads=4, allow_soft_placement=True)
