"""The passes rewrite a copy of the user's graph: the user's graph object stays the
single-device graph (for TensorBoard, meta graphs and Savers), and the runner finds its elements
in the copy, including ops built after get_runner."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import WORKLOADS, run_job
from parallax.graph_copy import copy_graph
from parallax.rewriting.graph_map import GraphMap


def _user_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_sum(w * x, name="loss")
        queue = tf.queue.FIFOQueue(4, tf.float32)
        tf.compat.v1.train.add_queue_runner(
            tf.compat.v1.train.QueueRunner(queue, [queue.enqueue([1.0])]))
    return graph, x, w, loss


def test_the_copy_has_the_ops_and_collections_and_nothing_else():
    graph, _, _, _ = _user_graph()
    copy = copy_graph(graph)
    assert [op.name for op in copy.get_operations()] == [
        op.name for op in graph.get_operations()]
    assert [op.device for op in copy.get_operations()] == [
        op.device for op in graph.get_operations()]
    assert [v.op.name for v in copy.get_collection("variables")] == ["w"]
    assert len(copy.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS)) == 1


def test_a_graph_with_updates_inside_tf_cond_is_copied_and_trains_the_same():
    """apply_gradients in a tf.cond branch (control flow v2) lists its op, which lives in the
    branch's function, in the outer graph's train_op collection: TensorFlow's own import of
    that meta graph fails on it."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
        step = tf.compat.v1.train.get_or_create_global_step()
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        grads_and_vars = optimizer.compute_gradients(tf.reduce_sum(w * w))
        applied = tf.cond(tf.equal(step % 2, 0),
                          lambda: tf.group(optimizer.apply_gradients(grads_and_vars)), tf.no_op)
        with tf.control_dependencies([applied]):
            train_op = step.assign_add(1)
        current = w.read_value()
        init = tf.compat.v1.global_variables_initializer()
    copy = copy_graph(graph)
    values = []
    for g in (graph, copy):
        with tf.compat.v1.Session(graph=g) as session:
            session.run(g.get_operation_by_name(init.name))
            for _ in range(3):
                session.run(g.as_graph_element(train_op.name))
            values.append(session.run(g.get_tensor_by_name(current.name)))
    np.testing.assert_array_equal(values[1], values[0])
    np.testing.assert_array_equal(values[0], [0.0, 0.0])  # updated at steps 0 and 2


def test_ops_built_later_are_copied_with_their_inputs_and_control_inputs(tmp_path):
    graph, x, w, loss = _user_graph()
    copy = copy_graph(graph)
    with copy.as_default():  # a pass's op, taking the name the user's next identity gets
        tf.identity(copy.get_tensor_by_name("loss:0"), name="Identity")
    graphs = GraphMap(graph, copy)
    with graph.as_default():
        doubled = tf.identity(loss * 2, name="Identity")
        branch = tf.cond(loss > 0, lambda: loss + 1, lambda: loss - 1)  # a new function
        with tf.control_dependencies([w.initializer]):
            after_init = tf.identity(loss, name="after_init")
        init = tf.compat.v1.global_variables_initializer()
        saver = tf.compat.v1.train.Saver()
    session = tf.compat.v1.Session(graph=copy)
    session.run(graphs.find(init))
    found = graphs.find(doubled)
    assert found.graph is copy and found.name == "Identity_1:0"  # renamed: the pass had it
    assert session.run([found, graphs.find(branch)], {graphs.find(x): [1.0, 2.0]}) == [6.0, 4.0]
    assert graphs.find(after_init).op.control_inputs == [
        copy.get_operation_by_name(w.initializer.name)]
    path = str(tmp_path / "ckpt")
    save = graphs.find(graph.get_tensor_by_name(saver.saver_def.save_tensor_name))
    filename = graphs.find(graph.get_tensor_by_name(saver.saver_def.filename_tensor_name))
    assert session.run(save, {filename: path}) == path.encode()
    assert graphs.find(loss) is copy.get_tensor_by_name("loss:0")


