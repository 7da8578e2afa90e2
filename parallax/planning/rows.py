"""What a sparse gradient's rows allow, read from the graph: whether the rows of one id may be
summed before they cross machines (the model only adds them into the variable, or takes their
norm), and whether its ids were made unique per batch first (rewriting/row_sums.py acts on
both)."""
from __future__ import annotations

import tensorflow as tf

from parallax.vocabulary import walk

# Ops that add rows of one id together (or, Unique, find them): duplicates do not matter.
_ROW_ADDERS = frozenset({"UnsortedSegmentSum", "Unique", "ResourceScatterAdd",
                         "ResourceScatterSub", "ScatterAdd", "ScatterSub"})
# Elementwise by a scalar (a clip factor, an average): summing rows commutes with them.
_SCALINGS = frozenset({"Mul", "RealDiv", "Neg", "Identity"})


_UNIQUE_OPS = frozenset({"Unique", "UniqueV2", "UniqueWithCounts", "UniqueWithCountsV2"})


def rows_unique_per_batch(indices: tf.Tensor) -> bool:
    """Whether a gradient's ids derive from unique ids (tf.unique's first output): a lookup of
    deduplicated ids, through any ops (the shards of a partitioned table take them apart)."""
    return any(tensor.op.type in _UNIQUE_OPS and tensor.value_index == 0
               for tensor in walk([indices], lambda tensor: tensor.op.inputs))


def rows_can_be_summed(values: tf.Tensor, indices: tf.Tensor) -> bool:
    return _only_row_adders(values, norm_ok=True) and _only_row_adders(indices, norm_ok=False)


def _only_row_adders(tensor: tf.Tensor, norm_ok: bool) -> bool:
    for consumer in tensor.consumers():
        if consumer.type in _ROW_ADDERS or (norm_ok and consumer.type == "L2Loss"):
            continue
        others = [t for t in consumer.inputs if t is not tensor]
        if consumer.type in _SCALINGS and all(t.shape.rank == 0 for t in others):
            if all(_only_row_adders(out, norm_ok) for out in consumer.outputs):
                continue
        return False
    return True
