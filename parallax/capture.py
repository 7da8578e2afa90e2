"""Capture: record each variable's gradient at the moment autodiff produces it.

Every graph-mode gradient in TensorFlow — `tf.compat.v1.gradients`, `tf.gradients` in a graph,
and `Optimizer.compute_gradients` (hence `minimize` and every subclass) — is computed by
`gradients_util._GradientsHelper`, which its callers look up on the module at call time. Wrapping
that one function sees every gradient before user code can clip or scale it.

The record is a graph collection of JSON strings, so it travels with the graph through
MetaGraphDef export and import; Python-side state would not.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import List, Optional

import tensorflow as tf
from tensorflow.python.framework import func_graph
from tensorflow.python.ops import gradients_util
from tensorflow.python.ops import resource_variable_ops

GRADIENTS_COLLECTION = "parallax_gradients"

# The ops that are variables, resource (VarHandleOp) or reference (VariableV2, Variable).
VARIABLE_OP_TYPES = ("VarHandleOp", "VariableV2", "Variable")


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
    if resource_variable_ops.is_resource_variable(x) or isinstance(x, tf.Variable):
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
        if not isinstance(tf.compat.v1.get_default_graph(), func_graph.FuncGraph):
            _record(xs_list, grads)
        return grads

    helper.parallax_recording = True
    return helper


def install() -> None:
    """Start recording gradients; idempotent (importing parallax calls it)."""
    if not getattr(gradients_util._GradientsHelper, "parallax_recording", False):
        gradients_util._GradientsHelper = _recording(gradients_util._GradientsHelper)
