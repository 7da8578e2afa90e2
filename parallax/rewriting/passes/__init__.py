"""The passes: each a function from a graph and the plan to the graph rewritten for one
concern, declared with `graph_pass`: the facts about the graph it needs earlier passes to have
established, those it establishes, which plans it applies to, and whether it builds collective
ops (then it takes the worker's `Collectives` too). The pipeline
(parallax/rewriting/pipeline.py) checks the order from the declarations and runs the passes."""
from __future__ import annotations

import dataclasses
from typing import Callable, FrozenSet, Iterable

import tensorflow as tf

from parallax import collectives
from parallax.planning.job_plan import Plan

Pass = Callable[[tf.Graph, Plan], tf.Graph]


@dataclasses.dataclass(frozen=True)
class Declaration:
    needs: FrozenSet[str]  # facts a pass before it must produce
    produces: FrozenSet[str]  # facts true of the graph once it ran (or was not needed)
    runs_if: Callable[[Plan], bool]  # the plans it rewrites for; the others skip it
    collective: bool  # called as pass(graph, plan, collectives)


def graph_pass(needs: Iterable[str] = (), produces: Iterable[str] = (),
               runs_if: Callable[[Plan], bool] = lambda plan: True, collective: bool = False):
    """Declare a pass (a decorator). A pass skipped by `runs_if` still counts as producing its
    facts: the plan needed nothing of it."""
    def declare(function: Pass) -> Pass:
        function.declaration = Declaration(frozenset(needs), frozenset(produces), runs_if,
                                           collective)
        return function
    return declare


def with_servers(plan: Plan) -> bool:
    return plan.cluster.has_servers


def on_grpc_servers(plan: Plan) -> bool:
    """Whether the runner's session runs on gRPC servers (worker._runner): a plan with
    variables on parameter servers, or any plan of TensorFlow's collectives (on the worker's own
    server). State there outlives a session. (An AR plan AUTO times in a job with servers runs
    in a session of its process, under Horovod.)"""
    return ((plan.cluster.has_servers and plan.run_option in ("PS", "HYBRID"))
            or collectives.choose(plan.cluster.collectives) == "tensorflow")
