"""Capture: record each variable's gradient at the moment autodiff produces it.

Every graph-mode gradient in TensorFlow — `tf.compat.v1.gradients`, `tf.gradients` in a graph,
and `Optimizer.compute_gradients` (hence `minimize` and every subclass) — is computed by
TensorFlow's `_GradientsHelper` (tf_private.gradients_helper), which its callers look up on its
module at call time. Wrapping that one function sees every gradient before user code can clip or
scale it.

The record is a graph collection of JSON strings, so it travels with the graph through
MetaGraphDef export and import; Python-side state would not. The gradient of a batch mean is
recorded too, by wrapping TF's registered gradient of Mean, for sync_batch_norm.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from parallax import tf_private

GRADIENTS_COLLECTION = "parallax_gradients"
STATISTIC_GRADIENTS_COLLECTION = "parallax_statistic_gradients"  # see _recording_mean_gradient

# The ops that are variables, resource (VarHandleOp) or reference (VariableV2, Variable).
VARIABLE_OP_TYPES = ("VarHandleOp", "VariableV2", "Variable")
# Ops that run a function (tf.cond's branches, a while loop's body) on the handles they take.
FUNCTION_CALL_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case",
                               "StatelessCase", "PartitionedCall", "StatefulPartitionedCall"})


@dataclasses.dataclass(frozen=True)
class GradientRecord:
    """One variable's gradient as autodiff produced it; names are graph element names."""

    variable: str  # the variable's op name (VarHandleOp / VariableV2)
    dense: Optional[str] = None  # tensor name of a dense gradient
    values: Optional[str] = None  # IndexedSlices parts of a sparse gradient
    indices: Optional[str] = None
    dense_shape: Optional[str] = None

    @property
    def is_sparse(self) -> bool:
        return self.values is not None

    def tensor_names(self) -> List[str]:
        return [n for n in (self.dense, self.values, self.indices) if n is not None]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text) -> "GradientRecord":
        if isinstance(text, bytes):
            text = text.decode()
        return cls(**json.loads(text))


def read_records(graph: tf.Graph) -> List[GradientRecord]:
    """The gradients recorded in `graph`, in recording order, without repeats."""
    seen, records = set(), []
    for text in graph.get_collection(GRADIENTS_COLLECTION):
        record = GradientRecord.from_json(text)
        if record not in seen:
            seen.add(record)
            records.append(record)
    return records


def _variable_op_name(x) -> Optional[str]:
    """The variable op behind a gradient source, or None when `x` is not a variable."""
    if tf_private.is_resource_variable(x) or isinstance(x, tf.Variable):
        return x.op.name
    op = getattr(x, "op", None)
    if op is not None and op.type in VARIABLE_OP_TYPES:
        return op.name
    return None


def _record(xs, grads) -> None:
    for x, grad in zip(xs, grads):
        variable = _variable_op_name(x)
        if variable is None or grad is None:
            continue
        if isinstance(grad, tf.IndexedSlices):
            record = GradientRecord(
                variable=variable, values=grad.values.name, indices=grad.indices.name,
                dense_shape=None if grad.dense_shape is None else grad.dense_shape.name)
        elif isinstance(grad, tf.Tensor):
            record = GradientRecord(variable=variable, dense=grad.name)
        else:
            continue
        grad_graph = (grad.values if isinstance(grad, tf.IndexedSlices) else grad).graph
        grad_graph.add_to_collection(GRADIENTS_COLLECTION, record.to_json())


def _recording(gradients_helper):
    @functools.wraps(gradients_helper)
    def helper(ys, xs, *args, **kwargs):
        grads = gradients_helper(ys, xs, *args, **kwargs)
        xs_list = list(xs) if isinstance(xs, (list, tuple)) else [xs]
        # Gradients inside function bodies (cond/while branches) are autodiff's own
        # intermediate steps, not a variable's gradient.
        if not tf.compat.v1.get_default_graph().building_function:
            _record(xs_list, grads)
        return grads

    helper.parallax_recording = True
    return helper


def read_statistic_gradients(graph: tf.Graph) -> Dict[str, str]:
    """Mean op name -> the gradient autodiff passed into it (for sync_batch_norm)."""
    pairs = (json.loads(text) for text in graph.get_collection(STATISTIC_GRADIENTS_COLLECTION))
    return {pair["op"]: pair["gradient"] for pair in pairs}


def batch_moments(graph: tf.Graph) -> List[Tuple[str, str]]:
    """(mean, variance) op names of each tf.nn.moments over the batch axis (also what Keras's
    BatchNormalization builds): variance = Mean(SquaredDifference(y, StopGradient(mean))),
    mean = Mean(y) over axes that include 0."""
    found = []
    for op in graph.get_operations():
        if op.type != "Mean" or op.inputs[0].op.type != "SquaredDifference":
            continue
        samples, centre = op.inputs[0].op.inputs
        mean = centre.op.inputs[0].op if centre.op.type == "StopGradient" else None
        if (mean is not None and mean.type == "Mean" and mean.inputs[0] is samples
                and _reduces_batch_axis(mean)):
            found.append((mean.name, op.name))
    return found


def _reduces_batch_axis(op: tf.Operation) -> bool:
    axes = tf.get_static_value(op.inputs[1])
    return axes is not None and 0 in np.atleast_1d(axes).tolist()


def _recording_mean_gradient(mean_gradient):
    """The gradient of a batch mean, with what flows into it recorded: sync_batch_norm averages
    it over workers. An identity makes it a tensor that only this gradient reads."""
    @functools.wraps(mean_gradient)
    def gradient(op, grad):
        if isinstance(grad, tf.Tensor) and _reduces_batch_axis(op):
            grad = tf.identity(grad, name="parallax_statistic_gradient")
            op.graph.add_to_collection(STATISTIC_GRADIENTS_COLLECTION, json.dumps(
                {"op": op.name, "gradient": grad.name}))
        return mean_gradient(op, grad)

    gradient.parallax_recording = True
    return gradient


def install() -> None:
    """Start recording gradients; idempotent (importing parallax calls it)."""
    helper = tf_private.gradients_helper()
    if not getattr(helper, "parallax_recording", False):
        tf_private.set_gradients_helper(_recording(helper))
    mean_gradient = tf_private.registered_gradient("Mean")
    if not getattr(mean_gradient, "parallax_recording", False):
        tf_private.set_registered_gradient("Mean", _recording_mean_gradient(mean_gradient))
