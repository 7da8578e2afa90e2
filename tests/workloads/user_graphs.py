"""Graphs shaped like users' code, trained on N workers and compared with single-device training.

Each shape is written as a tutorial writes it, with feed_dict input (each worker feeds its share
of the step's combined batch), and one training loop that runs unchanged on one device or under
Parallax. As a script it is a Parallax job; every worker saves all its variables and what its
loop fetched. The tests import `train_single_device` for the reference.

    python user_graphs.py --shape gan --resources localhost:0,1 --run-option PS --out DIR
"""
import argparse
import os
import random
import time

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util
from tensorflow.python.training import moving_averages  # as TF1 batch-norm code does

import parallax
from tf1 import behaviour

VOCAB, EMBED, FEATURES, HIDDEN, CLASSES, IDS = 30, 4, 5, 8, 3, 3
BATCH_PER_WORKER = 4
STEPS = int(os.environ.get("USER_GRAPHS_STEPS", "12"))  # the same in the job and the reference
RESTORE_IN_CHIEF_ONLY = False  # the restore shape as Horovod's users write it (--chief-restores)


def batch(step, total):
    """The combined batch of one step; worker k of n feeds rows k::n."""
    rng = np.random.RandomState(1000 + step)
    return {"x": rng.randn(total, FEATURES).astype(np.float32),
            "ids": rng.randint(0, VOCAB // 2, size=(total, IDS)).astype(np.int64),
            "label": rng.randint(0, CLASSES, size=total).astype(np.int64)}


def _initial(shape, seed):
    value = np.random.RandomState(seed).randn(*shape).astype(np.float32) * 0.5
    return tf.constant_initializer(value)


def _inputs():
    return {"x": tf.compat.v1.placeholder(tf.float32, [None, FEATURES], name="x"),
            "ids": tf.compat.v1.placeholder(tf.int64, [None, IDS], name="ids"),
            "label": tf.compat.v1.placeholder(tf.int64, [None], name="label")}


def _logits(inputs, scope):
    """An embedding (sparse gradient) and two dense layers."""
    with tf.compat.v1.variable_scope(scope):
        embedding = tf.compat.v1.get_variable("emb", [VOCAB, EMBED],
                                              initializer=_initial([VOCAB, EMBED], 1))
        features = tf.concat([inputs["x"], tf.reduce_mean(
            tf.nn.embedding_lookup(embedding, inputs["ids"]), axis=1)], axis=1)
        w1 = tf.compat.v1.get_variable("w1", [FEATURES + EMBED, HIDDEN],
                                       initializer=_initial([FEATURES + EMBED, HIDDEN], 2))
        w2 = tf.compat.v1.get_variable("w2", [HIDDEN, CLASSES],
                                       initializer=_initial([HIDDEN, CLASSES], 3))
        return tf.matmul(tf.tanh(tf.matmul(features, w1)), w2)


def _cross_entropy(inputs, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=inputs["label"], logits=logits))


def _read_after(train_op, variable):
    """The variable read once train_op is done. Fetching the variable itself beside train_op
    is unordered, on one device too: either value can come back."""
    with tf.control_dependencies([train_op]):
        return variable.read_value()


def gan():
    """Two optimizers over disjoint variables, run alternately; the second advances
    global_step (a GAN's discriminator and generator steps)."""
    inputs = _inputs()
    d_logits, g_logits = _logits(inputs, "d"), _logits(inputs, "g")
    d_loss = _cross_entropy(inputs, d_logits + 0.5 * tf.stop_gradient(g_logits))
    g_loss = _cross_entropy(inputs, g_logits - 0.5 * tf.stop_gradient(d_logits))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    d_vars = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, "d/")
    g_vars = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, "g/")
    d_train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(d_loss, var_list=d_vars)
    g_train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(
        g_loss, var_list=g_vars, global_step=global_step)

    def loop(run, feed, is_chief):
        fetched = []
        for step in range(STEPS):
            run(d_train, feed(step))
            # Read apart from the update: in the same run the two are unordered, on one device too.
            fetched.append(run(global_step))
            run(g_train, feed(step))
        return fetched
    return inputs, loop


