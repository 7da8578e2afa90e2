"""A variable split in row shards inside the transformed graph (passes/split_variables.py) trains,
saves and restores exactly as the whole variable does, on one device: for every TF1 optimizer,
with clipping, a Keras Embedding, the user-shaped graphs, a Saver built before or after. What
the rules do not cover is not splittable, and says why."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.client.session import SessionInterface

import parallax  # noqa: F401  (records gradients)
from conftest import load_workload
from parallax.planning.analysis import analyze
from parallax.errors import ParallaxError
from parallax.graph_copy import copy_graph
from parallax.rewriting.graph_map import GraphMap
from parallax.planning.split_rules import splittable
from parallax.rewriting.split_variables import copy_and_split, split_variables

user_graphs = load_workload("user_graphs")

OPTIMIZERS = {
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.5),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.5, 0.9),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.5),
    "rmsprop": lambda: tf.compat.v1.train.RMSPropOptimizer(0.1, momentum=0.5),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1),
    "adadelta": lambda: tf.compat.v1.train.AdadeltaOptimizer(1.0),
    "proximal-adagrad": lambda: tf.compat.v1.train.ProximalAdagradOptimizer(0.5),
}
VOCAB = 10


def _model(optimizer, clip=False, keras_embedding=False):
    """A table looked up by fed ids, a dense layer, the optimizer's update (after clipping by
    the global norm), a moving average of the variables and a Saver: a single-device graph."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        ids = tf.compat.v1.placeholder(tf.int64, [None, 5], name="ids")
        if keras_embedding:
            import keras
            looked_up = keras.layers.Embedding(VOCAB, 4, name="table")(ids)
        else:
            table = tf.compat.v1.get_variable("table", [VOCAB, 4])
            looked_up = tf.nn.embedding_lookup(table, ids)
        w = tf.compat.v1.get_variable("w", [4, 1])
        prediction = tf.matmul(tf.reduce_mean(looked_up, 1), w)
        loss = tf.reduce_mean(tf.square(prediction - 1.0), name="loss")
        opt = OPTIMIZERS[optimizer]()
        grads_and_vars = opt.compute_gradients(loss)
        if clip:
            grads, variables = zip(*grads_and_vars)
            grads, _ = tf.clip_by_global_norm(grads, 0.05)
            grads_and_vars = list(zip(grads, variables))
        with tf.control_dependencies([opt.apply_gradients(grads_and_vars)]):
            tf.compat.v1.train.ExponentialMovingAverage(0.9).apply(
                tf.compat.v1.trainable_variables()).name  # pylint: disable=expression-not-assigned
            tf.no_op(name="train")
        tf.compat.v1.train.Saver()
    return graph


class _Runner(SessionInterface):
    """A session of `copy` that takes the user's graph's fetches, as ParallaxRunner does (a
    Saver's too)."""

    def __init__(self, user_graph, copy):
        self.graphs = GraphMap(user_graph, copy)
        self.session = tf.compat.v1.Session(graph=copy)
        with copy.as_default():
            self.session.run(tf.compat.v1.global_variables_initializer())

    @property
    def graph(self):
        return self.graphs.user

    def find(self, element, aggregated=None):
        if isinstance(element, str):
            element = self.graphs.user.as_graph_element(element)
        if isinstance(element, tf.Variable):
            element = element.graph.as_graph_element(element)
        return self.graphs.find(element, aggregated)

    def run(self, fetches, feed_dict=None):
        # A fetch, on one device: no gradient has an aggregate.
        return self.session.run(tf.nest.map_structure(lambda e: self.find(e, {}), fetches),
                                {self.find(k): v for k, v in (feed_dict or {}).items()})

    def variables(self):
        with self.graphs.user.as_default():
            variables = tf.compat.v1.global_variables()
        return dict(zip([v.op.name for v in variables], self.run(variables)))


def _split(graph, shards):
    copy = copy_graph(graph)
    if shards > 1:
        split_variables(copy, {info.name: shards for info in analyze(graph).sparse})
    return copy


def _train(graph, shards, path):
    runner = _Runner(graph, _split(graph, shards))
    rng = np.random.RandomState(0)
    losses = [runner.run(["loss:0", "train"], {"ids:0": rng.randint(0, VOCAB, (3, 5))})[0]
              for _ in range(4)]
    runner.run("save/control_dependency:0", {"save/Const:0": path})
    return np.array(losses), runner


