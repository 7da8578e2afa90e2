"""Boundary placement for gathers (paper §5.3.2): a worker's lookup into a server's variable
asks for each row once. embedding_lookup gathers one row per id, repeated ids included, and
the rows cross machines as gathered; here the worker sends its ids' unique values, the server
gathers those rows, and the worker expands them to the lookup's result. With word ids, most
of a batch's ids repeat (a few words are most of the text). The result is the same tensor, and
the gradient (recorded from the original lookup) does not change."""
from __future__ import annotations

import tensorflow as tf

from parallax import tf_private
from parallax.rewriting.rewire import reroute
from parallax.planning.job_plan import Plan
from parallax.rewriting.passes import graph_pass, with_servers


@graph_pass(needs=["worker ops pinned"], produces=["unique rows gathered"],
            runs_if=lambda plan: (with_servers(plan)
                                  and plan.ps_config.boundary_between_workers_and_servers))
def gather_unique_rows(graph: tf.Graph, plan: Plan) -> tf.Graph:
    lookups = [op for op in graph.get_operations() if op.type == "ResourceGather"
               and op.device.startswith("/job:ps") and op.get_attr("batch_dims") == 0
               and op.inputs[1].op.device.startswith("/job:worker")]
    for lookup in lookups:
        rows, ids = lookup.outputs[0], lookup.inputs[1]
        consumers = list(rows.consumers())
        with graph.as_default(), tf_private.in_control_flow_context_of(lookup), \
                tf.name_scope(f"parallax_unique_rows/{lookup.name}"):
            with tf.device(ids.op.device):
                unique_ids, positions = tf.unique(tf.reshape(ids, [-1]))
            with tf.device(lookup.device):
                unique_rows = tf.raw_ops.ResourceGather(
                    resource=lookup.inputs[0], indices=unique_ids, dtype=rows.dtype,
                    validate_indices=lookup.get_attr("validate_indices"))
            with tf.device(ids.op.device):
                expanded = tf.reshape(tf.gather(unique_rows, positions), tf.concat(
                    [tf.shape(ids, out_type=tf.int64),
                     tf.shape(unique_rows, out_type=tf.int64)[1:]], axis=0))
        expanded.set_shape(rows.shape)
        reroute(rows, expanded, consumers)
    return graph