def accumulate():
    """Gradient accumulation: every step adds the gradients into variables; every 2nd step a
    separate op applies the accumulated sum and another resets it."""
    inputs = _inputs()
    loss = _cross_entropy(inputs, _logits(inputs, "model"))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
    grads_and_vars = optimizer.compute_gradients(loss)
    accumulators = [tf.Variable(tf.zeros(v.shape), trainable=False, name=v.op.name + "_acc")
                    for _, v in grads_and_vars]
    accumulate_op = tf.group(*[a.assign_add(tf.convert_to_tensor(g))
                               for a, (g, _) in zip(accumulators, grads_and_vars)])
    apply_op = optimizer.apply_gradients(
        [(a, v) for a, (_, v) in zip(accumulators, grads_and_vars)], global_step=global_step)
    with tf.control_dependencies([apply_op]):
        reset_op = tf.group(*[a.assign(tf.zeros_like(a)) for a in accumulators])

    def loop(run, feed, is_chief):
        fetched = []
        for step in range(STEPS):
            run(accumulate_op, feed(step))
            if step % 2 == 1:
                run(reset_op)
            fetched.append(run(global_step))
        return fetched
    return inputs, loop


def cifar10():
    """The CIFAR-10 tutorial's training graph: weight decay in a 'losses' collection, moving
    averages of the losses that the gradients wait for, gradient histograms, a decaying learning
    rate, moving averages of the variables after the update; its loop runs the initializer and
    fetches global_step with the train op, and the summaries with it every 5 steps (chief only)."""
    inputs = _inputs()
    logits = _logits(inputs, "model")
    tf.compat.v1.add_to_collection("losses", _cross_entropy(inputs, logits))
    for variable in tf.compat.v1.trainable_variables():
        if "/w" in variable.op.name:
            tf.compat.v1.add_to_collection("losses", 0.01 * tf.nn.l2_loss(variable))
    losses = tf.compat.v1.get_collection("losses")
    total_loss = tf.add_n(losses, name="total_loss")
    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = tf.compat.v1.train.exponential_decay(0.1, global_step, 4, 0.5, staircase=True)
    loss_averages = tf.compat.v1.train.ExponentialMovingAverage(0.9, name="avg")
    loss_averages_op = loss_averages.apply(losses + [total_loss])
    for loss in losses + [total_loss]:
        tf.compat.v1.summary.scalar(loss.op.name + "_raw", loss)
        tf.compat.v1.summary.scalar(loss.op.name, loss_averages.average(loss))
    with tf.control_dependencies([loss_averages_op]):
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
        grads = optimizer.compute_gradients(total_loss)
    apply_gradient_op = optimizer.apply_gradients(grads, global_step=global_step)
    for grad, variable in grads:
        tf.compat.v1.summary.histogram(variable.op.name + "/gradients", grad)
    variable_averages = tf.compat.v1.train.ExponentialMovingAverage(0.9, global_step)
    with tf.control_dependencies([apply_gradient_op]):
        train_op = variable_averages.apply(tf.compat.v1.trainable_variables())
    summary_op = tf.compat.v1.summary.merge_all()
    init = tf.compat.v1.global_variables_initializer()
    step_after = _read_after(train_op, global_step)

    def loop(run, feed, is_chief):
        run(init)
        fetched = []
        for step in range(STEPS):
            if is_chief and step % 5 == 0:  # as the tutorial's summary hook does
                fetched.append(run([train_op, summary_op, step_after], feed(step))[2])
            else:
                fetched.append(run([train_op, step_after], feed(step))[1])
        return fetched
    return inputs, loop


