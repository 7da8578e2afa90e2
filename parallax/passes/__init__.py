"""Transformation passes: each takes the graph (and the plan) and returns the graph rewritten
for one concern. `transform` composes them for the plan's run option."""
from __future__ import annotations

import tensorflow as tf

from parallax.passes.allreduce import allreduce_gradients, broadcast_initial_values
from parallax.plan import Plan

_PIPELINES = {
    "AR": (allreduce_gradients, broadcast_initial_values),
}


def transform(graph: tf.Graph, plan: Plan) -> tf.Graph:
    for graph_pass in _PIPELINES[plan.run_option]:
        graph = graph_pass(graph, plan)
    return graph
