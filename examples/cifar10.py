"""The TensorFlow CIFAR-10 tutorial (tensorflow/models, tutorials/image/cifar10: cifar10.py and
cifar10_train.py), ported to Parallax as a user would, on synthetic CIFAR-like images.

    python examples/cifar10.py [resource_file] [steps]

What the port changed, each marked "Parallax:" below:
  - `import parallax` before building the graph; the dataset is `parallax.shard`ed;
  - the tutorial's tf.compat.v1.train.MonitoredTrainingSession is
    parallax.MonitoredTrainingSession(resources, ...): the loop, its hooks (StopAtStepHook,
    NanTensorHook, the logging hook), checkpoint_dir and the session's ConfigProto stay as the
    tutorial wrote them;
  - constants that count steps are in steps of the combined batch: with N workers an epoch has
    N times fewer steps, so decay_steps divides by the number of workers;
  - the input is tf.data on synthetic images (the tutorial reads its binary files through
    tf.train.shuffle_batch, which also runs under Parallax, sharded with `parallax.shard` of
    the file list, but in no fixed order). Every worker shuffles the whole set alike (a fixed
    seed) and then takes its share, so a step's combined batch holds the images one device's
    batch of N x 32 would; the random flips are each worker's own draws.
What it kept: weight decay in the 'losses' collection, moving averages of the losses that the
gradients wait for, gradient histograms, the decaying learning rate, moving averages of the
variables after each update, summaries and checkpoints written by the chief (the monitored
session's hooks, to CIFAR10_TRAIN_DIR or a temporary folder).
"""
import os
import sys
import tempfile
import time

import parallax  # Parallax: first, so that gradients are recorded and TensorFlow starts quietly
import numpy as np
import tensorflow as tf

RESOURCES = sys.argv[1] if len(sys.argv) > 1 else "cluster_specs/localhost"
MAX_STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 100
BATCH_SIZE, IMAGE_SIZE, NUM_CLASSES = 32, 16, 10
NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN = 5000
MOVING_AVERAGE_DECAY, NUM_EPOCHS_PER_DECAY = 0.9999, 350.0
LOG_FREQUENCY = 10
LOG_DEVICE_PLACEMENT = False
LEARNING_RATE_DECAY_FACTOR, INITIAL_LEARNING_RATE = 0.1, 0.1