def summary():
    """Summaries of the loss, the gradients and their global norm, which only the chief fetches,
    alone, every 5 steps; Adam with clipping by the global norm."""
    inputs = _inputs()
    loss = _cross_entropy(inputs, _logits(inputs, "model"))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
    grads, variables = zip(*optimizer.compute_gradients(loss))
    clipped, norm = tf.clip_by_global_norm(grads, 1.0)
    train_op = optimizer.apply_gradients(zip(clipped, variables), global_step=global_step)
    tf.compat.v1.summary.scalar("loss", loss)
    for grad, variable in zip(grads, variables):
        tf.compat.v1.summary.histogram(variable.op.name + "/gradients", grad)
    summary_op = tf.compat.v1.summary.merge_all()

    def loop(run, feed, is_chief):
        fetched = []
        for step in range(STEPS):
            run(train_op, feed(step))
            if is_chief and step % 5 == 0:
                run(summary_op, feed(step))
            fetched.append(run(global_step))
        return fetched
    return inputs, loop


def schedule():
    """A learning rate fed through a placeholder every step (TF1's schedules), the loss
    summarized with it, Momentum (a slot updated with the fed rate, sparsely for the
    embedding)."""
    inputs = _inputs()
    learning_rate = tf.compat.v1.placeholder(tf.float32, [], name="learning_rate")
    loss = _cross_entropy(inputs, _logits(inputs, "model"))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.MomentumOptimizer(learning_rate, 0.9).minimize(
        loss, global_step=global_step)
    summary_op = tf.compat.v1.summary.merge([tf.compat.v1.summary.scalar("loss", loss),
                                             tf.compat.v1.summary.scalar("lr", learning_rate)])

    def loop(run, feed, is_chief):
        fetched = []
        for step in range(STEPS):
            rate = {learning_rate: 0.2 * 0.8 ** step}
            run(train_op, {**feed(step), **rate})
            if is_chief and step % 5 == 0:
                run(summary_op, {**feed(step), **rate})
            fetched.append(run(global_step))
        return fetched
    return inputs, loop


def restore():
    """A Saver's save, and its restore a few steps later (a script going back to a checkpoint
    after a bad step): an embedding, Adam's slots and the global step restored mid-training.
    The checkpoints go to $USER_GRAPHS_CHECKPOINTS."""
    inputs = _inputs()
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.05).minimize(
        _cross_entropy(inputs, _logits(inputs, "model")), global_step=global_step)
    step_after = _read_after(train_op, global_step)
    saver = tf.compat.v1.train.Saver()
    os.makedirs(os.environ["USER_GRAPHS_CHECKPOINTS"], exist_ok=True)
    prefix = os.path.join(os.environ["USER_GRAPHS_CHECKPOINTS"], "model")

    def loop(run, feed, is_chief):
        session = run.__self__  # the Session or the runner: what a Saver takes
        fetched = []
        for step in range(STEPS):
            feeds = feed(step)  # a worker late in this step is late to the restore too
            if step == STEPS // 2 and (is_chief or not RESTORE_IN_CHIEF_ONLY):
                saver.restore(session, path)
            fetched.append(run([train_op, step_after], feeds)[1])
            if step == STEPS // 4:
                path = saver.save(session, prefix, global_step=global_step)
        return fetched
    return inputs, loop


def gradient_norms():
    """Gradients logged beside the train op, as tutorials write it: compute_gradients, then
    apply_gradients, fetched with the global norm of the gradients and an embedding's
    gradient rows' l2_loss."""
    inputs = _inputs()
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    grads_and_vars = optimizer.compute_gradients(_cross_entropy(inputs, _logits(inputs, "model")))
    train_op = optimizer.apply_gradients(grads_and_vars)
    gradients = [gradient for gradient, _ in grads_and_vars]
    global_norm = tf.linalg.global_norm(gradients)
    embedding_rows = tf.nn.l2_loss(gradients[0].values)  # the embedding's: an IndexedSlices

    def loop(run, feed, is_chief):
        fetched = []
        for step in range(STEPS):
            fetched += run([train_op, global_norm, embedding_rows], feed(step))[1:]
        return fetched
    return inputs, loop


