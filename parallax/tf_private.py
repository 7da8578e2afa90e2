"""Every use Parallax makes of TensorFlow's private API, in one place (issue 33).

Parallax rewrites a tf.compat.v1 graph in place after the user built it (rewiring inputs,
moving ops, adding control edges) and hooks TensorFlow's autodiff, which the public API does
not allow. Each private name used is here once, behind a public function of this module (or a
re-export), with a one-line reason; PRIVATE_NAMES lists them all, and tests/test_tf_private.py
checks that each still exists, so a TensorFlow upgrade that drops one fails naming it. No other
module of parallax/ imports `tensorflow.python` or touches a TensorFlow object's `_attribute`
(tests/test_tf_private.py greps for it).
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, List, Optional

import tensorflow as tf
# Chrome traces of a run's RunMetadata (ProfileConfig): TensorFlow does not export Timeline.
from tensorflow.python.client import timeline
# What tf.compat.v1.train.Saver checks its `sess` against: ParallaxRunner subclasses it.
from tensorflow.python.client.session import SessionInterface
from tensorflow.python.framework import ops as _ops
from tensorflow.python.framework import stack as _stack
# import_meta_graph's import alone: the public one also adds a Saver of every variable.
from tensorflow.python.framework.meta_graph import import_scoped_meta_graph
from tensorflow.python.ops import gradients_util as _gradients_util
# Whether an object acts as a resource variable (also wrappers that are not tf.Variable).
from tensorflow.python.ops.resource_variable_ops import is_resource_variable
# A Saver's name -> saveable map of a var_list, as Saver builds it: not exported.
from tensorflow.python.training.saving.saveable_object_util import op_list_to_dict
# What a Saver saves that is not a variable (a dynamic embedding's keys): not exported.
from tensorflow.python.training.saving.saveable_object import SaveableObject, SaveSpec

__all__ = [
    "timeline", "SessionInterface", "import_scoped_meta_graph", "is_resource_variable",
    "op_list_to_dict", "SaveableObject", "SaveSpec", "update_input", "add_control_inputs",
    "set_control_inputs", "control_outputs", "set_device", "set_attr", "creation_index", "has_function",
    "get_function", "control_flow_context", "in_control_flow_context_of", "default_session",
    "save_slice_info", "gradients_helper", "set_gradients_helper", "registered_gradient",
    "set_registered_gradient", "PRIVATE_NAMES"]

# (module, dotted name in it, kind) of every private name above and below: kind is "class",
# "callable", "property", "dict", or "instance" (an attribute TF sets on each instance of the
# class named). tests/test_tf_private.py checks each one.
PRIVATE_NAMES = [
    ("tensorflow.python.client.timeline", "Timeline", "class"),
    ("tensorflow.python.client.session", "SessionInterface", "class"),
    ("tensorflow.python.framework.stack", "default_session", "callable"),
    ("tensorflow.python.framework.meta_graph", "import_scoped_meta_graph", "callable"),
    ("tensorflow.python.ops.resource_variable_ops", "is_resource_variable", "callable"),
    ("tensorflow.python.training.saving.saveable_object_util", "op_list_to_dict", "callable"),
    ("tensorflow.python.training.saving.saveable_object", "SaveableObject", "class"),
    ("tensorflow.python.training.saving.saveable_object", "SaveSpec", "class"),
    ("tensorflow.python.ops.gradients_util", "_GradientsHelper", "callable"),
    ("tensorflow.python.framework.ops", "_gradient_registry._registry", "dict"),
    ("tensorflow.python.framework.ops", "Operation._update_input", "callable"),
    ("tensorflow.python.framework.ops", "Operation._add_control_inputs", "callable"),
    ("tensorflow.python.framework.ops", "Operation._remove_all_control_inputs", "callable"),
    ("tensorflow.python.framework.ops", "Operation._control_outputs", "property"),
    ("tensorflow.python.framework.ops", "Operation._set_device", "callable"),
    ("tensorflow.python.framework.ops", "Operation._set_attr", "callable"),
    ("tensorflow.python.framework.ops", "Operation._id", "property"),
    ("tensorflow.python.framework.ops", "Operation._get_control_flow_context", "callable"),
    ("tensorflow.python.framework.ops", "Graph._is_function", "callable"),
    ("tensorflow.python.framework.ops", "Graph._get_function", "callable"),
    ("tensorflow.python.framework.ops", "Graph._get_control_flow_context", "callable"),
    ("tensorflow.python.framework.ops", "Graph._set_control_flow_context", "callable"),
    ("tensorflow.python.ops.variables", "Variable._save_slice_info", "instance"),
    ("tensorflow.python.data.ops.dataset_ops", "DatasetV2._inputs", "callable"),
    ("tensorflow.python.data.ops.dataset_ops", "DatasetV2._variant_tensor", "property"),
]


# --- Editing an op already in the graph: the public API only builds new ops. -----------------

def update_input(op: tf.Operation, index: int, tensor: tf.Tensor) -> None:
    """Make `op` read `tensor` as its input `index` (rewire.reroute is the usual way in)."""
    # Why: no public way to change an existing op's data input.
    op._update_input(index, tensor)  # pylint: disable=protected-access


def add_control_inputs(op: tf.Operation, controls: Iterable[tf.Operation]) -> None:
    """`op` also waits for `controls`. Unlike tf.control_dependencies, it works on an op
    already built and leaves the ops waited for unmarked (a session may have run them)."""
    # Why: tf.control_dependencies only applies to ops built inside it.
    op._add_control_inputs(list(controls))  # pylint: disable=protected-access


def set_control_inputs(op: tf.Operation, controls: Iterable[tf.Operation]) -> None:
    """`op` waits for `controls` and nothing else (an empty list frees it of all)."""
    controls = list(controls)
    # Why: no public way to remove an existing op's control inputs.
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    if controls:
        add_control_inputs(op, controls)


def control_outputs(op: tf.Operation) -> List[tf.Operation]:
    """The ops that have `op` as a control input."""
    # Why: Operation exports control_inputs but not their reverse.
    return list(op._control_outputs)  # pylint: disable=protected-access


def set_device(op: tf.Operation, device: str) -> None:
    """Place an op already built on `device` (a device string)."""
    # Why: tf.device only places ops built inside it.
    op._set_device(device)  # pylint: disable=protected-access


def set_attr(op: tf.Operation, name: str, value: tf.compat.v1.AttrValue) -> None:
    """Set attribute `name` of an op already built (its container, its colocation `_class`)."""
    # Why: attributes are public read-only (Operation.get_attr).
    op._set_attr(name, value)  # pylint: disable=protected-access


def creation_index(op: tf.Operation) -> int:
    """The op's serial number in its graph: an op built later has a larger one."""
    # Why: the public API gives the order only as graph.get_operations(), a list of all ops.
    return op._id  # pylint: disable=protected-access


