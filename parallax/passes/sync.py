"""Step synchronization pass: the updates of server-resident state run once per step, by the
chief, and no worker starts step k+1 before step k's updates are applied (paper §6).

The chief's step ends by putting one token per other worker into a queue on the first server,
after every server-side update and mirror write; each other worker's step ends by taking one
token, after pushing its gradients. In the other workers' graphs the server-side updates are
cut off from everything that ran them, the step token taking their place.
"""
from __future__ import annotations

import json

import tensorflow as tf

from parallax.passes.ps import MIRROR_ASSIGN_COLLECTION, MIRROR_READ_COLLECTION, PUSH_COLLECTION
from parallax.plan import Plan

STEP_COLLECTION = "parallax_step"  # {"op": a server-side update, "step_done": what replaces it}


def synchronize_steps(graph: tf.Graph, plan: Plan) -> tf.Graph:
    cluster = plan.cluster
    if not cluster.has_servers:
        return graph
    writes = [graph.get_operation_by_name(name) for name in plan.server_writes]
    others = cluster.num_workers - 1
    with graph.as_default(), tf.name_scope("parallax_sync"):
        with tf.device(cluster.server_device(0)):
            tokens = tf.queue.FIFOQueue(max(others, 1), [tf.int64], shapes=[[]],
                                        shared_name="parallax/step_tokens", name="step_tokens")
        if cluster.is_chief:
            released = tf.zeros([others], tf.int64)
            with tf.control_dependencies(writes + graph.get_collection(MIRROR_ASSIGN_COLLECTION)):
                step_done = tokens.enqueue_many(released) if others else tf.no_op()
            keep = _ancestors(writes) | set(writes)
        else:
            with tf.control_dependencies(graph.get_collection(PUSH_COLLECTION)):
                step_done = tokens.dequeue().op
            for read in graph.get_collection(MIRROR_READ_COLLECTION):
                read._add_control_input(step_done)  # pylint: disable=protected-access
            keep = set()
    for write in writes:
        for consumer in list(write._control_outputs):  # pylint: disable=protected-access
            if consumer not in keep and consumer is not step_done:
                _replace_control_input(consumer, write, step_done)
        graph.add_to_collection(STEP_COLLECTION,
                                json.dumps({"op": write.name, "step_done": step_done.name}))
    return graph


def _ancestors(ops) -> set:
    seen, stack = set(), list(ops)
    while stack:
        op = stack.pop()
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def _replace_control_input(op, old, new) -> None:
    kept = [c for c in op.control_inputs if c is not old and c is not new]
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    op._add_control_inputs(kept + [new])  # pylint: disable=protected-access
