"""Placement of the ops between aggregated gradients and updates (paper §5.3.2).

Walking from the aggregates towards the updates, an op whose inputs (from that region) all come
from one process runs in that process; an op with inputs from several processes is shared and
runs on the first server; an op with shared inputs and inputs from one process runs with the
latter, and so does one whose only inputs that are not scalars come from one process.
clip_by_global_norm thus computes each norm beside its gradient, the global norm on the first
server, and each clip beside its gradient.
"""
from __future__ import annotations

import tensorflow as tf

from parallax import contracts, tf_private
from parallax.vocabulary import VARIABLE_OP_TYPES, computed_from, data_consumers, walk
from parallax.planning.job_plan import Plan
from parallax.rewriting.passes import graph_pass, with_servers


@graph_pass(needs=["aggregated on servers", "worker ops pinned"],
            produces=["post-aggregation ops placed"],
            runs_if=lambda plan: with_servers(plan) and plan.ps_config.post_aggregation_placement)
def place_post_aggregation_ops(graph: tf.Graph, plan: Plan) -> tf.Graph:
    starts = {graph.get_tensor_by_name(name).op
              for name in contracts.read_aggregated(graph).values()}
    # The writes of optimizer slots count as updates: Adam's sparse update reaches the
    # variable from the gradient only through its slots (scatter into m, then read m).
    updates = {graph.get_operation_by_name(name) for name in plan.server_writes}
    updates |= {graph.get_operation_by_name(name) for var_plan in plan.variables.values()
                for name in var_plan.variable.update_ops}
    region = _between(starts, updates)
    shared = set()
    for op in _topological(region):
        if any(t.op.type in VARIABLE_OP_TYPES for t in op.inputs):
            continue  # reads and writes of a variable stay with it
        inputs = [t for t in op.inputs if t.op in region or t.op in starts]
        producers = [t.op for t in inputs]
        local = {_process(t.op) for t in inputs if t.op not in shared}
        # Scalars (a global norm, a clip factor) move for nothing: an op computing on one
        # process's rows runs there, whichever process computed its scalars.
        rows = {_process(t.op) for t in inputs if t.op not in shared and t.shape.rank != 0}
        if len(local) > 1 and len(rows) == 1:
            local = rows
        if len(local) == 1:
            target = next(iter(local))
        else:
            target = ("ps", 0)
            if producers:
                shared.add(op)
        tf_private.set_device(op, _device(op, target, plan))
    return graph


def _process(op):
    spec = tf.DeviceSpec.from_string(op.device or "")
    return spec.job, spec.task


def _device(op, process, plan):
    job, task = process
    if job == "ps":
        return plan.cluster.server_device(task)
    return tf.DeviceSpec.from_string(op.device or "").replace(job=job, task=task).to_string()


def _between(starts, ends) -> set:
    """Ops on a data path from `starts` to `ends`, both excluded."""
    downstream = set(computed_from([c for op in starts for c in data_consumers(op)], ends))

    def before(op):
        return [t.op for t in op.inputs if t.op in downstream]

    return set(walk([p for op in ends for p in before(op)], before))


def _topological(ops):
    ordered, placed = [], set()
    pending = sorted(ops, key=tf_private.creation_index)
    while pending:
        remaining = []
        for op in pending:
            if all(t.op not in ops or t.op in placed for t in op.inputs):
                ordered.append(op)
                placed.add(op)
            else:
                remaining.append(op)
        if len(remaining) == len(pending):
            raise RuntimeError("cycle among post-aggregation ops")
        pending = remaining
    return ordered