# --- Functions in a graph's library: tf.Graph exports no lookup by name. --------------------

def has_function(graph: tf.Graph, name: str) -> bool:
    """Whether `graph`'s function library has a function (or a gradient) named `name`."""
    # Why: no public lookup of a graph's functions by name (as_graph_def copies them all).
    return graph._is_function(name)  # pylint: disable=protected-access


def get_function(graph: tf.Graph, name: str):
    """The function named `name` in `graph`'s library (with `.definition`, a FunctionDef), or
    None."""
    # Why: no public lookup of a graph's functions by name (as_graph_def copies them all).
    return graph._get_function(name)  # pylint: disable=protected-access


# --- tf.compat.v1 control flow (tf.cond / tf.while_loop contexts). ---------------------------

def control_flow_context(op: tf.Operation):
    """The tf.compat.v1 control-flow context `op` was built in (a while loop's body), or
    None."""
    # Why: the v1 control-flow contexts have no public accessor.
    return op._get_control_flow_context()  # pylint: disable=protected-access


@contextlib.contextmanager
def in_control_flow_context_of(op: tf.Operation):
    """New ops of `op`'s graph are built in `op`'s tf.compat.v1 control-flow context (a lookup
    in a while loop's body): outside of it they could not take its tensors."""
    graph = op.graph
    # Why: the v1 control-flow contexts have no public accessor or setter.
    outer = graph._get_control_flow_context()  # pylint: disable=protected-access
    graph._set_control_flow_context(control_flow_context(op))  # pylint: disable=protected-access
    try:
        yield
    finally:
        graph._set_control_flow_context(outer)  # pylint: disable=protected-access


# --- Sessions and variables. -------------------------------------------------------------------

def default_session(session):
    """A context in which `session` (any SessionInterface) is the default session, as
    Session.as_default gives for a tf.compat.v1.Session."""
    # Why: the public as_default exists only on tf.compat.v1.Session itself.
    return _stack.default_session(session)


def save_slice_info(variable) -> Optional[object]:
    """The SaveSliceInfo of a variable that is a part of a partitioned one (its full name,
    shape and offset), or None."""
    # Why: tf.compat.v1 partitioned variables expose their parts' slice info only privately.
    return getattr(variable, "_save_slice_info", None)


def dataset_inputs(dataset) -> List[object]:
    """The datasets `dataset` reads from (a map's, a batch's source)."""
    # Why: tf.data keeps a dataset's sources privately.
    return list(dataset._inputs())  # pylint: disable=protected-access


def dataset_variant(dataset) -> tf.Tensor:
    """The tensor a dataset is in a graph (a DatasetV1Adapter's is the dataset's it wraps)."""
    # Why: tf.data keeps a dataset's graph tensor privately.
    return dataset._variant_tensor  # pylint: disable=protected-access


# --- The gradient hooks of capture.py: autodiff has no public hook. ---------------------------

def gradients_helper() -> Callable:
    """The function every graph-mode gradient goes through (tf.gradients, compute_gradients),
    which its callers look up on its module at call time."""
    # Why: capture.py records each variable's gradient there; autodiff has no public hook.
    return _gradients_util._GradientsHelper  # pylint: disable=protected-access


def set_gradients_helper(helper: Callable) -> None:
    """Replace the function gradients_helper returns (with a wrapper of it)."""
    # Why: capture.py records each variable's gradient there; autodiff has no public hook.
    _gradients_util._GradientsHelper = helper  # pylint: disable=protected-access


def registered_gradient(op_type: str) -> Callable:
    """The gradient function registered for ops of `op_type` (tf.RegisterGradient's)."""
    # Why: ops.get_gradient_function needs an op; the registry has no public lookup by type.
    return _ops._gradient_registry._registry[op_type]["type"]  # pylint: disable=protected-access


def set_registered_gradient(op_type: str, gradient: Callable) -> None:
    """Replace the gradient function registered for `op_type` (a wrapper of it)."""
    registry = _ops._gradient_registry._registry  # pylint: disable=protected-access
    # Why: tf.RegisterGradient refuses a type already registered.
    registry[op_type]["type"] = gradient