def references():
    """TF1 code with reference variables (use_resource=False, as tf.compat.v1 made them before
    resource variables): Adam's sparse update of a reference variable computes the variable's
    update from the result of a scatter_add into its slot."""
    inputs = _inputs()
    with tf.compat.v1.variable_scope("tf1", use_resource=False):
        loss = _cross_entropy(inputs, _logits(inputs, "model"))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=global_step)
    step_after = _read_after(train_op, global_step)

    def loop(run, feed, is_chief):
        return [run([train_op, step_after], feed(step))[1] for step in range(STEPS)]
    return inputs, loop


def ps_pins():
    """TensorFlow parameter-server code brought to Parallax as it was: the graph built under
    replica_device_setter, every variable pinned to '/job:ps' (its own servers' job name, and
    Parallax's), the rest to '/job:worker'; Momentum and a global step."""
    setter = tf.compat.v1.train.replica_device_setter(ps_tasks=2, worker_device="/job:worker")
    with tf.compat.v1.device(setter):
        inputs = _inputs()
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(
            _cross_entropy(inputs, _logits(inputs, "model")), global_step=global_step)
        step_after = _read_after(train_op, global_step)

    def loop(run, feed, is_chief):
        return [run([train_op, step_after], feed(step))[1] for step in range(STEPS)]
    return inputs, loop


def gradient_penalty():
    """A penalty on the dense weights' gradients added to the loss (double backprop): on one
    device those are the combined batch's gradients, and so is the gradient of the penalty."""
    inputs = _inputs()
    loss = _cross_entropy(inputs, _logits(inputs, "model"))
    dense = [v for v in tf.compat.v1.trainable_variables() if "/w" in v.op.name]
    penalty = tf.add_n([tf.reduce_sum(tf.square(g)) for g in tf.gradients(loss, dense)])
    train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss + 0.1 * penalty)
    penalty_after = _read_after(train_op, dense[0])

    def loop(run, feed, is_chief):
        return [run([train_op, penalty, penalty_after], feed(step))[1] for step in range(STEPS)]
    return inputs, loop


def metrics():
    """tf.compat.v1.metrics (local variables, their own initializer) updated beside the train
    op every step: an accuracy over the examples and a mean of the batch's loss."""
    inputs = _inputs()
    logits = _logits(inputs, "model")
    loss = _cross_entropy(inputs, logits)
    train_op = tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss)
    accuracy, accuracy_update = tf.compat.v1.metrics.accuracy(inputs["label"],
                                                              tf.argmax(logits, 1))
    mean_loss, mean_loss_update = tf.compat.v1.metrics.mean(loss)
    reset = tf.compat.v1.local_variables_initializer()

    def loop(run, feed, is_chief):
        run(reset)
        fetched = [run([train_op, accuracy_update, mean_loss_update], feed(step))[1:]
                   for step in range(STEPS)]
        return [value for pair in fetched for value in pair] + run([accuracy, mean_loss])
    return inputs, loop


