"""parallax/tf_private.py is the one place Parallax uses TensorFlow's private API (issue 33): each
private name it relies on still exists in this TensorFlow, its wrappers do what the passes
expect of them, and no other module of parallax/ reaches into TensorFlow's privates. In-process
only: no test here starts a process."""
import ast
import importlib
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import parallax  # noqa: F401  (installs the capture hooks, as a user's import does)
from parallax import tf_private
from parallax.rewriting.rewire import reroute

PARALLAX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "parallax")
TF_PRIVATE = os.path.join(PARALLAX, "tf_private.py")



def _resolve(module_name, dotted):
    """The object at `dotted` in the module, through getattr (so a property stays a property
    when read off its class)."""
    owner = importlib.import_module(module_name)
    parts = dotted.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def _partitioned_variable():
    graph = tf.Graph()
    with graph.as_default():
        parts = tf.compat.v1.get_variable(
            "table", [4, 2], partitioner=tf.compat.v1.fixed_size_partitioner(2))
        whole = tf.compat.v1.get_variable("whole", [2], use_resource=True)
    return list(parts), whole


# ---- (a) every private name still exists, of the kind tf_private uses it as ------------------

@pytest.mark.parametrize("module_name,dotted,kind", tf_private.PRIVATE_NAMES,
                         ids=[f"{m}.{d}" for m, d, _ in tf_private.PRIVATE_NAMES])
def test_private_name_still_exists(module_name, dotted, kind):
    where = f"{module_name}.{dotted}"
    try:
        owner, name = _resolve(module_name, dotted)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"TensorFlow {tf.__version__} no longer has {where} ({error}); "
                    "parallax/tf_private.py needs another way")
    if kind == "instance":  # set by the class's __init__: look at one of them
        parts, whole = _partitioned_variable()
        assert isinstance(parts[0], owner), where
        assert all(hasattr(v, name) for v in parts + [whole]), \
            f"TensorFlow {tf.__version__} variables have no {name} ({where})"
        return
    # the class's own __dict__ for a property (getattr on the class would give it too)
    found = next((vars(cls)[name] for cls in getattr(owner, "__mro__", ())
                  if name in vars(cls)), None) if isinstance(owner, type) else None
    value = found if found is not None else getattr(owner, name, None)
    assert value is not None, f"TensorFlow {tf.__version__} no longer has {where}"
    checks = {"class": lambda v: isinstance(v, type),
              "callable": callable,
              "property": lambda v: isinstance(v, property) or hasattr(v, "__get__"),
              "dict": lambda v: isinstance(v, dict)}
    assert checks[kind](value), f"{where} is no longer a {kind}: {value!r}"


def test_private_names_list_covers_the_module():
    """Every `tensorflow.python` import and every `._name` of tf_private.py is in
    PRIVATE_NAMES, so the test above checks all of them."""
    listed_modules = {m for m, _, _ in tf_private.PRIVATE_NAMES}
    listed = {(m, d) for m, d, _ in tf_private.PRIVATE_NAMES}
    components = {part for _, d, _ in tf_private.PRIVATE_NAMES for part in d.split(".")}
    with open(TF_PRIVATE) as f:
        source = f.read()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module.startswith("tensorflow.python"):
            for alias in node.names:
                as_module = f"{node.module}.{alias.name}"
                assert as_module in listed_modules or (node.module, alias.name) in listed, \
                    f"tf_private imports {as_module}, which PRIVATE_NAMES does not list"
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("tensorflow.python") for a in node.names)
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr.startswith("_")
            and not n.attr.startswith("__")}
    used |= {n.args[1].value for n in ast.walk(tree)
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "getattr"
             and isinstance(n.args[1], ast.Constant) and str(n.args[1].value).startswith("_")}
    assert used - components == set(), "private names used but not in PRIVATE_NAMES"


# ---- the wrappers on a tiny graph -------------------------------------------------------------

def _run(graph, fetch):
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(fetch)


