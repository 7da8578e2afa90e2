"""Synchronized batch normalization (Config(sync_batch_norm=True)): the statistics of a batch —
tf.nn.moments over the batch axis, as TF1 code and Keras's BatchNormalization compute them — are
those of the combined batch of every worker, so a batch-norm model trains as on one device.

Forward: the mean, then the variance around that mean, are allreduced sums over the allreduced
count of examples. Backward: autodiff differentiated each worker's loss through its own
statistics; the gradient flowing into each statistic (recorded at autodiff, capture.py) becomes
its mean over workers. A worker's examples reach every worker's loss through the shared
statistics, and that mean is the chain rule over all of them (each worker's loss being its share
of the combined one, whose gradients Parallax averages).
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf

from parallax import contracts
from parallax.rewriting.rewire import reroute
from parallax.planning.plan import Plan
from parallax.rewriting.passes import graph_pass


@graph_pass(produces=["batch statistics combined"],
            runs_if=lambda plan: plan.sync_batch_norm)
def synchronize_batch_statistics(graph: tf.Graph, plan: Plan) -> tf.Graph:
    incoming = contracts.read_statistic_gradients(graph)
    with graph.as_default(), tf.name_scope("parallax_sync_batch_norm"):
        for mean_name, variance_name in plan.batch_moments:
            for name in (mean_name, variance_name):
                statistic = graph.get_operation_by_name(name).outputs[0]
                _combine_batches(statistic)
                if name in incoming:
                    _average_over_workers(graph.get_tensor_by_name(incoming[name]))
    return graph


def _combine_batches(statistic: tf.Tensor) -> None:
    """A per-batch mean (over its op's reduced axes) becomes the mean over every worker's batch,
    weighted by the examples each reduced."""
    consumers = list(statistic.consumers())
    samples = statistic.op.inputs[0]
    with tf.device(statistic.op.device):
        count = tf.cast(tf.size(samples) // tf.maximum(tf.size(statistic), 1), statistic.dtype)
        total = hvd.allreduce(statistic * count, op=hvd.Sum)
        combined = total / hvd.allreduce(count, op=hvd.Sum)
    reroute(statistic, combined, consumers)


def _average_over_workers(gradient: tf.Tensor) -> None:
    consumers = list(gradient.consumers())
    with tf.device(gradient.op.device):
        averaged = hvd.allreduce(gradient, op=hvd.Average)
    reroute(gradient, averaged, consumers)
