"""In parallax.verify's one-device run, a batch of fixed size (drop_remainder=True) read from a
dataset the script shards is the combined batch: the workers' batches joined.

Its size is the graph's static batch dimension, from which scripts build the rest of their
shapes (BERT reshapes [batch, sequence, width] to [batch x sequence, width] with Python ints),
so it is made as large while the script builds its graph; the steps then read the workers'
recorded batches joined (runtime/recording.py). Batches of any size (drop_remainder=False)
take the joined batches as they are."""
from __future__ import annotations

import functools
import inspect
from typing import Callable, List, Tuple

import tensorflow as tf

from parallax import tf_private
from parallax.vocabulary import walk

# On a batching function replaced: the sharded datasets' tensors, each with its workers
_SHARDS = "_parallax_shards"


def combine_fixed_batches(sharded: tf.data.Dataset, workers: int) -> None:
    """From now on in this process, a fixed-size batch of `sharded`, or of a dataset made from
    it, holds `workers` times the examples: Dataset.batch, padded_batch and
    tf.data.experimental.map_and_batch, each with drop_remainder=True."""
    shards = getattr(tf.data.Dataset.batch, _SHARDS, None)
    if shards is None:
        shards = []
        for name in ("batch", "padded_batch"):  # TF1's Dataset calls these too
            setattr(tf.data.Dataset, name,
                    _scaled_method(getattr(tf.data.Dataset, name), shards))
        map_and_batch = _scaled_map_and_batch(tf.data.experimental.map_and_batch, shards)
        tf.data.experimental.map_and_batch = map_and_batch
        tf.compat.v1.data.experimental.map_and_batch = map_and_batch
    shards.append((tf_private.dataset_variant(sharded), workers))


def _scale(dataset, shards: List[Tuple[tf.Tensor, int]], drops_remainder: bool) -> int:
    """How many workers' batches a batch of `dataset` holds."""
    if drops_remainder:
        for source in walk([dataset], tf_private.dataset_inputs):
            variant = tf_private.dataset_variant(source)
            for shard, workers in shards:
                if variant is shard:
                    return workers
    return 1


def _drops_remainder(function: Callable, *args, **kwargs) -> bool:
    return bool(inspect.signature(function).bind(*args, **kwargs).arguments.get(
        "drop_remainder"))


def _scaled_method(method: Callable, shards) -> Callable:
    @functools.wraps(method)
    def batch(self, batch_size, *args, **kwargs):
        scale = _scale(self, shards, _drops_remainder(method, self, batch_size, *args, **kwargs))
        return method(self, batch_size * scale, *args, **kwargs)
    setattr(batch, _SHARDS, shards)
    return batch


def _scaled_map_and_batch(function: Callable, shards) -> Callable:
    @functools.wraps(function)
    def map_and_batch(map_func, batch_size, *args, **kwargs):
        def apply(dataset):
            scale = _scale(dataset, shards, _drops_remainder(function, map_func, batch_size,
                                                              *args, **kwargs))
            return function(map_func, batch_size * scale, *args, **kwargs)(dataset)
        return apply
    return map_and_batch