def test_update_input_and_reroute():
    graph = tf.Graph()
    with graph.as_default():
        a, b = tf.constant(1.0), tf.constant(2.0)
        c = tf.identity(a)
        d = tf.add(a, a)
    tf_private.update_input(c.op, 0, b)
    assert list(c.op.inputs) == [b]
    reroute(a, b, [d.op])  # every input that read `a`
    assert list(d.op.inputs) == [b, b]
    assert _run(graph, [c, d]) == [2.0, 4.0]


def test_control_inputs_and_outputs():
    graph = tf.Graph()
    with graph.as_default():
        first, second, third = tf.no_op(name="first"), tf.no_op(name="second"), tf.no_op()
    tf_private.add_control_inputs(third, [first, second])
    assert set(third.control_inputs) == {first, second}
    assert tf_private.control_outputs(first) == [third]
    tf_private.set_control_inputs(third, [second])
    assert third.control_inputs == [second] and tf_private.control_outputs(first) == []
    tf_private.set_control_inputs(third, [])
    assert third.control_inputs == [] and tf_private.control_outputs(second) == []


def test_device_attr_and_creation_order():
    graph = tf.Graph()
    with graph.as_default():
        variable = tf.compat.v1.Variable(1.0, use_resource=True, name="v")
        later = tf.constant(0.0)
    handle = variable.handle.op
    tf_private.set_device(handle, "/job:worker/task:1/device:CPU:0")
    assert handle.device == "/job:worker/task:1/device:CPU:0"
    tf_private.set_attr(handle, "container", tf.compat.v1.AttrValue(s=b"parallax.run3"))
    assert handle.get_attr("container") == b"parallax.run3"
    indices = [tf_private.creation_index(op) for op in graph.get_operations()]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)
    assert tf_private.creation_index(later.op) > tf_private.creation_index(handle)


def test_function_lookup():
    @tf.function
    def double(x):
        return x * 2.0

    graph = tf.Graph()
    with graph.as_default():
        double(tf.constant(1.0))
    call = next(op for op in graph.get_operations() if op.type.endswith("PartitionedCall"))
    name = call.node_def.attr["f"].func.name
    assert tf_private.has_function(graph, name)
    assert any(node.op == "Mul" for node in tf_private.get_function(graph, name)
               .definition.node_def)
    assert not tf_private.has_function(graph, "no_such_function")
    assert tf_private.get_function(graph, "no_such_function") is None


def test_control_flow_context():
    """Ops built in a v1 while loop's context, from outside of it, can take its tensors."""
    enabled = tf.compat.v1.control_flow_v2_enabled()
    tf.compat.v1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            outside = tf.constant(1.0)
            _, total = tf.compat.v1.while_loop(
                lambda i, t: i < 3, lambda i, t: (i + 1, tf.identity(t + 1.0, name="body")),
                [tf.constant(0), tf.constant(0.0)])
    finally:
        if enabled:
            tf.compat.v1.enable_control_flow_v2()
    body = graph.get_operation_by_name("while/body")
    assert tf_private.control_flow_context(body) is not None
    assert tf_private.control_flow_context(outside.op) is None
    with graph.as_default(), tf_private.in_control_flow_context_of(body):
        doubled = body.outputs[0] * 2.0
    assert tf_private.control_flow_context(doubled.op) is tf_private.control_flow_context(body)
    with graph.as_default():  # the graph's own context is restored
        after = tf.constant(0.0)
    assert tf_private.control_flow_context(after.op) is None
    assert _run(graph, total) == 3.0


def test_sessions_variables_and_checkpoints():
    parts, whole = _partitioned_variable()
    info = tf_private.save_slice_info(parts[1])
    assert info.full_name == "table" and info.full_shape == [4, 2] and info.var_offset == [2, 0]
    assert tf_private.save_slice_info(whole) is None
    assert tf_private.save_slice_info(object()) is None
    assert tf_private.is_resource_variable(whole)
    assert not tf_private.is_resource_variable(tf.constant(0.0))
    assert issubclass(tf.compat.v1.Session, tf_private.SessionInterface)
    assert set(tf_private.op_list_to_dict([whole])) == {"whole"}
    graph = whole.graph
    with tf.compat.v1.Session(graph=graph) as session:
        with tf_private.default_session(session):
            assert tf.compat.v1.get_default_session() is session
    assert tf.compat.v1.get_default_session() is not session


