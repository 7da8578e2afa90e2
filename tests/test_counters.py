"""Counts of the batch are summed over workers, per-step values averaged, and what Parallax
cannot tell is said (planning/counters.py): which of tf.compat.v1.metrics' writes, and of a
script's own counters, are which."""
import tensorflow as tf

import parallax
from parallax import driver
from parallax.config import PlanOptions
from parallax.cluster import Cluster
from parallax.planning.analysis import analyze
from parallax.planning.describe import describe
from parallax.planning.job_plan import make_plan


def _graph(batch=None):
    """A classifier trained beside tf.compat.v1.metrics and counters of its own; the name of
    each metric's scope says which writes one device's counts need summed."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, 5], name="x")
        y = tf.compat.v1.placeholder(tf.int64, [batch], name="y")
        rate = tf.compat.v1.placeholder(tf.float32, [], name="rate")
        w = tf.compat.v1.get_variable("w", [5, 3])
        logits = tf.matmul(x, w)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                             logits=logits))
        train = tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(loss)
        predicted = tf.argmax(logits, 1)
        metrics = tf.compat.v1.metrics
        updates = [
            metrics.accuracy(y, predicted, name="summed_accuracy")[1],
            metrics.auc(tf.one_hot(y, 3), tf.nn.softmax(logits), name="summed_auc")[1],
            metrics.precision(tf.equal(y, 1), tf.equal(predicted, 1), name="summed_precision")[1],
            metrics.mean_iou(y, predicted, 3, name="summed_iou")[1],
            metrics.recall_at_k(y, logits, 2, name="summed_recall")[1],
            metrics.mean(loss, name="averaged_loss")[1],
            metrics.mean(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits),
                         name="averaged_losses")[1],
            metrics.mean_tensor(tf.reduce_mean(logits, 0), name="averaged_tensor")[1]]
        with tf.compat.v1.variable_scope("summed_own"):
            examples = tf.compat.v1.get_local_variable("examples", [],
                                                       initializer=tf.zeros_initializer())
            updates.append(examples.assign_add(tf.cast(tf.shape(x)[0], tf.float32)))
        with tf.compat.v1.variable_scope("averaged_own"):
            rates = tf.compat.v1.get_local_variable("rates", [],
                                                    initializer=tf.zeros_initializer())
            updates.append(rates.assign_add(rate))  # a setting: every worker's alike
        with tf.compat.v1.variable_scope("averaged_batch_norm"):
            _, mean, _ = tf.compat.v1.nn.fused_batch_norm(tf.reshape(x, [-1, 1, 1, 5]),
                                                          tf.ones([5]), tf.zeros([5]))
            moving = tf.compat.v1.get_variable("moving_mean", [5], trainable=False)
            updates.append(moving.assign_sub(0.01 * (moving - mean)))
        with tf.compat.v1.variable_scope("unclear"):
            largest = tf.compat.v1.get_local_variable("largest", [],
                                                      initializer=tf.zeros_initializer())
            updates.append(largest.assign_add(tf.reduce_max(logits)))
        tf.group(train, *updates, name="train_op")
    return graph


def _written(graph, writes):
    return {graph.get_operation_by_name(w).inputs[0].op.name.split("/")[0] for w in writes}


def test_counts_of_the_batch_are_summed_and_per_step_values_averaged():
    for batch in (None, 8):  # the batch's size unknown, or fixed (a dataset's drop_remainder)
        graph = _graph(batch)
        analysis = analyze(graph)
        summed = _written(graph, analysis.summed_writes)
        assert summed == {"summed_accuracy", "summed_auc", "summed_precision", "summed_iou",
                          "summed_recall", "summed_own"}, batch
        averaged = _written(graph, analysis.averaged_writes)
        assert averaged == {"averaged_loss", "averaged_losses", "averaged_tensor",
                            "averaged_own", "averaged_batch_norm", "unclear"}, batch
        assert [variable for _, variable in analysis.unclear_counters] == ["unclear/largest"]


def test_the_plan_says_what_it_sums_and_the_driver_what_it_cannot_tell():
    graph = _graph()
    analysis = analyze(graph)
    plan = make_plan(analysis, PlanOptions(run_option="AR"), Cluster([0, 0, 1, 1]))
    assert plan.summed_writes == analysis.summed_writes and plan.uses_collectives
    said = describe(plan)
    assert ("counts of the batch, summed over workers as one device counts the combined "
            "batch: summed_accuracy/AssignAddVariableOp") in said
    (warning,) = driver.warnings(plan, analysis)
    assert warning.startswith("1 assign_add(s) add to 'unclear/largest' "
                              "('unclear/AssignAddVariableOp') a value of each worker's own "
                              "data") and "tf.reduce_sum" in warning