def evaluation():
    """An evaluation loop between trainings, as TF1 scripts write it: the metrics' local
    variables reset, then only their update ops run over evaluation batches, the counts of
    examples read directly (an accuracy's, an AUC's, a precision's, a count by tf.shape)."""
    inputs = _inputs()
    logits = _logits(inputs, "model")
    train_op = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(_cross_entropy(inputs, logits))
    predictions = tf.argmax(logits, 1)
    metrics = [tf.compat.v1.metrics.accuracy(inputs["label"], predictions),
               tf.compat.v1.metrics.auc(tf.one_hot(inputs["label"], CLASSES),
                                        tf.nn.softmax(logits), num_thresholds=20),
               tf.compat.v1.metrics.precision(tf.equal(inputs["label"], 1),
                                              tf.equal(predictions, 1)),
               tf.compat.v1.metrics.mean(_cross_entropy(inputs, logits))]
    examples = tf.compat.v1.get_local_variable("examples", [], tf.float32,
                                               initializer=tf.zeros_initializer())
    updates = [update for _, update in metrics] + [
        examples.assign_add(tf.cast(tf.shape(inputs["x"])[0], tf.float32))]
    counts = [v for v in tf.compat.v1.local_variables() if v.op.name.endswith(
        ("count", "true_positives", "false_positives", "examples"))]
    reset = tf.compat.v1.local_variables_initializer()

    def loop(run, feed, is_chief):
        fetched = []
        for round_ in range(2):
            for step in range(STEPS // 2):
                run(train_op, feed(STEPS * round_ + step))
            run(reset)
            for step in range(3):
                run(updates, feed(1000 + step))
            fetched += run([value for value, _ in metrics]) + [c.sum() for c in run(counts)]
        return fetched
    return inputs, loop


def max_norm():
    """A max-norm constraint on the embedding's rows after each update, the step fetched as
    the value the assign returns (a read ordered after the assign)."""
    inputs = _inputs()
    loss = _cross_entropy(inputs, _logits(inputs, "model"))
    embedding = [v for v in tf.compat.v1.trainable_variables() if v.op.name.endswith("emb")][0]
    train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss)
    with tf.control_dependencies([train_op]):
        # read_value(): a reference variable's own read (TF1 behaviour) is made with it, not
        # ordered after the update, and may see the value before it, on one device too.
        constrained = embedding.assign(tf.clip_by_norm(embedding.read_value(), 1.0, axes=[1]))
    with tf.control_dependencies([constrained]):
        loss_after = tf.identity(loss)  # each worker's own: fetched, not compared

    def loop(run, feed, is_chief):
        return [run([constrained, loss_after], feed(step))[0].sum() for step in range(STEPS)]
    return inputs, loop


def cond():
    """Updates applied inside tf.cond, every other step of a step counter, the counter
    advanced after them."""
    inputs = _inputs()
    loss = _cross_entropy(inputs, _logits(inputs, "model"))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    grads_and_vars = optimizer.compute_gradients(loss)
    applied = tf.cond(tf.equal(global_step % 2, 0),
                      lambda: tf.group(optimizer.apply_gradients(grads_and_vars)), tf.no_op)
    with tf.control_dependencies([applied]):
        train_op = global_step.assign_add(1)

    step_after = _read_after(train_op, global_step)

    def loop(run, feed, is_chief):
        return [run([train_op, step_after], feed(step))[1] for step in range(STEPS)]
    return inputs, loop


def cond_split():
    """cond as HYBRID's refusal of it advises: one tf.cond applying the sparse gradients (of
    the variables on servers), another the dense ones, every third step, with Momentum's
    slots; the counter advanced after both."""
    inputs = _inputs()
    loss = _cross_entropy(inputs, _logits(inputs, "model"))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
    grads_and_vars = optimizer.compute_gradients(loss)
    applying = tf.equal(global_step % 3, 1)
    parts = ([(g, v) for g, v in grads_and_vars if isinstance(g, tf.IndexedSlices)],
             [(g, v) for g, v in grads_and_vars if not isinstance(g, tf.IndexedSlices)])
    applied = [tf.cond(applying, lambda part=part: tf.group(optimizer.apply_gradients(part)),
                       tf.no_op) for part in parts]
    with tf.control_dependencies(applied):
        train_op = global_step.assign_add(1)
    step_after = _read_after(train_op, global_step)

    def loop(run, feed, is_chief):
        return [run([train_op, step_after], feed(step))[1] for step in range(STEPS)]
    return inputs, loop


def batchnorm():
    """A CNN with batch normalization written with tf.nn.moments and assign_moving_average in
    UPDATE_OPS, the train op made to wait for them, as TF1 code does; an embedding beside it.
    Each worker normalizes its own batch unless sync_batch_norm: without it the workers agree
    with each other, not with one device."""
    def normalize(conv, scale, offset):
        mean, variance = tf.nn.moments(conv, axes=[0, 1, 2])
        return (tf.nn.batch_normalization(conv, mean, variance, offset, scale, 1e-3), mean,
                variance)
    return _batch_norm_cnn(normalize, with_embedding=True)


