"""AllReduce pass: replicas stay identical by aggregating every gradient over the workers.

Aggregation is inserted right after autodiff, so whatever the user does with a gradient
(clipping, scaling, the optimizer's update) sees the aggregate, as on a single device.
"""
from __future__ import annotations

import tensorflow as tf

from parallax import contracts
from parallax.collectives import Collectives
from parallax.rewriting import machine_allreduce, row_sums
from parallax.rewriting.rewire import reroute
from parallax.planning.rows import rows_unique_per_batch
from parallax.planning.job_plan import Plan, Sync
from parallax.vocabulary import consumers, walk
from parallax.rewriting.passes import graph_pass


@graph_pass(produces=["aggregated by allreduce"], collective=True)
def allreduce_gradients(graph: tf.Graph, plan: Plan, collectives: Collectives) -> tf.Graph:
    """Dense gradients become their allreduce; sparse ones the allgather of their slices, or
    (Sync.ALLREDUCE for a sparse variable: its gradients are nearly dense) the allreduce of
    their dense sum."""
    with graph.as_default(), tf.name_scope("parallax_allreduce"):
        dense = []
        for var_plan in plan.with_sync(Sync.ALLREDUCE, Sync.ALLGATHER):
            average = var_plan.average
            for record in var_plan.variable.gradients:
                if record.is_sparse and var_plan.sync is Sync.ALLREDUCE:
                    _aggregate_sparse_as_dense(graph, record, average, var_plan, plan,
                                               collectives)
                elif record.is_sparse:
                    _aggregate_sparse(graph, record, average, collectives)
                else:
                    dense.append((graph.get_tensor_by_name(record.dense), average))
        _aggregate_dense(dense, plan, collectives)
    return graph


def _allreduce(tensor, average: bool, plan: Plan, collectives: Collectives):
    if plan.hierarchical_allreduce:
        return collectives.as_one(
            lambda inside, inputs: [machine_allreduce.allreduce(inputs[0], average, inside)],
            [tensor])[0]
    return collectives.allreduce(tensor, average)


def _aggregate_dense(gradients, plan, collectives):
    """All dense gradients at once (the collectives may pack them), one call for the averaged
    ones and one for the summed; in machine stages, each in its stages."""
    consumers = {grad: list(grad.consumers()) for grad, _ in gradients}
    aggregates = {}
    for average in (True, False):
        grads = [grad for grad, averaged in gradients if averaged == average]
        if plan.hierarchical_allreduce:
            for grad in grads:
                with tf.device(grad.op.device):
                    aggregates[grad] = _allreduce(grad, average, plan, collectives)
        else:
            for independent in _rounds(grads):
                with tf.device(independent[0].op.device):  # a worker's one device
                    aggregates.update(zip(independent,
                                          collectives.allreduce_all(independent, average)))
    for grad, aggregated in aggregates.items():
        reroute(grad, aggregated, consumers[grad])
        contracts.record_aggregated(grad, aggregated)


def _rounds(gradients):
    """`gradients` in rounds none of whose gradients is computed after another's (a second
    loss's, differentiated after the first one's update): packed together, such two would wait
    for each other."""
    rounds, left = [], list(gradients)
    while left:
        after = set(walk([c for g in left for c in consumers(g.op)], consumers))
        first = [g for g in left if g.op not in after]
        if not first:  # behind a loop's back edge: each alone
            return rounds + [[g] for g in left]
        rounds.append(first)
        left = [g for g in left if g.op in after]
    return rounds


def _aggregate_sparse(graph, record, average, collectives):
    values = graph.get_tensor_by_name(record.values)
    indices = graph.get_tensor_by_name(record.indices)
    dense_shape = (graph.get_tensor_by_name(record.dense_shape)
                   if record.dense_shape else None)
    consumers = {t: list(t.consumers()) for t in (values, indices)}
    with tf.device(values.op.device):
        aggregated = collectives.allgather_slices(
            tf.IndexedSlices(values, indices, dense_shape), average)
        gathered = [aggregated.values, aggregated.indices]
        if rows_unique_per_batch(indices):
            gathered = row_sums.one_row_per_id(gathered)
    for old, new in zip((values, indices), gathered):
        reroute(old, new, consumers[old])
        contracts.record_aggregated(old, new)


