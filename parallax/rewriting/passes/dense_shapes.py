"""A sparse gradient's dense shape is its variable's shape: when TF makes it a constant inside a
`tf.control_dependencies` block (gradients computed after a loss-averaging op, as the CIFAR-10
tutorial does), the constant is freed of those control inputs. Reading the last aggregated
gradient for monitoring (steps.py) then runs nothing the gradients were ordered after."""
from __future__ import annotations

import tensorflow as tf

from parallax import tf_private
from parallax.planning.job_plan import Plan
from parallax.rewriting.passes import graph_pass


@graph_pass(produces=["dense shapes free of control inputs"])
def free_constant_dense_shapes(graph: tf.Graph, plan: Plan) -> tf.Graph:
    for var_plan in plan.variables.values():
        for record in var_plan.variable.gradients:
            if record.dense_shape:
                op = graph.get_tensor_by_name(record.dense_shape).op
                if op.type == "Const" and op.control_inputs:
                    tf_private.set_control_inputs(op, [])
    return graph