def fused_batchnorm(data_format="NHWC"):
    """Batch normalization as tf.compat.v1.layers and tf_keras build it on 4-D inputs: one
    fused kernel (FusedBatchNormV3, training mode), its batch mean and Bessel-corrected variance
    taken by moving averages in UPDATE_OPS; `data_format` NCHW puts the channels first."""
    def normalize(conv, scale, offset):
        if data_format == "NCHW":
            conv = tf.transpose(conv, [0, 3, 1, 2])
        return tf.compat.v1.nn.fused_batch_norm(conv, scale, offset, epsilon=1e-3,
                                                data_format=data_format, is_training=True)
    return _batch_norm_cnn(normalize, with_embedding=False)


def _batch_norm_cnn(normalize, with_embedding: bool):
    """A convolution, `normalize`d ((conv, scale, offset) -> (output, batch mean, batch
    variance)) with moving averages in UPDATE_OPS, and a dense layer (beside an embedding)."""
    inputs = _inputs()
    image = tf.reshape(tf.tile(inputs["x"], [1, FEATURES]), [-1, FEATURES, FEATURES, 1])
    kernel = tf.compat.v1.get_variable("conv", [3, 3, 1, 4], initializer=_initial([3, 3, 1, 4], 4))
    conv = tf.nn.conv2d(image, kernel, 1, "SAME")
    scale = tf.compat.v1.get_variable("gamma", [4], initializer=tf.compat.v1.ones_initializer())
    offset = tf.compat.v1.get_variable("beta", [4], initializer=tf.compat.v1.zeros_initializer())
    moving_mean = tf.compat.v1.get_variable("moving_mean", [4], trainable=False,
                                            initializer=tf.compat.v1.zeros_initializer())
    moving_variance = tf.compat.v1.get_variable("moving_variance", [4], trainable=False,
                                                initializer=tf.compat.v1.ones_initializer())
    normalized, mean, variance = normalize(conv, scale, offset)
    for update in (moving_averages.assign_moving_average(moving_mean, mean, 0.9),
                   moving_averages.assign_moving_average(moving_variance, variance, 0.9)):
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
    features = [tf.reshape(tf.tanh(normalized), [-1, FEATURES * FEATURES * 4])]
    if with_embedding:
        embedding = tf.compat.v1.get_variable("emb", [VOCAB, EMBED],
                                              initializer=_initial([VOCAB, EMBED], 1))
        features.append(tf.reduce_mean(tf.nn.embedding_lookup(embedding, inputs["ids"]), 1))
    width = FEATURES * FEATURES * 4 + (EMBED if with_embedding else 0)
    logits = tf.matmul(tf.concat(features, 1), tf.compat.v1.get_variable(
        "w2", [width, CLASSES], initializer=_initial([width, CLASSES], 3)))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
        train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
            _cross_entropy(inputs, logits), global_step=global_step)
    step_after = _read_after(train_op, global_step)

    def loop(run, feed, is_chief):
        return [run([train_op, step_after], feed(step))[1] for step in range(STEPS)]
    return inputs, loop


def rnn_loop():
    """A recurrent net written by hand in TF1 control flow, as seq2seq decoders were: each turn
    of a tf.compat.v1.while_loop looks up one time step's ids, so the table's rows are gathered
    inside the loop and its gradient (IndexedSlices) comes out of the loop's frames; RMSProp."""
    inputs = _inputs()
    control_flow_v2 = control_flow_util.ENABLE_CONTROL_FLOW_V2
    tf.compat.v1.disable_control_flow_v2()  # for this graph only (the tests build others)
    try:
        with tf.compat.v1.variable_scope("rnn"):
            embedding = tf.compat.v1.get_variable("emb", [VOCAB, EMBED],
                                                  initializer=_initial([VOCAB, EMBED], 1))
            recurrent = tf.compat.v1.get_variable("recurrent", [EMBED, EMBED],
                                                  initializer=_initial([EMBED, EMBED], 2))
            readout = tf.compat.v1.get_variable("readout", [EMBED, CLASSES],
                                                initializer=_initial([EMBED, CLASSES], 3))
        time_major = tf.transpose(inputs["ids"])

        def turn(t, state):
            looked_up = tf.nn.embedding_lookup(embedding, time_major[t])
            return t + 1, tf.tanh(looked_up + tf.matmul(state, recurrent))

        _, final = tf.compat.v1.while_loop(
            lambda t, _: t < IDS, turn,
            [tf.constant(0), tf.zeros([tf.shape(time_major)[1], EMBED])])
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.RMSPropOptimizer(0.05).minimize(
            _cross_entropy(inputs, tf.matmul(final, readout)), global_step=global_step)
    finally:
        if control_flow_v2:
            tf.compat.v1.enable_control_flow_v2()
    step_after = _read_after(train_op, global_step)

    def loop(run, feed, is_chief):
        return [run([train_op, step_after], feed(step))[1] for step in range(STEPS)]
    return inputs, loop


