"""Which writes of per-worker state count the batch: an `assign_add` whose increment is a sum
over the batch's examples (a metric's count of examples, its total, true positives) adds, on
one device, the combined batch's sum, which is the sum of the workers' increments; any other
write of per-worker state (a per-step value, a batch's mean, an assignment) is the combined
batch's as the mean of the workers' values.

The increment is read backwards from the write, through ops that keep what it is (casts,
reshapes, scaling by a value every worker has alike), to what made it:
- a reduction (Sum, Size, a scatter of counts, the size of an axis: `tf.shape(x)[0]`) over the
  batch's axis: a count, summed;
- a mean over the batch (a batch norm's statistics too), a ratio of two counts, or nothing of
  the worker's data: a per-step value, averaged;
- anything else from the worker's data: unclear (averaged, and the driver says so).
An axis is the batch's when its size is unknown or a multiple of the input's leading size (a
flattened batch). A batch of fixed size makes TensorFlow fold a count of it (tf.size) into a
constant: an increment that is a multiple of the batch's size is taken to count it.
"""
from __future__ import annotations

import enum
from typing import Iterable, List, Optional, Set

import numpy as np
import tensorflow as tf

from parallax.vocabulary import DIVIDING_OPS, PLACEHOLDER_OPS, parents, walk


class Increment(enum.Enum):
    COUNT = "a sum over the batch"  # summed over workers
    PER_STEP = "a value per step"  # the same as, or averaged to, one device's
    UNCLEAR = "unclear"


# Writes that add their second input to the variable.
ADDING_WRITES = frozenset({"AssignAdd", "AssignSub", "AssignAddVariableOp",
                           "AssignSubVariableOp"})
_KEEPING = frozenset({"Cast", "Identity", "Neg", "Reshape", "ExpandDims", "Squeeze",
                      "StopGradient", "Snapshot"})
_SCALING = frozenset({"Mul", "RealDiv", "Div", "DivNoNan", "Maximum", "Minimum"})
_ADDING = frozenset({"Add", "AddV2", "Sub", "AddN"})
# Sums of per-example contributions into a fixed shape (confusion matrices, histograms).
_SCATTERS = frozenset({"SparseTensorDenseAdd", "ScatterNd", "UnsortedSegmentSum",
                       "Bincount", "DenseBincount"})
_STEP_OPS = 200  # how far back an increment is read: past this, unclear


def increment_kind(write: tf.Operation, from_data: Set[str], batch_sizes: Set[int]) -> Increment:
    """What an adding write's increment is (its second input), `from_data` the names of the
    ops computed from each worker's own data, `batch_sizes` the input's known leading sizes."""
    return tensor_kind(write.inputs[1], from_data, batch_sizes)


def tensor_kind(tensor: tf.Tensor, from_data: Set[str], batch_sizes: Set[int]) -> Increment:
    """What `tensor` is of the worker's batch (see increment_kind): a loss's denominator too."""
    budget = [_STEP_OPS]

    def batch_axis(size: Optional[int]) -> bool:  # a flattened batch's too
        return size is None or any(size % b == 0 for b in batch_sizes if b > 1)

    def kind(tensor: tf.Tensor) -> Increment:
        op = tensor.op
        budget[0] -= 1
        if op.name not in from_data:
            return Increment.PER_STEP
        if budget[0] <= 0:
            return Increment.UNCLEAR
        if op.type in ("Sum", "Mean"):
            reduced = _reduced_sizes(op)
            if reduced is None or any(map(batch_axis, reduced)):
                return Increment.COUNT if op.type == "Sum" else Increment.PER_STEP
            return kind(op.inputs[0])
        if op.type == "Size":
            shape = op.inputs[0].shape
            return (Increment.COUNT if shape.rank is None or any(map(batch_axis, shape.as_list()))
                    else Increment.PER_STEP)
        if op.type in _SCATTERS:
            return Increment.COUNT
        if op.type.startswith("FusedBatchNorm"):  # a batch's mean and variance
            return Increment.PER_STEP
        if op.type == "StridedSlice" and op.inputs[0].op.type == "Shape":  # tf.shape(x)[0]
            shape = op.inputs[0].op.inputs[0].shape
            begin = tf.get_static_value(op.inputs[1])
            if shape.rank is not None and begin is not None and np.size(begin) == 1:
                return (Increment.COUNT if batch_axis(shape.as_list()[int(np.ravel(begin)[0])])
                        else Increment.PER_STEP)
        if op.type in _KEEPING:
            return kind(op.inputs[0])
        kinds = [kind(t) for t in op.inputs if t.op.name in from_data]
        if (op.type in DIVIDING_OPS and kinds == [Increment.COUNT]
                and op.inputs[0].op.name in from_data
                and counts_fixed_batch(op.inputs[1])):
            return Increment.PER_STEP  # a count over the batch's size: a batch's mean
        if op.type in _SCALING and len(kinds) == 1:  # scaled by what every worker has alike
            return kinds[0]
        if op.type in DIVIDING_OPS and kinds == [Increment.COUNT] * 2:
            return Increment.PER_STEP  # a ratio of two counts: a batch's mean
        if op.type in _ADDING and len(set(kinds)) == 1:
            return kinds[0]
        return Increment.UNCLEAR

    def counts_fixed_batch(tensor: tf.Tensor) -> bool:
        if not any(b > 1 for b in batch_sizes):  # no fixed batch: nothing to evaluate
            return False
        value = static_value(tensor)
        values = np.ravel(value) if value is not None else np.zeros([0])
        return values.size > 0 and values.dtype != object and all(
            v > 0 and v == int(v) and batch_axis(int(v)) for v in values)

    if tensor.op.name not in from_data:  # tf.size of a batch of fixed shape is a constant
        return (Increment.COUNT if counts_fixed_batch(tensor)
                else Increment.PER_STEP)
    return kind(tensor)


def static_value(tensor: tf.Tensor):
    """The value of a tensor computed from constants alone (what TensorFlow folds: a batch's
    size when its shape is fixed), or None: evaluated when no op it comes from has state or
    is fed."""
    value = tf.get_static_value(tensor)
    if value is not None:
        return value
    for op in walk([tensor.op], parents):  # what running it would run
        if op.op_def.is_stateful or op.type in PLACEHOLDER_OPS or op.type in (
                "Enter", "Switch", "Merge"):
            return None
    with tf.compat.v1.Session(graph=tensor.graph) as session:
        return session.run(tensor)


def _reduced_sizes(op: tf.Operation) -> Optional[List[Optional[int]]]:
    """The sizes of the axes a Sum or Mean reduces (None where not known)."""
    shape = op.inputs[0].shape
    axes = tf.get_static_value(op.inputs[1])
    if shape.rank is None or axes is None:
        return None
    sizes = shape.as_list()
    return [sizes[int(axis)] for axis in np.reshape(axes, [-1])]


def batch_sizes(sources: Iterable[tf.Operation]) -> Set[int]:
    """The known leading sizes of the input's tensors: a batch's size when it is fixed."""
    # dimension_value: under TF1 behaviour a shape's entries are Dimension objects.
    return {tf.compat.dimension_value(out.shape[0]) for op in sources for out in op.outputs
            if out.shape.rank and tf.compat.dimension_value(out.shape[0]) is not None}
