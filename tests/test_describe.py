"""runner.describe(): every variable of the graph, why a gathered table is dense, and how a
dynamic embedding is partitioned."""
import tensorflow as tf

import parallax  # records the gradients
from parallax.cluster import Cluster
from parallax.config import PlanOptions
from parallax.contracts import read_tables
from parallax.planning.analysis import analyze
from parallax.planning.describe import describe
from parallax.planning.job_plan import make_plan
from parallax.planning.measure import Measurements
from parallax.planning.planner import decide
from parallax.rewriting.split_variables import copy_and_split

CLUSTER = Cluster([0, 0, 1, 1], ["a:1", "b:1"])


def _graph():
    """An embedding with an l2_loss (a DeepFM's regularizer), a table looked up only, Adam with
    a global step, a moving average of the loss, and a variable nothing trains."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        embedding = tf.compat.v1.get_variable("embedding", [100, 8])
        table = tf.compat.v1.get_variable("table", [50, 8])
        frozen = tf.compat.v1.get_variable("frozen", [3], trainable=False)
        w = tf.compat.v1.get_variable("w", [8, 1])
        rows = tf.nn.embedding_lookup(embedding, ids) + tf.nn.embedding_lookup(table, ids)
        loss = (tf.reduce_mean(tf.matmul(rows, w)) + 0.01 * tf.nn.l2_loss(embedding, name="l2")
                + tf.reduce_sum(frozen))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=global_step)
        with tf.control_dependencies([train]):
            tf.compat.v1.train.ExponentialMovingAverage(0.9, name="loss_average").apply([loss])
    return graph


def _described(run_option):
    analysis = analyze(_graph())
    return describe(make_plan(analysis, PlanOptions(run_option=run_option), CLUSTER), analysis)


def test_a_gathered_variable_made_dense_says_by_which_op_and_what_it_costs():
    lines = _described("HYBRID").splitlines()
    assert lines[1] == ("embedding: dense, its gradient adds a dense term from 'L2Loss' (op 'l2') "
                        "to its gathered rows: allreduced whole, 3200 bytes a step")
    assert not any(line.startswith("table:") for line in lines)  # sparse, on a server
    assert ("embedding: dense, its gradient adds a dense term from 'L2Loss' (op 'l2') to its "
            "gathered rows: pushed whole to server 0, 3200 bytes from each worker a step"
            in _described("PS"))


def test_every_variable_of_the_graph_is_listed_slots_under_their_variable():
    text = _described("HYBRID")
    other = text[text.index("other variables"):].splitlines()
    assert other == [
        "other variables, without a gradient of their own: 11",
        "  living and updated with their variable (slots, moving averages of it):",
        "    embedding: beta1_power, beta2_power, embedding/Adam, embedding/Adam_1",
        "    table: table/Adam, table/Adam_1",
        "    w: w/Adam, w/Adam_1",
        "  every worker, each replica updating its own copy alike, once a step: global_step",
        "  every worker, written from each worker's data, each write averaged over workers: "
        "add_2/loss_average",
        "  every worker, not written by training (worker 0's initial value): frozen"]
    # PS: global_step on the first server, updated there by the chief.
    assert "  server 0, updated there once a step, by the chief: global_step" in _described("PS")
    # Without the analysis (a plan alone), the trained variables' table only.
    assert "other variables" not in describe(make_plan(
        analyze(_graph()), PlanOptions(run_option="HYBRID"), CLUSTER))


def _table_described(cluster):
    """A string-keyed dynamic embedding trained by Adam, planned by HYBRID's rule as the
    driver plans it (the table split over every machine, nothing measured)."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.string, [None], name="ids")
        table = parallax.dynamic_embedding("user", dim=4, capacity=101, key_dtype=tf.string)
        w = tf.compat.v1.get_variable("w", [4, 1])
        tf.compat.v1.train.AdamOptimizer(0.1).minimize(tf.reduce_sum(tf.matmul(
            table.lookup(ids), w)))
    analysis, options = analyze(graph), PlanOptions(run_option="HYBRID")
    workers = [cluster.worker_machines.count(m) for m in range(cluster.num_machines)]
    decision = decide(graph, analysis, Measurements(workers, problem="nothing measured"),
                      options)
    planned = copy_and_split(graph, analysis, decision.splits)[1]
    return describe(make_plan(planned, options, cluster, decision=decision), planned,
                    read_tables(graph))


def test_a_dynamic_embedding_is_named_with_its_parts_one_on_each_server():
    lines = _table_described(CLUSTER).splitlines()
    assert lines[2] == ("user: dynamic embedding (dim 4, capacity 101, string ids): 2 parts, one "
                        "on each server (0, 1), an id's by a hash of it: 50 to 51 rows each, "
                        "with their ids' keys and the rows' slots")
    assert lines[4].startswith("user/embedding/part_0  sparse  [51, 4]  816    server 0 (a:1)")
    assert "    user/embedding/part_1: user/embedding/Adam/part_1, user/embedding/Adam_1/part_1" \
        in lines
    one_machine = _table_described(Cluster([0, 0], ["a:1"])).splitlines()
    assert one_machine[2] == ("user: dynamic embedding (dim 4, capacity 101, string ids): whole "
                              "on server 0, with its keys and the rows' slots")
