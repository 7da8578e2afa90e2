"""Rewiring helpers shared by the passes. Each process edits its own copy of the graph in place,
before any session runs it."""
from __future__ import annotations

import json
from typing import Sequence

import tensorflow as tf

# What each recorded gradient tensor became after aggregation, so the session can hand the
# user the aggregated value when they fetch a gradient, as single-device training would.
AGGREGATED_COLLECTION = "parallax_aggregated"


def reroute(old: tf.Tensor, new: tf.Tensor, consumers: Sequence[tf.Operation]) -> None:
    """Make `consumers` (taken before `new` was built from `old`) read `new` instead of `old`."""
    for consumer in consumers:
        for index, tensor in enumerate(consumer.inputs):
            if tensor is old:
                consumer._update_input(index, new)  # pylint: disable=protected-access


def record_aggregated(source: tf.Tensor, aggregated: tf.Tensor) -> None:
    source.graph.add_to_collection(
        AGGREGATED_COLLECTION, json.dumps({"source": source.name, "aggregated": aggregated.name}))


def read_aggregated(graph: tf.Graph) -> dict:
    pairs = (json.loads(text) for text in graph.get_collection(AGGREGATED_COLLECTION))
    return {pair["source"]: pair["aggregated"] for pair in pairs}
