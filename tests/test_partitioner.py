"""parallax.get_partitioner: min_partitions outside a job; the driver's cost model picks the
count under search_partitions, workers read it, and a worker building another graph is stopped."""

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.planning import cost
from parallax.planning.analysis import analyze
from parallax.planning.planner import measure_and_decide
from parallax.cluster import Cluster
from parallax.config import PlanOptions
from parallax.errors import ParallaxError
from parallax import contracts
from parallax.partitioner import check_counts, partitioned_variables
from parallax.planning.describe import describe
from parallax.planning.job_plan import Sync, make_plan


def _graph(min_partitions=1, vocab=100_000, name="table"):
    graph = tf.Graph()
    with graph.as_default():
        ids = np.random.RandomState(0).randint(0, vocab, size=(64, 1000)).astype(np.int64)
        batch = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices(ids)).get_next()
        table = tf.compat.v1.get_variable(
            name, [vocab, 64], partitioner=parallax.get_partitioner(min_partitions))
        w = tf.compat.v1.get_variable("w", [64, 1])
        looked_up = tf.compat.v1.nn.embedding_lookup(table, batch, partition_strategy="div")
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(tf.matmul(looked_up, w)))
    return graph


def test_outside_a_job_a_variable_has_min_partitions_at_most_one_a_row():
    graph = _graph(min_partitions=3)
    assert [(p.name, p.shards) for p in partitioned_variables(graph)] == [
        ("table", ["table/part_0", "table/part_1", "table/part_2"])]
    assert len(partitioned_variables(_graph(min_partitions=5, vocab=3))[0].shards) == 3
    with pytest.raises(ValueError, match="min_partitions must be a whole number >= 1"):
        parallax.get_partitioner(0)


def test_the_driver_splits_a_large_table_over_both_machines_and_workers_build_it_so(
        monkeypatch):
    graph = _graph()
    decision = measure_and_decide(graph, analyze(graph), [2, 2], run_option="HYBRID", search_partitions=True)
    assert decision.partitions == [(0, "table", 2)]
    assert decision.methods["table/part_0"] == cost.Method(cost.PS, (0,))
    assert decision.methods["table/part_1"] == cost.Method(cost.PS, (1,))
    assert decision.methods["w"] == cost.Method(cost.ALLREDUCE)
    assert "partitions: table in 2" in decision.note
    # Each shard's statistics are half the table's: describe() finds every variable.
    assert decision.stats["table/part_1"].nbytes == 100_000 * 256 // 2

    for name, value in contracts.plan_env([], decision.partitions).items():
        monkeypatch.setenv(name, value)
    worker_graph = _graph()
    assert len(partitioned_variables(worker_graph)[0].shards) == 2
    check_counts(worker_graph, decision.partitions)
    plan = make_plan(analyze(worker_graph), PlanOptions(search_partitions=True),
                     Cluster(worker_machines=[0, 0, 1, 1], servers=["a:1", "b:1"]),
                     decision=decision)
    assert [(p.sync, p.server) for p in plan.variables.values()] == [
        (Sync.PS, 0), (Sync.PS, 1), (Sync.ALLREDUCE, None)]
    # The plan is HYBRID's, not AUTO's: the model chose only its servers and shards.
    header, note = describe(plan).splitlines()[:2]
    assert header.startswith("Parallax plan: run_option=HYBRID, 4 workers")
    assert note.startswith("servers and shards: cost model")


def test_a_run_options_rule_is_kept_and_small_tables_stay_whole():
    graph = _graph(vocab=1000)
    decision = measure_and_decide(graph, analyze(graph), [2, 2], run_option="AR", search_partitions=True)
    assert decision.methods["table/part_0"].how == cost.ALLGATHER
    assert decision.partitions == [(0, "table", 1)]


def test_a_worker_whose_graph_differs_from_the_drivers_is_stopped(monkeypatch):
    graph = _graph()
    decision = measure_and_decide(graph, analyze(graph), [2, 2], run_option="HYBRID", search_partitions=True)
    for name, value in contracts.plan_env([], decision.partitions).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ParallaxError, match="call 0 made 'other' in 2 shards in this worker, "
                                            "but 'table' in 2 in the driver"):
        check_counts(_graph(name="other"), decision.partitions)


def test_a_checkpoint_of_the_shards_reads_back_into_the_single_device_variable(tmp_path):
    value = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)

    def sliced(shape, dtype=None, partition_info=None):
        offset = partition_info.var_offset[0] if partition_info is not None else 0
        return tf.constant(value[offset:offset + shape[0]], dtype=dtype)

    with tf.Graph().as_default():
        table = tf.compat.v1.get_variable("table", [10, 3], initializer=sliced,
                                          partitioner=parallax.get_partitioner(3))
        rows = tf.compat.v1.nn.embedding_lookup(table, [7, 2], partition_strategy="div")
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_array_equal(session.run(rows), value[[7, 2]])
            path = tf.compat.v1.train.Saver().save(session, str(tmp_path / "model"))
    with tf.Graph().as_default():
        whole = tf.compat.v1.get_variable("table", [10, 3])
        with tf.compat.v1.Session() as session:
            tf.compat.v1.train.Saver().restore(session, path)
            np.testing.assert_array_equal(session.run(whole), value)


def test_a_partitioned_variable_shared_by_reuse_is_refused_under_search_partitions():
    graph = tf.Graph()
    with graph.as_default():
        for _ in range(2):  # the second call reuses the shards and makes no variable
            with tf.compat.v1.variable_scope("shared", reuse=tf.compat.v1.AUTO_REUSE):
                tf.compat.v1.get_variable("table", [100, 4],
                                          partitioner=parallax.get_partitioner(2))
    with pytest.raises(ParallaxError, match="a call that reuses a partitioned variable"):
        partitioned_variables(graph)
