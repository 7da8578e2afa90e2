"""Capture: record each variable's gradient at the moment autodiff produces it.

Every graph-mode gradient in TensorFlow — `tf.compat.v1.gradients`, `tf.gradients` in a graph,
and `Optimizer.compute_gradients` (hence `minimize` and every subclass) — is computed by
TensorFlow's `_GradientsHelper` (tf_private.gradients_helper), which its callers look up on its
module at call time. Wrapping that one function sees every gradient before user code can clip or
scale it.

The record is a graph collection of JSON strings (contracts.py), so it travels with the graph
through MetaGraphDef export and import; Python-side state would not. The gradient of a batch
mean is recorded too, by wrapping TF's registered gradient of Mean, for sync_batch_norm.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Tuple

import numpy as np
import tensorflow as tf

from parallax import contracts, tf_private
from parallax.contracts import GradientRecord
from parallax.vocabulary import VARIABLE_OP_TYPES


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
        contracts.record_gradient(grad_graph, record)


def _recording(gradients_helper):
    @functools.wraps(gradients_helper)
    def helper(ys, xs, *args, **kwargs):
        grads = gradients_helper(ys, xs, *args, **kwargs)
        xs_list = list(xs) if isinstance(xs, (list, tuple)) else [xs]
        # Gradients inside function bodies (cond/while branches) are autodiff's own
        # intermediate steps, not a variable's gradient.
        if not tf.compat.v1.get_default_graph().building_function:
            _record(xs_list, grads)
            for y in (ys if isinstance(ys, (list, tuple)) else [ys]):
                if isinstance(y, tf.Tensor):
                    contracts.record_loss(y.graph, y.name)
        return grads

    helper.parallax_recording = True
    return helper


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
            contracts.record_statistic_gradient(op.graph, op.name, grad.name)
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