@pytest.mark.parametrize("keras_embedding", [False, True], ids=["lookup", "keras-embedding"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_table_split_in_shards_trains_and_saves_as_the_whole_table(tmp_path, optimizer,
                                                                    keras_embedding):
    graph = _model(optimizer, clip=not keras_embedding, keras_embedding=keras_embedding)
    assert analyze(graph).sparse and splittable(graph, [analyze(graph).sparse[0].name]) is None
    expected_losses, whole = _train(graph, 1, str(tmp_path / "whole"))
    losses, split = _train(graph, 3, str(tmp_path / "split"))
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5, atol=1e-6)
    expected = whole.variables()
    for name, value in split.variables().items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # The checkpoint has the single-device names and shapes: it loads into the original graph.
    saved = tf.compat.v1.train.NewCheckpointReader(str(tmp_path / "split"))
    reference = tf.compat.v1.train.NewCheckpointReader(str(tmp_path / "whole"))
    assert saved.get_variable_to_shape_map() == reference.get_variable_to_shape_map()
    for name in reference.get_variable_to_shape_map():
        np.testing.assert_allclose(saved.get_tensor(name), reference.get_tensor(name),
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    # A single-device checkpoint restores into the shards.
    fresh = _Runner(graph, _split(graph, 3))
    fresh.run("save/restore_all", {"save/Const:0": str(tmp_path / "whole")})
    for name, value in fresh.variables().items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, err_msg=name)


# Not split: cond, cond_split and rnn_loop use the table in tf.compat.v1 control flow,
# references in a reference variable (splittable_in_turn keeps them whole, saying why).
@pytest.mark.parametrize("shape", sorted(set(user_graphs.SHAPES)
                                         - {"cond", "cond_split", "references", "rnn_loop"}))
def test_user_shaped_graphs_train_split_as_whole(shape, tmp_path, monkeypatch):
    """gan (two optimizers), accumulate (a dense apply of accumulated gradients), cifar10
    (gradient histograms, moving averages), summary (histograms fetched alone), restore (a
    Saver's restore mid-training)."""
    monkeypatch.setenv("USER_GRAPHS_CHECKPOINTS", str(tmp_path))
    graph, inputs, loop = user_graphs._build(shape)
    expected, expected_fetched = user_graphs.train_single_device(shape, 1)
    runner = _Runner(graph, _split(graph, 3))
    fetched = loop(runner.run, user_graphs._feeder(inputs, 1, 0), True)
    np.testing.assert_allclose(fetched, expected_fetched, rtol=1e-5)
    for name, value in runner.variables().items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_saver_built_after_the_split_saves_the_table_whole(tmp_path):
    graph = _model("adagrad")
    runner = _Runner(graph, _split(graph, 2))
    with graph.as_default():
        saver = tf.compat.v1.train.Saver(name="later")  # built after get_runner, as tutorials do
    path = runner.run(saver.saver_def.save_tensor_name,
                      {saver.saver_def.filename_tensor_name: str(tmp_path / "later")})
    saved = tf.compat.v1.train.NewCheckpointReader(path.decode()).get_variable_to_shape_map()
    assert saved["table"] == [VOCAB, 4] and saved["table/Adagrad"] == [VOCAB, 4]
    assert not [name for name in saved if "part_" in name]


def test_a_gradient_of_a_split_table_is_fetched_as_the_whole_tables_but_not_fed():
    graph = tf.Graph()
    with graph.as_default():
        table = tf.compat.v1.get_variable("table", [VOCAB, 4])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, [1, 4, 1, 7]))
        ((grad, _),) = tf.compat.v1.train.GradientDescentOptimizer(0.1).compute_gradients(loss)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients([(grad, table)])
        dense = tf.convert_to_tensor(grad)
        rows_norm = tf.nn.l2_loss(grad.values)  # computed per shard, summed
    runner = _Runner(graph, _split(graph, 2))
    expected = np.zeros([VOCAB, 4])
    expected[1], expected[4], expected[7] = 2, 1, 1
    np.testing.assert_allclose(runner.run(dense), expected)
    np.testing.assert_allclose(runner.run(rows_norm), 4 * 4 / 2)  # 4 rows of four ones
    # A fetch gets the same sum of the shards' norms as an op built later would read (the
    # replaced op computes the worker's own gradient, not the aggregate, on several workers).
    assert runner.find(rows_norm, {}) is runner.find(rows_norm) is not rows_norm
    # Its rows and ids, stitched from both shards (ids 4 | 1, 1, 7): the same sparse tensor.
    values, indices = runner.run([grad.values, grad.indices])
    assert sorted(indices.tolist()) == [1, 1, 4, 7]
    fetched = np.zeros([VOCAB, 4])
    np.add.at(fetched, indices, values)
    np.testing.assert_allclose(fetched, expected)
    with pytest.raises(ParallaxError, match="can be fetched, but not fed"):
        runner.run(dense, {grad.values: np.zeros([4, 4])})


