"""The pipeline of passes: `transform` composes them for the plan's run option; HYBRID is the
AllReduce passes over the dense variables and the PS passes over the sparse ones, each pass
handling the variables the plan gives its kind of synchronization. Before it runs them it checks
their order against what each declares it needs and produces (passes/__init__.py)."""
from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from parallax.collectives import Collectives
from parallax.collectives import create as create_collectives
from parallax.errors import ParallaxError
from parallax.planning.job_plan import Plan
from parallax.rewriting.passes import Pass
from parallax.rewriting.passes.allreduce import (allreduce_gradients, combine_worker_state,
                                                 broadcast_initial_values)
from parallax.rewriting.passes.batch_norm import synchronize_batch_statistics
from parallax.rewriting.passes.boundary import place_boundary_ops
from parallax.rewriting.passes.dense_shapes import free_constant_dense_shapes
from parallax.rewriting.passes.dynamic_tables import give_rows_on_servers
from parallax.rewriting.passes.defer_server_work import defer_gradient_free_server_work
from parallax.rewriting.passes.loop_reads import copy_loop_reads_to_worker
from parallax.rewriting.passes.loss_denominators import combine_loss_denominators
from parallax.rewriting.passes.placement import place_post_aggregation_ops
from parallax.rewriting.passes.ps import (aggregate_on_servers, mark_servers_ready,
                                          place_variables_on_servers)
from parallax.rewriting.passes.replicate import pin_to_worker, separate_runner_state
from parallax.rewriting.passes.sync import synchronize_steps
from parallax.rewriting.passes.unique_rows import gather_unique_rows

# Every mode may keep replicas (in PS mode: state written from each worker's own data).
_REPLICAS = (free_constant_dense_shapes, synchronize_batch_statistics, combine_loss_denominators,
             combine_worker_state, broadcast_initial_values)
_PS = (place_variables_on_servers, aggregate_on_servers, pin_to_worker,
       copy_loop_reads_to_worker, place_post_aggregation_ops, place_boundary_ops,
       gather_unique_rows, defer_gradient_free_server_work, synchronize_steps,
       give_rows_on_servers, separate_runner_state)
# Config(sync=False): each worker applies its own gradients to the servers' variables, as they
# arrive; no aggregation, no steps to synchronize.
_PS_ASYNC = (place_variables_on_servers, mark_servers_ready, pin_to_worker,
             copy_loop_reads_to_worker, place_boundary_ops, gather_unique_rows,
             give_rows_on_servers, separate_runner_state)
# Where the sessions run on the worker's own gRPC server (TensorFlow's collectives), replicas
# are pinned to it and each runner's state kept apart, as beside servers.
_OWN_SERVER = (place_variables_on_servers, pin_to_worker, separate_runner_state)
_PIPELINES = {
    "AR": (allreduce_gradients,) + _REPLICAS + _OWN_SERVER,
    "PS": _REPLICAS + _PS,
    "HYBRID": (allreduce_gradients,) + _REPLICAS + _PS,
}
_ASYNC_PIPELINES = {
    "PS": _REPLICAS + _PS_ASYNC,
    "HYBRID": (allreduce_gradients,) + _REPLICAS + _PS_ASYNC,
}


def transform(graph: tf.Graph, plan: Plan, collectives: Optional[Collectives] = None
              ) -> tf.Graph:
    """`graph` rewritten for `plan`, its collective ops built by `collectives` (the worker's;
    a new, unjoined one of the plan's cluster where none is given)."""
    passes = (_ASYNC_PIPELINES if plan.asynchronous else _PIPELINES)[plan.run_option]
    check_order(passes)
    if collectives is not None:
        collectives = collectives.for_steps()
    for graph_pass in passes:
        if not graph_pass.declaration.runs_if(plan):
            continue
        if graph_pass.declaration.collective:
            collectives = collectives or create_collectives(plan.cluster, server=None).for_steps()
            graph = graph_pass(graph, plan, collectives)
        else:
            graph = graph_pass(graph, plan)
    return graph


def check_order(passes: Sequence[Pass]) -> None:
    """Raise, naming the pass, where one needs a fact that no pass before it produces."""
    produced = set()
    for graph_pass in passes:
        missing = sorted(graph_pass.declaration.needs - produced)
        if missing:
            raise ParallaxError(
                f"pass {graph_pass.__name__} needs {missing}, which no pass before it produces "
                f"(pipeline: {', '.join(p.__name__ for p in passes)})")
        produced |= graph_pass.declaration.produces
