"""Rewiring helpers shared by the passes. Each process edits its own copy of the graph in place,
before any session runs it. What a pass records of its rewiring for the passes after it and the
runtime (an aggregate, say) goes through parallax/contracts.py."""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from parallax import tf_private


def reroute(old: tf.Tensor, new: tf.Tensor, consumers: Sequence[tf.Operation]) -> None:
    """Make `consumers` (taken before `new` was built from `old`) read `new` instead of `old`."""
    for consumer in consumers:
        for index, tensor in enumerate(consumer.inputs):
            if tensor is old:
                tf_private.update_input(consumer, index, new)