def _refused(build):
    graph = tf.Graph()
    with graph.as_default():
        table = build()
    return splittable(graph, [table])


def test_what_the_rules_do_not_cover_is_not_split_and_says_why():
    def in_a_loop():
        table = tf.compat.v1.get_variable("table", [VOCAB, 4])
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(
            tf.reduce_sum(tf.nn.embedding_lookup(table, [1])))
        tf.while_loop(lambda i, s: i < 3, lambda i, s: (  # an evaluation, decoding a step a turn
            i + 1, s + tf.reduce_sum(tf.nn.embedding_lookup(table, [i]))), [0, 0.0])
        return "table"

    def reference_variable():
        table = tf.compat.v1.Variable(tf.zeros([VOCAB, 4]), use_resource=False, name="table")
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(
            tf.reduce_sum(tf.nn.embedding_lookup(table, [1])))
        return "table"

    def tied_embedding():
        table = tf.compat.v1.get_variable("table", [VOCAB, 4])
        logits = tf.matmul(tf.nn.embedding_lookup(table, [1, 2]), table, transpose_b=True)
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(logits))
        return "table"

    def rows_read_in_order():
        table = tf.compat.v1.get_variable("table", [VOCAB, 4])
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        ((grad, var),) = opt.compute_gradients(tf.reduce_sum(tf.nn.embedding_lookup(table, [3])))
        first_row = grad.values[:1]  # depends on the rows' order
        opt.apply_gradients([(tf.IndexedSlices(grad.values * tf.reduce_sum(first_row),
                                               grad.indices, grad.dense_shape), var)])
        return "table"

    assert "While 'while' uses 'table'" in _refused(in_a_loop)
    assert "reference variable" in _refused(reference_variable)
    assert "dense gradient" in _refused(tied_embedding)
    assert "StridedSlice" in _refused(rows_read_in_order)
    assert "If 'cond' uses 'model/emb' (or its slot)" in user_graphs_refusal("cond")
    assert "reference variable" in user_graphs_refusal("references")


def user_graphs_refusal(shape):
    graph, _, _ = user_graphs._build(shape)
    return splittable(graph, [info.name for info in analyze(graph).sparse])


def test_an_update_waiting_for_another_split_tables_update_waits_for_all_its_shards():
    """Fetching `a`'s update, whose ops wait for `b`'s update, runs every shard of `b`'s too,
    though `b` has more shards than `a`: another table's shard j holds other rows."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        a = tf.compat.v1.get_variable("a", [VOCAB, 4])
        b = tf.compat.v1.get_variable("b", [VOCAB, 4])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(a, [1, 2, 3])) + tf.reduce_sum(
            tf.nn.embedding_lookup(b, [0, 1, 2, 3, 4, 5]))
        (grad_a, grad_b) = tf.compat.v1.gradients(loss, [a, b])
        update_b = tf.compat.v1.scatter_sub(b, grad_b.indices, grad_b.values).op
        with tf.control_dependencies([update_b]):  # SGD steps, a's after b's
            update_a = tf.compat.v1.scatter_sub(a, grad_a.indices, grad_a.values).op
    whole = _Runner(graph, copy_graph(graph))
    copy = copy_graph(graph)
    split_variables(copy, {"a": 2, "b": 3})
    split = _Runner(graph, copy)
    for runner in (whole, split):
        runner.run(update_a)
    expected = whole.variables()
    for name, value in split.variables().items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, err_msg=name)


def test_ops_built_after_the_split_are_fetched_as_on_one_device():
    graph = _model("adam")
    whole = _Runner(graph, copy_graph(graph))
    split = _Runner(graph, _split(graph, 3))
    with graph.as_default():  # built after get_runner, as an evaluation is
        table = [v for v in tf.compat.v1.global_variables() if v.op.name == "table"][0]
        value = table.read_value()
        lookup = tf.nn.embedding_lookup(table, [[9, 0], [4, 4]])
    for runner in (whole, split):
        runner.run("train", {"ids:0": np.arange(15).reshape(3, 5) % VOCAB})
    np.testing.assert_allclose(split.run(value), whole.run(value), rtol=1e-6)
    np.testing.assert_allclose(split.run(lookup), whole.run(lookup), rtol=1e-6)
    split.run(lookup.op)  # the op itself: what stands for it runs


def test_an_update_with_another_tables_ids_is_not_split():
    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.get_variable("a", [VOCAB, 4])
        b = tf.compat.v1.get_variable("b", [VOCAB, 4])
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        loss = tf.reduce_sum(tf.nn.embedding_lookup(a, [1]) * tf.nn.embedding_lookup(b, [2]))
        (grad_a, _), (grad_b, _) = opt.compute_gradients(loss, [a, b])
        opt.apply_gradients([(grad_a, a), (grad_b, b)])
        tf.compat.v1.scatter_add(b, grad_a.indices, grad_a.values)  # a's rows into b
    assert "ResourceScatterAdd 'ResourceScatterAdd' uses 'b'" in splittable(graph, ["a", "b"])


def test_a_later_graph_splits_what_it_can_and_the_decided_one_names_what_it_cannot():
    splits = {"table": 2}
    frozen = tf.Graph()  # a later stage of training: the table frozen, a new layer trained
    with frozen.as_default():
        table = tf.compat.v1.get_variable("table", [VOCAB, 4], trainable=False)
        w = tf.compat.v1.get_variable("w", [4, 1])
        tf.compat.v1.train.AdamOptimizer(0.1).minimize(
            tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(table, [1]), w)))
    copy, analysis = copy_and_split(frozen, analyze(frozen), splits, planned=False)
    assert "table" in analysis.all_variables and not [
        op for op in copy.get_operations() if "part_" in op.name]
    with pytest.raises(ParallaxError, match="the driver split table.*no gradient in this graph"):
        copy_and_split(frozen, analyze(frozen), splits, planned=True)
    copy, analysis = copy_and_split(_model("adam"), analyze(_model("adam")), splits,
                                    planned=False)
    assert {"table/part_0", "table/part_1"} <= set(analysis.variables)


def test_a_later_graph_keeps_whole_what_splits_alone_but_not_with_the_others():
    """b.assign(a) (a copy of one table into another) splits with either table split, not
    both: a split b would be assigned a's rows whole."""
    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.get_variable("a", [VOCAB, 4])
        b = tf.compat.v1.get_variable("b", [VOCAB, 4])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(a, [1]) * tf.nn.embedding_lookup(b, [2]))
        tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        b.assign(a)
    assert splittable(graph, ["a"]) is None and splittable(graph, ["b"]) is None
    assert "AssignVariableOp" in splittable(graph, ["a", "b"])
    _, analysis = copy_and_split(graph, analyze(graph), {"a": 2, "b": 2}, planned=False)
    assert {"a/part_0", "a/part_1", "b"} <= set(analysis.variables)
    assert "a" not in analysis.variables and "b/part_0" not in analysis.variables


