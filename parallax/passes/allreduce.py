"""AllReduce pass: replicas stay identical by aggregating every gradient with Horovod.

Aggregation is inserted right after autodiff, so whatever the user does with a gradient
(clipping, scaling, the optimizer's update) sees the aggregate, as on a single device.
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf

from parallax.passes.rewire import record_aggregated, reroute
from parallax.plan import Plan, Sync

BROADCAST_COLLECTION = "parallax_broadcast"


def allreduce_gradients(graph: tf.Graph, plan: Plan) -> tf.Graph:
    """Dense gradients become their allreduce; sparse ones the allgather of their slices."""
    with graph.as_default(), tf.name_scope("parallax_allreduce"):
        for var_plan in plan.with_sync(Sync.ALLREDUCE, Sync.ALLGATHER):
            op = hvd.Average if var_plan.average else hvd.Sum
            for record in var_plan.variable.gradients:
                if record.is_sparse:
                    _aggregate_sparse(graph, record, op)
                else:
                    _aggregate_dense(graph, record, op)
    return graph


def _aggregate_dense(graph, record, op):
    grad = graph.get_tensor_by_name(record.dense)
    consumers = list(grad.consumers())
    with tf.device(grad.op.device):
        aggregated = hvd.allreduce(grad, op=op)
    reroute(grad, aggregated, consumers)
    record_aggregated(grad, aggregated)


def _aggregate_sparse(graph, record, op):
    values = graph.get_tensor_by_name(record.values)
    indices = graph.get_tensor_by_name(record.indices)
    dense_shape = (graph.get_tensor_by_name(record.dense_shape)
                   if record.dense_shape else None)
    consumers = {t: list(t.consumers()) for t in (values, indices)}
    with tf.device(values.op.device):
        aggregated = hvd.allreduce(tf.IndexedSlices(values, indices, dense_shape), op=op)
    for old, new in ((values, aggregated.values), (indices, aggregated.indices)):
        reroute(old, new, consumers[old])
        record_aggregated(old, new)


def average_worker_state(graph: tf.Graph, plan: Plan) -> tf.Graph:
    """State written from each worker's own data (a loss average, a batch's moving statistics)
    stays identical on every worker: each such write takes the mean over workers of the value
    it would write. For the moving averages TF writes, that is the average of the combined
    batch's values, as on one device. Runs before the passes that place ops."""
    with graph.as_default(), tf.name_scope("parallax_average_state"):
        for name in plan.averaged_writes:
            write = graph.get_operation_by_name(name)
            value = write.inputs[1]
            with tf.device(value.op.device):
                averaged = hvd.allreduce(value, op=hvd.Average)
            write._update_input(1, averaged)  # pylint: disable=protected-access
    return graph


def broadcast_initial_values(graph: tf.Graph, plan: Plan) -> tf.Graph:
    """Add the op that copies rank 0's initial values to every replica (run once after
    initialization): replicas must start identical to stay identical. Server-resident
    variables have a single copy and are left out."""
    if not plan.uses_horovod:
        return graph
    with graph.as_default(), tf.name_scope("parallax_broadcast"):
        variables = [v for v in tf.compat.v1.global_variables()
                     if plan.server_of(v.op.name) is None]
        graph.add_to_collection(BROADCAST_COLLECTION, hvd.broadcast_variables(variables, 0))
    return graph