SHAPES = {"gan": gan, "accumulate": accumulate, "cifar10": cifar10, "summary": summary,
          "references": references, "cond": cond, "cond_split": cond_split, "schedule": schedule,
          "restore": restore,
          "gradient_norms": gradient_norms, "ps_pins": ps_pins,
          "gradient_penalty": gradient_penalty, "metrics": metrics, "max_norm": max_norm,
          "rnn_loop": rnn_loop, "evaluation": evaluation}
# Shapes whose workers agree with each other, but not with one device: see their docstrings.
PER_WORKER_SHAPES = {"batchnorm": batchnorm, "fused_batchnorm": fused_batchnorm,
                     "fused_batchnorm_nchw": lambda: fused_batchnorm("NCHW")}


def _build(shape):
    graph = tf.Graph()
    with graph.as_default():
        inputs, loop = {**SHAPES, **PER_WORKER_SHAPES}[shape]()
    return graph, inputs, loop


def _feeder(inputs, workers, worker, share=True, delay=0.0):
    """Feeds of a step: this worker's rows of the combined batch (all of them if not share).
    With a delay, the last worker sleeps up to that long before half of its runs, at random."""
    def feed(step):
        if delay and worker == workers - 1 and random.random() < 0.5:
            time.sleep(random.uniform(0, delay))
        combined = batch(step, BATCH_PER_WORKER * workers)
        rows = slice(worker, None, workers) if share else slice(None)
        return {inputs[key]: value[rows] for key, value in combined.items()}
    return feed


def _variables(graph, run):
    """Every variable, a metric's local ones too."""
    with graph.as_default():
        variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
    return dict(zip([v.op.name for v in variables], run(variables)))


def train_single_device(shape, workers, tf1=False):
    """Single-device training on the combined batch of `workers` workers (with `tf1`, after
    disable_v2_behavior(), as the job's --tf1-behaviour)."""
    with behaviour(tf1):
        graph, inputs, loop = _build(shape)
        for op in graph.get_operations():
            if op.device.startswith("/job:"):  # a parameter-server job's pins: none on one device
                op._set_device("")  # pylint: disable=protected-access
        with graph.as_default():
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(init)
            fetched = loop(session.run, _feeder(inputs, workers, 0, share=False), True)
            return _variables(graph, session.run), fetched


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", required=True, help="a shape, or several joined by commas: "
                        "one get_runner each in turn, their results in OUT/SHAPE/; "
                        "SHAPE@RUN_OPTION trains it in another run option than the job's "
                        "(results in OUT/SHAPE@RUN_OPTION/; the driver plans the first)")
    parser.add_argument("--resources", default="localhost:0,1")
    parser.add_argument("--run-option", default="AR")
    parser.add_argument("--out", required=True)
    parser.add_argument("--own-batch-norm", action="store_const", const=False,
                        dest="sync_batch_norm", help="sync_batch_norm=False (else the default)")
    parser.add_argument("--split-variables", action="store_true",
                        help="Config(split_variables=True): embeddings over every server")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="the last worker sleeps up to this long before half of its runs")
    parser.add_argument("--chief-restores", action="store_true",
                        help="the restore shape restores in the chief only")
    parser.add_argument("--monitored", action="store_true",
                        help="the loop through parallax.MonitoredTrainingSession and hooks "
                             "(shapes with a global step)")
    parser.add_argument("--tf1-behaviour", default="",
                        help="the shapes (commas; 'all') built after "
                             "tf.compat.v1.disable_v2_behavior(), as ported TF1 code")
    args = parser.parse_args()
    global RESTORE_IN_CHIEF_ONLY
    RESTORE_IN_CHIEF_ONLY = args.chief_restores
    parts = args.shape.split(",")
    unknown = {part.partition("@")[0] for part in parts} - {*SHAPES, *PER_WORKER_SHAPES}
    if unknown:
        parser.error(f"unknown shapes {sorted(unknown)}")
    tf1_parts = parts if args.tf1_behaviour == "all" else args.tf1_behaviour.split(",")
    tf.compat.v1.disable_eager_execution()
    for part in parts:
        shape, _, run_option = part.partition("@")
        config = parallax.Config(run_option=run_option or args.run_option,
                                 sync_batch_norm=args.sync_batch_norm,
                                 split_variables=True if args.split_variables else None)
        with behaviour(part in tf1_parts):
            _train(shape, args, config, os.path.join(args.out, part) if len(parts) > 1
                   else args.out)


