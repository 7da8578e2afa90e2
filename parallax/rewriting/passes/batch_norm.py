"""Synchronized batch normalization (Config.sync_batch_norm, on unless False): the statistics of
a batch — tf.nn.moments over the batch axis, as TF1 code and Keras's BatchNormalization compute
them — are those of the combined batch of every worker, so a batch-norm model trains as on one
device.

Forward: the mean, then the variance around that mean, are allreduced sums over the allreduced
count of examples. Backward: autodiff differentiated each worker's loss through its own
statistics; the gradient flowing into each statistic (recorded at autodiff, capture.py) becomes
its mean over workers. A worker's examples reach every worker's loss through the shared
statistics, and that mean is the chain rule over all of them (each worker's loss being its share
of the combined one, whose gradients Parallax averages).

A fused batch norm (FusedBatchNorm*, training mode: tf.compat.v1.layers' and tf_keras's on 4-D
inputs) computes its statistics inside one kernel: its outputs and its gradient op's are
replaced by the same computation written out, over the combined batch, with one collective
each way (each is a wait for every worker, in sequence from layer to layer). Forward: y, and
the batch mean and variance the moving averages take (Bessel's correction on the combined
count, and the kernel's exponential_avg_factor), from every worker's count, mean and mean of
squares, as Horovod's own SyncBatchNormalization combines them. Backward, for N examples in all and x^ the
normalized input: dx = scale / std * (dy - sum(dy) / N - x^ * sum(dy * x^) / N), the sums over every
worker (each worker's dy being its share of the combined loss's, times the number of workers);
the gradients of scale and offset are this worker's sums, which Parallax averages.
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from parallax import contracts
from parallax.collectives import Collectives
from parallax.rewriting.rewire import reroute
from parallax.planning.job_plan import Plan
from parallax.rewriting.passes import graph_pass


@graph_pass(produces=["batch statistics combined"],
            runs_if=lambda plan: plan.sync_batch_norm, collective=True)
def synchronize_batch_statistics(graph: tf.Graph, plan: Plan, collectives: Collectives
                                 ) -> tf.Graph:
    incoming = contracts.read_statistic_gradients(graph)
    with graph.as_default(), tf.name_scope("parallax_sync_batch_norm"):
        for mean_name, variance_name in plan.batch_moments:
            for name in (mean_name, variance_name):
                statistic = graph.get_operation_by_name(name).outputs[0]
                _combine_batches(statistic, collectives)
                if name in incoming:
                    _average_over_workers(graph.get_tensor_by_name(incoming[name]), collectives)
        gradients = {op.inputs[3].op.name: op for op in graph.get_operations()
                     if op.type.startswith("FusedBatchNormGrad")}
        for name in plan.fused_batch_norms:
            _combine_fused(graph.get_operation_by_name(name), gradients.get(name), collectives)
    return graph


def _combine_batches(statistic: tf.Tensor, collectives: Collectives) -> None:
    """A per-batch mean (over its op's reduced axes) becomes the mean over every worker's batch,
    weighted by the examples each reduced."""
    consumers = list(statistic.consumers())
    samples = statistic.op.inputs[0]
    with tf.device(statistic.op.device):
        count = tf.cast(tf.size(samples) // tf.maximum(tf.size(statistic), 1), statistic.dtype)
        total = collectives.allreduce(statistic * count, average=False)
        combined = total / collectives.allreduce(count, average=False)
    reroute(statistic, combined, consumers)


def _average_over_workers(gradient: tf.Tensor, collectives: Collectives) -> None:
    consumers = list(gradient.consumers())
    with tf.device(gradient.op.device):
        averaged = collectives.allreduce(gradient, average=True)
    reroute(gradient, averaged, consumers)


def _combine_fused(op: tf.Operation, gradient: Optional[tf.Operation],
                   collectives: Collectives) -> None:
    """`op`, a fused batch norm in training mode, and its gradient op, over the combined
    batch (see above)."""
    x, scale, offset = op.inputs[:3]
    channels_first = op.get_attr("data_format") in (b"NCHW", "NCHW")
    axes = [0, 2, 3] if channels_first else [0, 1, 2]
    shape = [1, -1, 1, 1] if channels_first else [1, 1, 1, -1]

    def per_channel(vector):
        return tf.reshape(vector, shape)

    with tf.device(op.device):
        inputs = tf.cast(x, scale.dtype)  # a half-precision input has float32 statistics
        channels = tf.size(scale)
        mine = tf.cast(tf.size(inputs) // channels, scale.dtype)
        # One collective a step: this worker's count, and its sums of x and x^2 from its own
        # mean and variance (two passes over its batch, as accurate as one device's).
        own_mean = tf.reduce_mean(inputs, axes)
        own_variance = tf.reduce_mean(tf.square(inputs - per_channel(own_mean)), axes)
        totals = collectives.allreduce(tf.concat([mine * own_mean,
                                                  mine * (own_variance + tf.square(own_mean)),
                                                  [mine]], 0), average=False)
        count = totals[-1]
        mean = totals[:channels] / count
        variance = tf.maximum(totals[channels:2 * channels] / count - tf.square(mean), 0.0)
        centered = inputs - per_channel(mean)
        inverse_std = tf.math.rsqrt(variance + op.get_attr("epsilon"))
        normalized = centered * per_channel(inverse_std)
        outputs = [tf.cast(normalized * per_channel(scale) + per_channel(offset), x.dtype),
                   mean, variance * count / tf.maximum(count - 1, 1)]
        factor = op.get_attr("exponential_avg_factor") if "exponential_avg_factor" in \
            op.node_def.attr else 1.0
        if factor != 1.0:  # the kernel's own moving average of its running statistics
            outputs[1:] = [(1 - factor) * running + factor * batch
                           for running, batch in zip(op.inputs[3:5], outputs[1:])]
    for old, new in zip(op.outputs, outputs):
        reroute(old, new, list(old.consumers()))
    if gradient is None:
        return
    with tf.device(gradient.device):
        dy = tf.cast(gradient.inputs[0], scale.dtype)
        dy_sum = tf.reduce_sum(dy, axes)
        dy_normalized_sum = tf.reduce_sum(dy * normalized, axes)
        sums = collectives.allreduce(tf.concat([dy_sum, dy_normalized_sum], 0), average=False)
        dx = per_channel(scale * inverse_std) * (
            dy - per_channel(sums[:channels]) / count
            - normalized * per_channel(sums[channels:]) / count)
        gradients = [tf.cast(dx, x.dtype), dy_normalized_sum, dy_sum]
    for old, new in zip(gradient.outputs, gradients):
        reroute(old, new, list(old.consumers()))