def test_the_word2vec_tutorial_trains_split_as_whole():
    """word2vec_basic's graph (examples/word2vec.py): NCE over split weights and biases, a loss
    summary, a Saver, and the similarity of normalized embeddings, which reads the table
    whole."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(3)
        inputs = tf.compat.v1.placeholder(tf.int32, [None], name="inputs")
        labels = tf.compat.v1.placeholder(tf.int32, [None, 1], name="labels")
        embeddings = tf.Variable(tf.random.uniform([VOCAB * 5, 8], -1.0, 1.0))
        nce_weights = tf.Variable(tf.random.truncated_normal([VOCAB * 5, 8], stddev=0.3))
        nce_biases = tf.Variable(tf.zeros([VOCAB * 5]))
        loss = tf.reduce_mean(tf.nn.nce_loss(
            weights=nce_weights, biases=nce_biases, labels=labels,
            inputs=tf.nn.embedding_lookup(embeddings, inputs), num_sampled=8,
            num_classes=VOCAB * 5))
        tf.compat.v1.summary.scalar("loss", loss)
        train = tf.compat.v1.train.GradientDescentOptimizer(1.0).minimize(loss)
        normalized = embeddings / tf.sqrt(tf.reduce_sum(tf.square(embeddings), 1, keepdims=True))
        similarity = tf.matmul(tf.nn.embedding_lookup(normalized, [1, 2, 3]), normalized,
                               transpose_b=True)
        summaries = tf.compat.v1.summary.merge_all()
        tf.compat.v1.train.Saver()
    assert len(analyze(graph).sparse) == 3

    def trained(shards):
        runner, rng = _Runner(graph, _split(graph, shards)), np.random.RandomState(0)
        losses = [runner.run([loss, summaries, train], {
            inputs: rng.randint(0, VOCAB * 5, 16),
            labels: rng.randint(0, VOCAB * 5, (16, 1))})[0] for _ in range(5)]
        return losses, runner.run(similarity), runner.variables()

    (expected_losses, expected_similarity, expected), (losses, similarity_, variables) = (
        trained(1), trained(3))
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-6)
    np.testing.assert_allclose(similarity_, expected_similarity, rtol=1e-5, atol=1e-6)
    for name, value in variables.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, err_msg=name)