# Loads what the job wrote in a process that has TensorFlow and not Horovod or Parallax.
_LOAD = """
import glob, json, os, sys
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
out = sys.argv[1]
found = {}
for name in ("model-5.meta", "later.meta", "exported.meta"):
    graph = tf.Graph()
    with graph.as_default():
        saver = tf.compat.v1.train.import_meta_graph(os.path.join(out, name))
        with tf.compat.v1.Session(graph=graph) as session:
            saver.restore(session, os.path.join(out, "model-5") if name == "exported.meta"
                          else os.path.join(out, name[:-len(".meta")]))
            variables = tf.compat.v1.global_variables()
            found[name] = {"ops": [op.name for op in graph.get_operations()],
                           "types": sorted({op.type for op in graph.get_operations()}),
                           "values": {v.op.name: session.run(v).tolist() for v in variables}}
for folder in ("events", "runner_events"):
    (events,) = glob.glob(os.path.join(out, folder, "events.out.tfevents.*"))
    for event in tf.compat.v1.train.summary_iterator(events):
        if event.graph_def:
            graph_def = tf.compat.v1.GraphDef.FromString(event.graph_def)
            found[folder] = {"ops": [n.name for n in graph_def.node],
                             "types": sorted({n.op for n in graph_def.node})}
print(json.dumps(found))
"""


@pytest.mark.job
def test_files_a_script_writes_hold_the_single_device_graph(tmp_path):
    """HYBRID on two machines (Horovod's allreduce and parameter servers in the graph that
    runs): the FileWriter's graph, the Savers' meta graphs (one Saver built after
    get_runner) and export_meta_graph hold the user's graph, which loads and restores where
    neither Horovod nor Parallax is imported; the checkpoint holds what the workers trained."""
    result = run_job(os.path.join(WORKLOADS, "user_files.py"), "127.0.0.1:0;127.0.0.2:0",
                     "HYBRID", str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "skipped: Parallax initializes the variables" in result.stdout
    loaded = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path)], capture_output=True,
                            text=True, timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    found = json.loads(loaded.stdout.splitlines()[-1])
    trained = np.load(tmp_path / "values.npz")
    for name, what in found.items():
        assert not [t for t in what["types"] if t.startswith(("Horovod", "Collective"))], name
        assert not [op for op in what["ops"] if op.startswith("parallax")], name
        assert any(op.startswith("embedding_norm") for op in what["ops"]), name  # built later
        for variable, value in what.get("values", {}).items():
            np.testing.assert_allclose(value, trained[variable], rtol=1e-6,
                                       err_msg=f"{name}: {variable}")
    assert found["events"]["ops"] == found["runner_events"]["ops"]
    assert "w/Adam" in found["model-5.meta"]["values"]


def test_ops_built_later_in_a_graph_with_functions_are_found():
    """A moving average starts from its variable's initialized_value(), a tf.cond whose branches
    are functions of the graph, which the copy has too: ops built after get_runner (a Saver, an
    evaluation) are imported without them."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
        average = tf.compat.v1.train.ExponentialMovingAverage(0.9)
        average.apply([w])
    graphs = GraphMap(graph, copy_graph(graph))
    with graph.as_default():
        later = tf.reduce_sum(w * 3.0 + average.average(w), name="later")
    copy = graphs.copy
    with tf.compat.v1.Session(graph=copy) as session:
        session.run([v.initializer for v in copy.get_collection("variables")])
        assert session.run(graphs.find(later)) == 8.0


def test_a_lookup_built_later_keeps_its_colocation_with_the_table():
    """An evaluation's embedding lookup, built after get_runner, is colocated with its table,
    an op the copy already has (TensorFlow's import alone refuses that)."""
    graph = tf.Graph()
    with graph.as_default():
        table = tf.compat.v1.get_variable("table", initializer=[[1.0], [2.0], [3.0]])
    graphs = GraphMap(graph, copy_graph(graph))
    with graph.as_default():
        lookup = tf.nn.embedding_lookup(table, [2, 0])
    copied = graphs.find(lookup)
    gather = graphs.copy.get_operation_by_name("embedding_lookup")
    assert gather.colocation_groups() == [b"loc:@table"]
    with tf.compat.v1.Session(graph=graphs.copy) as session:
        session.run([v.initializer for v in graphs.copy.get_collection("variables")])
        np.testing.assert_array_equal(session.run(copied), [[3.0], [1.0]])
