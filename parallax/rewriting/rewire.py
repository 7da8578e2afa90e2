"""Rewiring helpers shared by the passes. Each process edits its own copy of the graph in place,
before any session runs it."""
from __future__ import annotations

import json
from typing import Sequence

import tensorflow as tf

from parallax import tf_private

# What each recorded gradient tensor became after aggregation, so the session can hand the
# user the aggregated value when they fetch a gradient, as single-device training would.
AGGREGATED_COLLECTION = "parallax_aggregated"


def reroute(old: tf.Tensor, new: tf.Tensor, consumers: Sequence[tf.Operation]) -> None:
    """Make `consumers` (taken before `new` was built from `old`) read `new` instead of `old`."""
    for consumer in consumers:
        for index, tensor in enumerate(consumer.inputs):
            if tensor is old:
                tf_private.update_input(consumer, index, new)


def record_aggregated(source: tf.Tensor, aggregated: tf.Tensor, trigger: tf.Operation = None,
                      on_server: bool = False) -> None:
    """Note that `aggregated` is what `source` became. `trigger` is the op whose run makes this
    worker take part in the aggregation (its push, when the aggregate is read from elsewhere);
    by default the aggregate's own op. `on_server`: aggregated on a parameter server, where the
    chief's release of the step tells the other workers it is there."""
    source.graph.add_to_collection(AGGREGATED_COLLECTION, json.dumps({
        "source": source.name, "aggregated": aggregated.name,
        "trigger": (trigger or aggregated.op).name, "on_server": on_server}))


def read_aggregated(graph: tf.Graph) -> dict:
    """Recorded gradient tensor name -> the name of its aggregate."""
    return {pair["source"]: pair["aggregated"] for pair in _records(graph)}


def read_triggers(graph: tf.Graph) -> dict:
    """Aggregate tensor name -> the op whose run makes this worker take part in it."""
    return {pair["aggregated"]: pair["trigger"] for pair in _records(graph)}


def read_server_aggregates(graph: tf.Graph) -> set:
    """Names of the aggregate tensors that come from a parameter server."""
    return {pair["aggregated"] for pair in _records(graph) if pair["on_server"]}


def _records(graph):
    return (json.loads(text) for text in graph.get_collection(AGGREGATED_COLLECTION))
