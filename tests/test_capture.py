"""Capture records each variable's gradient exactly as autodiff produced it."""
import numpy as np
import pytest
import tensorflow as tf

import parallax  # noqa: F401  (installs the capture hook)
from parallax.contracts import read_gradients


def _model(use_resource=True):
    ids = tf.constant([[1, 2], [2, 3]], dtype=tf.int64)
    x = tf.constant(np.ones((2, 3), np.float32))
    embedding = tf.compat.v1.get_variable("embedding", [5, 3], use_resource=use_resource)
    w = tf.compat.v1.get_variable("w", [3, 1], use_resource=use_resource)
    h = x + tf.reduce_sum(tf.nn.embedding_lookup(embedding, ids), axis=1)
    return tf.reduce_sum(tf.matmul(h, w)), embedding, w


@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
def test_optimizer_minimize_records_dense_and_sparse(use_resource):
    graph = tf.Graph()
    with graph.as_default():
        loss, embedding, w = _model(use_resource)
        tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
    records = {r.variable: r for r in read_gradients(graph)}
    assert set(records) == {"embedding", "w"}
    assert records["embedding"].is_sparse and records["embedding"].indices
    assert not records["w"].is_sparse and records["w"].dense


def test_tf_gradients_and_subclassed_optimizer_are_recorded():
    class ScaledSGD(tf.compat.v1.train.GradientDescentOptimizer):
        def compute_gradients(self, loss, var_list=None, **kwargs):
            return [(g * 2.0, v) for g, v in super().compute_gradients(loss, var_list, **kwargs)]

    graph = tf.Graph()
    with graph.as_default():
        loss, embedding, w = _model()
        (grad_embedding,) = tf.compat.v1.gradients(loss, [embedding])
        ScaledSGD(0.1).minimize(loss, var_list=[w])
    records = read_gradients(graph)
    assert [r.variable for r in records] == ["embedding", "w"]
    assert records[0].values == grad_embedding.values.name
    # The subclass scales after autodiff: the record is autodiff's own gradient.
    assert graph.get_tensor_by_name(records[1].dense).op.type != "Mul"


def test_record_is_the_gradient_before_user_clipping():
    graph = tf.Graph()
    with graph.as_default():
        loss, _, w = _model()
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        grads_and_vars = optimizer.compute_gradients(loss, var_list=[w])
        clipped, _ = tf.clip_by_global_norm([g for g, _ in grads_and_vars], 1.0)
        optimizer.apply_gradients(zip(clipped, [w]))
    (record,) = read_gradients(graph)
    assert record.dense == grads_and_vars[0][0].name
    assert record.dense != clipped[0].name


def test_records_survive_metagraph_export_and_import():
    graph = tf.Graph()
    with graph.as_default():
        loss, _, _ = _model()
        tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        meta_graph = tf.compat.v1.train.export_meta_graph()
    imported = tf.Graph()
    with imported.as_default():
        tf.compat.v1.train.import_meta_graph(meta_graph)
    assert read_gradients(imported) == read_gradients(graph)
    for record in read_gradients(imported):
        for name in record.tensor_names():
            imported.get_tensor_by_name(name)


def test_gradients_inside_control_flow_record_only_variables():
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        x = tf.constant(3.0)
        loss = tf.while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, acc * w * x),
                             [0, tf.constant(1.0)])[1]
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    assert [r.variable for r in read_gradients(graph)] == ["w"]

