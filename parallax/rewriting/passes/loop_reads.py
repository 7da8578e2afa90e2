"""Variables read inside a loop are copied to the worker once a step (PS path). A while loop
(a Keras LSTM, say) takes a variable's handle and reads it in its body: with the variable on a
server, every iteration would fetch it again across machines — 20 time steps, 20 copies of the
LSTM's kernels. The loop reads a copy on the worker instead, refreshed from the server before
the loop runs each step; nothing writes the variable during the forward and backward pass, so
the values are the same."""
from __future__ import annotations

import tensorflow as tf

from parallax import tf_private
from parallax.planning.job_plan import Plan
from parallax.rewriting.rewire import reroute
from parallax.rewriting.passes import graph_pass, with_servers

LOOPS = frozenset({"While", "StatelessWhile"})  # a function called once (If, a call) reads once


@graph_pass(needs=["worker ops pinned"], produces=["loop reads on the worker"],
            runs_if=with_servers)
def copy_loop_reads_to_worker(graph: tf.Graph, plan: Plan) -> tf.Graph:
    copies = {}  # server variable handle op -> (copy's handle, refresh op)
    for op in graph.get_operations():
        if op.type not in LOOPS or not op.device.startswith("/job:worker"):
            continue
        for tensor in op.inputs:
            handle = tensor.op
            if handle.type != "VarHandleOp" or not handle.device.startswith("/job:ps"):
                continue
            if handle not in copies:
                copies[handle] = _worker_copy(graph, handle, op.device)
            copy_handle, refresh = copies[handle]
            reroute(tensor, copy_handle, [op])
            tf_private.add_control_inputs(op, [refresh])
    return graph


def _worker_copy(graph, handle, device):
    dtype = handle.get_attr("dtype")
    with graph.as_default(), tf.name_scope("parallax_loop_reads"):
        with tf.device(handle.device):
            value = tf.raw_ops.ReadVariableOp(resource=handle.outputs[0], dtype=dtype)
        with tf.device(device):
            copy = tf.compat.v1.Variable(
                tf.zeros(handle.get_attr("shape"), dtype), trainable=False, use_resource=True,
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                name=handle.name.replace("/", "_"))
            refresh = copy.assign(value, read_value=False)
    return copy.handle, refresh
