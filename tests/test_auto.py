"""run_option='AUTO' in the driver: the probe of the input and the decision it leads to."""
import numpy as np
import tensorflow as tf

import parallax  # noqa: F401  (records gradients)
from parallax import cost
from parallax.analysis import analyze
from parallax.auto import Decision, decide

TWO_BY_TWO = [2, 2]  # workers of each machine


def _graph(vocab, ids_per_batch, feed=False):
    graph = tf.Graph()
    with graph.as_default():
        if feed:
            ids = tf.compat.v1.placeholder(tf.int64, [None])
        else:
            rng = np.random.RandomState(0)
            dataset = tf.data.Dataset.from_tensor_slices(
                rng.randint(0, vocab, size=(64, ids_per_batch)).astype(np.int64))
            ids = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        table = tf.compat.v1.get_variable("table", [vocab, 64])
        w = tf.compat.v1.get_variable("w", [64, 1])
        loss = tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(table, ids), w))
        tf.compat.v1.train.AdamOptimizer().minimize(loss)
    return graph


def test_rows_are_measured_on_as_many_batches_as_workers():
    graph = _graph(vocab=100_000, ids_per_batch=500)
    decision = decide(graph, analyze(graph), TWO_BY_TWO)
    stats = decision.variable_stats()["table"]
    assert stats.rows == 500 and stats.row_bytes == 256 and stats.index_bytes == 8
    assert len(stats.unique) == 4 and 490 < stats.unique[0] <= 500
    assert stats.unique[0] < stats.unique[1] < stats.unique[3] <= 2000
    assert decision.methods["table"]["how"] == cost.PS
    assert decision.methods["w"]["how"] == cost.ALLREDUCE
    assert Decision(**{**decision.__dict__}).variable_stats() == decision.variable_stats()


def test_a_table_every_batch_reads_whole_is_allreduced():
    graph = _graph(vocab=1000, ids_per_batch=20_000)
    decision = decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.variable_stats()["table"].unique == (1000,) * 4
    assert decision.methods["table"] == {"how": cost.ALLREDUCE, "server": None}


def test_a_fed_graph_gets_hybrids_rule_and_says_why():
    graph = _graph(vocab=1000, ids_per_batch=0, feed=True)
    decision = decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.methods["table"]["how"] == cost.PS and decision.stats == {}
    assert decision.note.startswith("HYBRID's rule: the input could not be read")