def synthetic_cifar(count, seed=0):
    """Images whose class is the colour of a bright patch, in a random place."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, NUM_CLASSES, size=count)
    images = rng.rand(count, IMAGE_SIZE, IMAGE_SIZE, 3).astype(np.float32) * 0.2
    palette = np.eye(NUM_CLASSES, 3, dtype=np.float32) + np.eye(NUM_CLASSES, 3, -3) * 0.5 + (
        np.eye(NUM_CLASSES, 3, -6, dtype=np.float32) * 0.25)
    for image, label in zip(images, labels):
        row, col = rng.randint(0, IMAGE_SIZE - 8, size=2)
        image[row:row + 8, col:col + 8] += 2.0 * palette[label]
    return images, labels.astype(np.int32)


def distorted_inputs():
    # Parallax: each worker on its share of one shuffled sequence (sharded after the shuffle,
    # whose seed is the same on every worker), so the combined batch is one device's.
    dataset = tf.data.Dataset.from_tensor_slices(synthetic_cifar(NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN))
    dataset = parallax.shard(dataset.shuffle(1000, seed=1).repeat()).batch(BATCH_SIZE)
    images, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    images = tf.image.random_flip_left_right(images, seed=2)
    return tf.image.per_image_standardization(images), labels


def _variable_with_weight_decay(name, shape, stddev, wd):
    var = tf.compat.v1.get_variable(
        name, shape, initializer=tf.compat.v1.truncated_normal_initializer(stddev=stddev))
    if wd is not None:
        tf.compat.v1.add_to_collection("losses", tf.multiply(tf.nn.l2_loss(var), wd,
                                                             name="weight_loss"))
    return var


def _bias(name, shape, value):
    return tf.compat.v1.get_variable(name, shape,
                                     initializer=tf.compat.v1.constant_initializer(value))


def _activation_summary(x):
    tf.compat.v1.summary.histogram(x.op.name + "/activations", x)
    tf.compat.v1.summary.scalar(x.op.name + "/sparsity", tf.nn.zero_fraction(x))


def inference(images):
    with tf.compat.v1.variable_scope("conv1") as scope:
        kernel = _variable_with_weight_decay("weights", [5, 5, 3, 32], 5e-2, None)
        conv = tf.nn.conv2d(images, kernel, [1, 1, 1, 1], padding="SAME")
        conv1 = tf.nn.relu(conv + _bias("biases", [32], 0.0), name=scope.name)
        _activation_summary(conv1)
    pool1 = tf.nn.max_pool2d(conv1, 3, 2, padding="SAME", name="pool1")
    norm1 = tf.nn.lrn(pool1, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, name="norm1")
    with tf.compat.v1.variable_scope("conv2") as scope:
        kernel = _variable_with_weight_decay("weights", [5, 5, 32, 32], 5e-2, None)
        conv = tf.nn.conv2d(norm1, kernel, [1, 1, 1, 1], padding="SAME")
        conv2 = tf.nn.relu(conv + _bias("biases", [32], 0.1), name=scope.name)
        _activation_summary(conv2)
    norm2 = tf.nn.lrn(conv2, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, name="norm2")
    pool2 = tf.nn.max_pool2d(norm2, 3, 2, padding="SAME", name="pool2")
    with tf.compat.v1.variable_scope("local3") as scope:
        reshape = tf.reshape(pool2, [-1, (IMAGE_SIZE // 4) ** 2 * 32])
        weights = _variable_with_weight_decay("weights", [reshape.shape[1], 96], 0.04, 0.004)
        local3 = tf.nn.relu(tf.matmul(reshape, weights) + _bias("biases", [96], 0.1),
                            name=scope.name)
        _activation_summary(local3)
    with tf.compat.v1.variable_scope("softmax_linear") as scope:
        weights = _variable_with_weight_decay("weights", [96, NUM_CLASSES], 1 / 96.0, None)
        softmax_linear = tf.add(tf.matmul(local3, weights),
                                _bias("biases", [NUM_CLASSES], 0.0), name=scope.name)
        _activation_summary(softmax_linear)
    return softmax_linear


def loss(logits, labels):
    cross_entropy_mean = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int64), logits=logits), name="cross_entropy")
    tf.compat.v1.add_to_collection("losses", cross_entropy_mean)
    return tf.add_n(tf.compat.v1.get_collection("losses"), name="total_loss")


def _add_loss_summaries(total_loss):
    loss_averages = tf.compat.v1.train.ExponentialMovingAverage(0.9, name="avg")
    losses = tf.compat.v1.get_collection("losses")
    loss_averages_op = loss_averages.apply(losses + [total_loss])
    for l in losses + [total_loss]:
        tf.compat.v1.summary.scalar(l.op.name + " (raw)", l)
        tf.compat.v1.summary.scalar(l.op.name, loss_averages.average(l))
    return loss_averages_op


def train(total_loss, global_step, num_workers):
    # Parallax: a step trains on the combined batch of every worker.
    num_batches_per_epoch = NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN / (BATCH_SIZE * num_workers)
    decay_steps = int(num_batches_per_epoch * NUM_EPOCHS_PER_DECAY)
    lr = tf.compat.v1.train.exponential_decay(INITIAL_LEARNING_RATE, global_step, decay_steps,
                                              LEARNING_RATE_DECAY_FACTOR, staircase=True)
    tf.compat.v1.summary.scalar("learning_rate", lr)
    loss_averages_op = _add_loss_summaries(total_loss)
    with tf.control_dependencies([loss_averages_op]):
        opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
        grads = opt.compute_gradients(total_loss)
    apply_gradient_op = opt.apply_gradients(grads, global_step=global_step)
    for var in tf.compat.v1.trainable_variables():
        tf.compat.v1.summary.histogram(var.op.name, var)
    for grad, var in grads:
        if grad is not None:
            tf.compat.v1.summary.histogram(var.op.name + "/gradients", grad)
    variable_averages = tf.compat.v1.train.ExponentialMovingAverage(MOVING_AVERAGE_DECAY,
                                                                    global_step)
    with tf.control_dependencies([apply_gradient_op]):
        variables_averages_op = variable_averages.apply(tf.compat.v1.trainable_variables())
    return variables_averages_op


def main():
    tf.compat.v1.disable_eager_execution()
    num_workers = parallax.num_workers()  # Parallax: for decay_steps
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        images, labels = distorted_inputs()
        total_loss = loss(inference(images), labels)
        train_op = train(total_loss, global_step, num_workers)

    class _LoggerHook(tf.compat.v1.train.SessionRunHook):
        """Logs loss and runtime (the tutorial's)."""

        def begin(self):
            self._step = 0
            self._start_time = time.time()

        def before_run(self, run_context):
            self._step += 1
            return tf.compat.v1.train.SessionRunArgs(total_loss)  # asks for the loss value

        def after_run(self, run_context, run_values):
            if self._step == 1 or self._step % LOG_FREQUENCY == 0:
                seconds = (time.time() - self._start_time) / max(self._step, 1)
                print(f"step {self._step:4d}  loss {run_values.results:.4f}  "
                      f"({seconds:.3f} sec/batch)", flush=True)

    train_dir = os.environ.get("CIFAR10_TRAIN_DIR") or tempfile.mkdtemp(prefix="cifar10_train")
    with graph.as_default():
        # Parallax: parallax.MonitoredTrainingSession(RESOURCES, ...) instead of
        # tf.compat.v1.train.MonitoredTrainingSession(...).
        with parallax.MonitoredTrainingSession(
                RESOURCES, checkpoint_dir=train_dir,
                hooks=[tf.compat.v1.train.StopAtStepHook(last_step=MAX_STEPS),
                       tf.compat.v1.train.NanTensorHook(total_loss),
                       _LoggerHook()],
                config=tf.compat.v1.ConfigProto(
                    log_device_placement=LOG_DEVICE_PLACEMENT)) as mon_sess:
            while not mon_sess.should_stop():
                mon_sess.run(train_op)


if __name__ == "__main__":
    main()
