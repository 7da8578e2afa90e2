"""Analysis: from the recorded gradients, what each variable is and what updates it.

Everything here is read from the graph itself (the capture collection, op types, colocation
attributes), so it works on a graph imported from a MetaGraphDef as well as on one just built.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from parallax.capture import VARIABLE_OP_TYPES, GradientRecord, read_records
from parallax.errors import ParallaxError

# Fused optimizer updates write every variable they take (the variable and its slots);
# assignments and scatters write their first input.
_FUSED_UPDATE_PREFIXES = ("Apply", "SparseApply", "ResourceApply", "ResourceSparseApply")
_ASSIGN_PREFIXES = ("Assign", "ResourceScatter", "Scatter")


@dataclasses.dataclass
class VariableInfo:
    name: str  # the variable's op name
    dtype: tf.DType
    shape: Tuple[int, ...]
    gradients: List[GradientRecord]
    update_ops: List[str]

    @property
    def is_sparse(self) -> bool:
        return any(record.is_sparse for record in self.gradients)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.size


@dataclasses.dataclass
class ExtraState:
    """A variable without a gradient that training writes: optimizer slots, beta powers,
    moving averages, global_step. It must be written exactly once per step."""

    name: str
    owner: Optional[str]  # the trainable variable it lives with (TF's colocation), if any
    update_ops: List[str]


@dataclasses.dataclass
class GraphAnalysis:
    variables: Dict[str, VariableInfo]  # in recording order
    extra_state: Dict[str, ExtraState]
    update_reads: Dict[str, set]  # variable -> the variables its update ops read

    def inputs_of_updates(self, variable: str) -> set:
        return self.update_reads.get(variable, set())

    @property
    def dense(self) -> List[VariableInfo]:
        return [v for v in self.variables.values() if not v.is_sparse]

    @property
    def sparse(self) -> List[VariableInfo]:
        return [v for v in self.variables.values() if v.is_sparse]


def analyze(graph: tf.Graph) -> GraphAnalysis:
    records = read_records(graph)
    if not records:
        raise ParallaxError(
            "the graph has no recorded gradients: `import parallax` before building the "
            "graph, then compute gradients with tf.compat.v1.gradients or a "
            "tf.compat.v1.train.Optimizer (minimize / compute_gradients) inside that graph")
    by_variable: Dict[str, List[GradientRecord]] = collections.OrderedDict()
    for record in records:
        by_variable.setdefault(record.variable, []).append(record)

    writes = _writes_by_variable(graph)
    gradient_tensors = [graph.get_tensor_by_name(name)
                        for r in records for name in r.tensor_names()]
    step_ops = _training_step_ops(graph, gradient_tensors, writes)
    variables = collections.OrderedDict()
    for name, grads in by_variable.items():
        op = graph.get_operation_by_name(name)
        variables[name] = VariableInfo(
            name=name, dtype=tf.as_dtype(op.get_attr("dtype")),
            shape=tuple(tf.TensorShape(op.get_attr("shape")).as_list()),
            gradients=grads,
            update_ops=[w for w in writes.get(name, []) if w in step_ops])

    extra_state = collections.OrderedDict()
    for name, write_ops in writes.items():
        training_writes = [w for w in write_ops if w in step_ops]
        if name in variables or not training_writes:
            continue
        extra_state[name] = ExtraState(name, _colocated_variable(graph, name, variables),
                                       training_writes)
    stop = {t.op for t in gradient_tensors}
    update_reads = {name: _variables_read(graph, info.update_ops, stop)
                    for name, info in variables.items()}
    return GraphAnalysis(variables, extra_state, update_reads)


def _writes_by_variable(graph: tf.Graph) -> Dict[str, List[str]]:
    writes: Dict[str, List[str]] = collections.defaultdict(list)
    for op in graph.get_operations():
        if op.type.startswith(_FUSED_UPDATE_PREFIXES):
            written = op.inputs
        elif op.type.startswith(_ASSIGN_PREFIXES) and op.inputs:
            written = op.inputs[:1]
        else:
            continue
        for source in {_variable_behind(t) for t in written} - {None}:
            writes[source].append(op.name)
    return writes


def _variable_behind(tensor: tf.Tensor) -> Optional[str]:
    """The variable op a handle or ref tensor comes from, looking through Identity."""
    op = tensor.op
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    return op.name if op.type in VARIABLE_OP_TYPES else None


def _training_step_ops(graph: tf.Graph, gradients: List[tf.Tensor], writes) -> set:
    """Names of the ops a training step runs because of the gradients: what they feed or
    precede, and what those writes need first (Adam's sparse update decays its slots, with no
    input from the gradient, before adding to them)."""
    downstream = _downstream_ops(graph, gradients)
    step_writes = [graph.get_operation_by_name(w) for ops in writes.values() for w in ops
                   if w in downstream]
    seen, stack = set(), step_writes
    while stack:
        op = stack.pop()
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent.name not in seen:
                seen.add(parent.name)
                stack.append(parent)
    return downstream | seen


def _downstream_ops(graph: tf.Graph, tensors: Iterable[tf.Tensor]) -> set:
    """Names of ops reachable from `tensors` through data and control edges: what a training
    step runs because of the gradients (updates, and what is ordered after them)."""
    seen = set()
    frontier = [t.op for t in tensors]
    while frontier:
        op = frontier.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        frontier.extend(c for out in op.outputs for c in out.consumers())
        frontier.extend(op._control_outputs)  # pylint: disable=protected-access
    return seen


def _variables_read(graph: tf.Graph, op_names: List[str], stop: set) -> set:
    """Variables whose handles or refs feed `op_names`, not looking past the gradients (beyond
    them lies the whole forward pass)."""
    found, seen = set(), set()
    frontier = [graph.get_operation_by_name(name) for name in op_names]
    while frontier:
        op = frontier.pop()
        if op in seen or op in stop:
            continue
        seen.add(op)
        if op.type in VARIABLE_OP_TYPES:
            found.add(op.name)
            continue
        frontier.extend(t.op for t in op.inputs)
    return found


def _colocated_variable(graph: tf.Graph, name: str, variables) -> Optional[str]:
    for group in graph.get_operation_by_name(name).colocation_groups():
        target = group.decode()[len("loc:@"):]
        if target in variables:
            return target
    return None
