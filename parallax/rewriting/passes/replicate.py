"""Replicate pass: this process's graph is one replica, so what is not on a server runs on this
worker's task.

Between-graph replication: every worker builds and rewrites its own copy of the graph, so the
forward and backward computation is replicated by construction; this pass only names the task.
It runs after the passes that put state on servers: an op that uses a server's resource (a queue,
a variable) goes with it, unless it only passes the resource to a function (a while loop), and
a user's own pin ('/gpu:0') is kept within the worker.
"""
from __future__ import annotations

import tensorflow as tf

from parallax import tf_private
from parallax.vocabulary import FUNCTION_CALL_OPS
from parallax.planning.job_plan import Plan
from parallax.rewriting.passes import graph_pass, on_grpc_servers


@graph_pass(needs=["server variables placed", "per-worker state combined"],
            produces=["worker ops pinned"], runs_if=on_grpc_servers)
def pin_to_worker(graph: tf.Graph, plan: Plan) -> tf.Graph:
    for op in graph.get_operations():
        spec = tf.DeviceSpec.from_string(op.device or "")
        if spec.job == "ps":
            continue
        on_server = [t.op.device for t in op.inputs if op.type not in FUNCTION_CALL_OPS
                     and (t.dtype == tf.resource or t.dtype != t.dtype.base_dtype)  # a ref
                     and t.op.device.startswith("/job:ps")]
        device = on_server[0] if on_server else spec.replace(
            job="worker", task=plan.cluster.worker_id).to_string()
        tf_private.set_device(op, device)
    return graph


@graph_pass(needs=["server variables placed"], produces=["runner state separate"],
            runs_if=on_grpc_servers)
def separate_runner_state(graph: tf.Graph, plan: Plan) -> tf.Graph:
    """The state of each get_runner call of a process in its own container. Servers (and a
    worker's own gRPC server) outlive a session, so a second runner (another graph, the next
    configuration) would otherwise find the first one's variables and queues under the same
    names, already initialized."""
    container = tf.compat.v1.AttrValue(s=f"parallax.run{plan.run_index}".encode())
    for op in graph.get_operations():
        if "container" in op.node_def.attr:
            tf_private.set_attr(op, "container", container)
    return graph