def _aggregate_sparse_as_dense(graph, record, average, var_plan, plan, collectives):
    """The slices summed into the variable's shape, with a count of rows, are allreduced; the
    rows any worker touched come out as slices again, so that the optimizer updates those rows
    only, as its sparse update on one device does (Adam's slots of other rows do not decay).
    Summing rows of one id is only allowed where the model just adds them into the variable
    (rows_can_be_summed, checked when AUTO chose this); where the model takes the L2 norm of
    every row (clip_by_global_norm on one device), it travels in one more row. The counts
    join the rows after their sums, not before: concatenating the batch's rows first costs a
    worker CPU in every step (benchmarks/HISTORY.md: tags).
    A mean is taken as the dense gradients' is (Horovod fuses only allreduces of one reduce
    op: a sum beside them would be a second ring of its own each step). The counts are then
    means too, still > 0 exactly where a worker touched the row."""
    values = graph.get_tensor_by_name(record.values)
    indices = graph.get_tensor_by_name(record.indices)
    consumers = {t: list(t.consumers()) for t in (values, indices)}
    carries_norm = (not rows_unique_per_batch(indices)  # else the norm is of the summed rows
                    and any(op.type == "L2Loss" for op in consumers[values]))
    rows = var_plan.variable.shape[0]
    with tf.device(values.op.device):
        flat = tf.reshape(values, [tf.shape(values)[0], -1])
        counts = tf.math.unsorted_segment_sum(tf.ones_like(indices, dtype=values.dtype),
                                              indices, rows)
        packed = tf.concat([tf.math.unsorted_segment_sum(flat, indices, rows),
                            counts[:, None]], 1)
        if carries_norm:
            packed = tf.concat([packed, tf.concat([
                tf.zeros([1, tf.shape(flat)[1]], values.dtype),
                tf.reshape(row_sums.norm_share(values), [1, 1])], 1)], 0)
        reduced = _allreduce(packed, average, plan, collectives)  # each worker's rows over N
        touched = tf.where(reduced[:rows, -1] > 0)[:, 0]
        aggregated = tf.gather(reduced[:rows, :-1], touched)
        norm = reduced[rows, -1] if carries_norm else None
        if average and carries_norm:  # a norm of the mean: the sum's over N squared
            norm = norm / tf.cast(plan.cluster.num_workers, values.dtype)
        if values.shape[1:].is_fully_defined():  # [] for a table of scalars (a bias)
            new_values = tf.reshape(aggregated, [-1] + values.shape[1:].as_list())
        else:
            new_values = tf.reshape(aggregated, tf.concat([[-1], tf.shape(values)[1:]], 0))
        new_indices = tf.cast(touched, indices.dtype)
    for old, new in ((values, new_values), (indices, new_indices)):
        reroute(old, new, consumers[old])
        contracts.record_aggregated(old, new)
    if carries_norm:
        row_sums.use_carried_norm(consumers[values], norm, trigger=new_values.op)


@graph_pass(produces=["per-worker state combined"], collective=True)
def combine_worker_state(graph: tf.Graph, plan: Plan, collectives: Collectives) -> tf.Graph:
    """State written from each worker's own data (a loss average, a batch's moving statistics,
    a metric's counts) stays identical on every worker and equal to one device's: each such
    write takes the sum over workers of the value it would add where that is a count of the
    batch (planning/counters.py: the combined batch's count), else their mean (for the moving
    averages TF writes, the average of the combined batch's values, as on one device). Runs
    before the passes that place ops."""
    with graph.as_default(), tf.name_scope("parallax_combine_state"):
        for names, average in ((plan.averaged_writes, True), (plan.summed_writes, False)):
            for name in names:
                write = graph.get_operation_by_name(name)
                value = write.inputs[1]
                with tf.device(value.op.device):
                    combined = collectives.allreduce(value, average)
                reroute(value, combined, [write])
    return graph


@graph_pass(produces=["replicas start alike"],
            runs_if=lambda plan: plan.uses_collectives, collective=True)
def broadcast_initial_values(graph: tf.Graph, plan: Plan, collectives: Collectives
                             ) -> tf.Graph:
    """Add the op that copies rank 0's initial values to every replica (run once after
    initialization): replicas must start identical to stay identical. Server-resident
    variables have a single copy and are left out."""
    with graph.as_default(), tf.name_scope("parallax_broadcast"):
        variables = [v for v in tf.compat.v1.global_variables()
                     if plan.server_of(v.op.name) is None]
        contracts.record_broadcast(graph, collectives.broadcast_variables(variables))
    return graph
