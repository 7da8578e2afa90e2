"""A small CNN classifier (Keras 3 layers inside a tf.compat.v1 graph) on synthetic images,
trained data-parallel by Parallax.

    python examples/classifier.py [resource_file] [steps]
"""
import sys

import parallax  # first: before TensorFlow loads, so that it starts quietly
import keras
import numpy as np
import tensorflow as tf

RESOURCES = sys.argv[1] if len(sys.argv) > 1 else "cluster_specs/localhost"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 100
BATCH_PER_WORKER, CLASSES = 32, 4


def synthetic_images(count, seed=0):
    """Each class is a noisy bright square in its own quadrant: learnable in a few steps."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, CLASSES, size=count)
    images = rng.rand(count, 16, 16, 1).astype(np.float32)
    for image, label in zip(images, labels):
        row, col = divmod(label, 2)
        image[row * 8:(row + 1) * 8, col * 8:(col + 1) * 8] += 0.08
    return images, labels.astype(np.int64)


tf.compat.v1.disable_eager_execution()
keras.utils.set_random_seed(0)  # a reproducible demo; replicas start from worker 0 anyway
graph = tf.Graph()
with graph.as_default():
    dataset = tf.data.Dataset.from_tensor_slices(synthetic_images(4096)).repeat()
    images, labels = tf.compat.v1.data.make_one_shot_iterator(
        parallax.shard(dataset).batch(BATCH_PER_WORKER)).get_next()
    hidden = keras.layers.Conv2D(8, 3, activation="relu")(images)
    hidden = keras.layers.MaxPooling2D(2)(hidden)
    hidden = keras.layers.Flatten()(hidden)
    hidden = keras.layers.Dense(32, activation="relu")(hidden)
    logits = keras.layers.Dense(CLASSES)(hidden)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.003).minimize(loss, global_step=global_step)

runner = parallax.get_runner(graph, RESOURCES)
for step in range(1, STEPS + 1):
    _, loss_value, accuracy_value = runner.run([train_op, loss, accuracy])
    if runner.is_chief and (step == 1 or step % 10 == 0):
        print(f"step {step:4d}  loss {loss_value:.4f}  accuracy {accuracy_value:.2f}", flush=True)