def _train(shape, args, config, out):
    """The shape's graph trained by Parallax; each worker's fetches and variables in `out`."""
    graph, inputs, loop = _build(shape)
    if args.monitored:
        worker, fetched, values = _train_monitored(graph, inputs, loop, args, config, out)
    else:
        runner = parallax.get_runner(graph, args.resources, config)
        feed = _feeder(inputs, runner.num_workers, runner.worker_id, delay=args.delay)
        fetched = loop(runner.run, feed, runner.is_chief)
        values = _variables(graph, runner.run)
        worker = runner.worker_id
        runner.close()
    os.makedirs(out, exist_ok=True)
    print(f"{shape}: trained", flush=True)
    np.savez(os.path.join(out, f"worker{worker}.npz"), fetched=np.array(fetched),
             **{f"var/{name}": value for name, value in values.items()})


def _train_monitored(graph, inputs, loop, args, config, out):
    """The shape's loop through parallax.MonitoredTrainingSession with TensorFlow's hooks: the
    chief's checkpoint (in OUT/train) and summary savers and step counter, a NanTensorHook and
    a LoggingTensorHook everywhere. (worker id, fetched, variables)."""
    with graph.as_default():
        shard = _Shard()
        watched = tf.reduce_sum(tf.compat.v1.trainable_variables()[0])
        hooks = [tf.compat.v1.train.NanTensorHook(watched),
                 tf.compat.v1.train.LoggingTensorHook({"watched": watched}, every_n_iter=5),
                 shard]
        with parallax.MonitoredTrainingSession(
                args.resources, config, checkpoint_dir=os.path.join(out, "train"),
                save_checkpoint_steps=4, save_summaries_steps=3, log_step_count_steps=5,
                hooks=hooks) as session:
            # A monitored session initializes: its scripts run no initializer (the chief's
            # first run, with its first summary, is a training step).
            def run(fetches, *feeds):
                initializer = isinstance(fetches, tf.Operation) and fetches.name == "init"
                return None if initializer else session.run(fetches, *feeds)

            fetched = loop(run, _feeder(inputs, *shard.values, delay=args.delay),
                           shard.values[1] == 0)
    return shard.values[1], fetched, shard.variables


class _Shard(tf.compat.v1.train.SessionRunHook):
    """(workers, this worker's id), read as the session is created, and the variables at the
    end: runs of the monitored session would run the hooks too (the chief's summaries, which
    need the input fed)."""

    def __init__(self):
        self._tensors = parallax.num_shards_and_shard_id()
        self.values = self.variables = None

    def after_create_session(self, session, coord):
        self.values = tuple(int(value) for value in session.run(self._tensors))

    def end(self, session):
        self.variables = _variables(session.graph, session.run)


if __name__ == "__main__":
    main()
