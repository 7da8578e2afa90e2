"""Boundary placement (paper §5.3.2, 'operation placement between servers and workers'): after
the initial placement, a light op at the edge between a server and a worker — slice, gather,
cast, reshape and the like, never heavy compute — moves to the other side when that lowers the
bytes crossing machines: a slice of a server's variable is cut on the server, a cast to half
precision is done before sending."""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from parallax import tf_private
from parallax.planning.job_plan import Plan
from parallax.rewriting.passes import graph_pass, with_servers

LIGHT_OPS = frozenset({
    "Cast", "Slice", "StridedSlice", "GatherV2", "Gather", "Reshape", "Squeeze", "ExpandDims",
    "Identity", "Transpose", "Bitcast"})


@graph_pass(needs=["worker ops pinned"], produces=["boundary ops placed"],
            runs_if=lambda plan: (with_servers(plan)
                                  and plan.ps_config.boundary_between_workers_and_servers))
def place_boundary_ops(graph: tf.Graph, plan: Plan) -> tf.Graph:
    moved = True
    while moved:  # a chain of light ops (read -> slice -> cast) moves one op at a time
        moved = False
        for op in graph.get_operations():
            target = _better_side(op, plan)
            if target is not None:
                tf_private.set_device(op, target)
                moved = True
    return graph


def _better_side(op, plan: Plan) -> Optional[str]:
    """The device of `op`'s inputs when moving it there sends fewer bytes between machines."""
    if op.type not in LIGHT_OPS or not op.outputs:
        return None
    here = machine_of(op.device, plan)
    data = [t for t in op.inputs if t.op.type != "Const"]  # constants can be on either side
    sources = {t.op.device for t in data}
    consumers = {c for out in op.outputs for c in out.consumers()}
    if len(sources) != 1 or not consumers:
        return None
    (source,) = sources
    if machine_of(source, plan) == here or any(machine_of(c.device, plan) != here
                                               for c in consumers):
        return None
    sent_now = sum(tensor_bytes(t) or 0 for t in data)
    sent_after = sum(tensor_bytes(t) for t in op.outputs) if all(
        tensor_bytes(t) is not None for t in op.outputs) else None
    if sent_after is None or not sent_now or sent_after >= sent_now:
        return None
    return source


def machine_of(device: str, plan: Plan) -> Optional[int]:
    spec = tf.DeviceSpec.from_string(device or "")
    if spec.job == "ps":
        return spec.task
    if spec.job == "worker":
        return plan.cluster.worker_machines[spec.task]
    return None


def tensor_bytes(tensor: tf.Tensor) -> Optional[int]:
    if not tensor.shape.is_fully_defined() or tensor.dtype in (tf.resource, tf.variant):
        return None
    return tensor.shape.num_elements() * tensor.dtype.base_dtype.size