def test_meta_graph_import_and_timeline():
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.Variable(1.0, use_resource=True, name="v")
    meta_graph = tf.compat.v1.train.export_meta_graph(graph=graph)
    copy = tf.Graph()
    tf_private.import_scoped_meta_graph(meta_graph, graph=copy)
    assert {op.name for op in copy.get_operations()} == {op.name for op in graph.get_operations()}
    assert not copy.get_collection(tf.compat.v1.GraphKeys.SAVERS)
    trace = tf_private.timeline.Timeline(tf.compat.v1.RunMetadata().step_stats)
    assert "traceEvents" in json.loads(trace.generate_chrome_trace_format())


def test_gradient_hooks_are_installed_and_replaceable():
    assert getattr(tf_private.gradients_helper(), "parallax_recording", False)
    assert getattr(tf_private.registered_gradient("Mean"), "parallax_recording", False)
    helper, mean_gradient = tf_private.gradients_helper(), tf_private.registered_gradient("Mean")
    calls = []

    def counting(function, what):
        def wrapped(*args, **kwargs):
            calls.append(what)
            return function(*args, **kwargs)
        return wrapped

    tf_private.set_gradients_helper(counting(helper, "gradients"))
    tf_private.set_registered_gradient("Mean", counting(mean_gradient, "Mean"))
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf.constant(np.ones((2, 3), np.float32))
            grad, = tf.compat.v1.gradients(tf.reduce_mean(x * x), [x])
    finally:
        tf_private.set_gradients_helper(helper)
        tf_private.set_registered_gradient("Mean", mean_gradient)
    assert calls == ["gradients", "Mean"]
    assert tf_private.gradients_helper() is helper
    assert tf_private.registered_gradient("Mean") is mean_gradient
    np.testing.assert_allclose(_run(graph, grad), np.full((2, 3), 2.0 / 6))


# ---- (b) nothing else in parallax/ uses TensorFlow's privates ---------------------------------

def _modules():
    for root, _, files in os.walk(PARALLAX):
        for name in sorted(files):
            path = os.path.join(root, name)
            if name.endswith(".py") and path != TF_PRIVATE:
                yield os.path.relpath(path, PARALLAX), path


def _parallax_private_names():
    """The underscore names Parallax itself defines (functions, classes, attributes set,
    module constants, fields): reading one of those is not TensorFlow's business."""
    names = set()
    for _, path in _modules():
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
    return {n for n in names if n.startswith("_")}


def test_only_tf_private_uses_tensorflow_private_api():
    tf_names = {part for _, d, _ in tf_private.PRIVATE_NAMES for part in d.split(".")
                if part.startswith("_")}
    # a name TensorFlow keeps private, as an attribute or a getattr/hasattr string
    known = re.compile(r"""[.'"](%s)\b""" % "|".join(sorted(tf_names)))
    own = _parallax_private_names() - tf_names
    problems = []
    for relative, path in _modules():
        with open(path) as f:
            source = f.read()
        for number, line in enumerate(source.splitlines(), 1):
            where = f"parallax/{relative}:{number}: {line.strip()}"
            if "tensorflow.python" in line or "protected-access" in line:
                problems.append(where)
            for match in known.finditer(line):
                problems.append(where)
        # any other `x._name` whose name Parallax does not define is someone else's private
        for node in ast.walk(ast.parse(source)):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and node.attr not in own
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls"))):
                problems.append(f"parallax/{relative}:{node.lineno}: .{node.attr}")
    assert problems == [], ("TensorFlow's private API outside parallax/tf_private.py (add a "
                            "wrapper there):\n" + "\n".join(problems))
