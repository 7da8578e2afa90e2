"""run_option='AUTO' in the driver: the probe of the input and the decision it leads to."""
import dataclasses
import re
import threading

import numpy as np
import pytest
import tensorflow as tf

from conftest import load_workload
import parallax  # noqa: F401  (records gradients)
from parallax import contracts, driver, launch
from parallax.planning import cost, explanation, measure, planner, proposal
from parallax.planning.analysis import analyze
from parallax.planning.job_plan import Decision
from parallax.planning.planner import measure_and_decide
from parallax.planning.problem import Cores
from parallax.cluster import Cluster
from parallax.config import Config, PlanOptions
from parallax.errors import ParallaxError
from parallax.graph_copy import copy_graph
from parallax.rewriting.split_variables import split_variables
from parallax.planning.describe import describe
from parallax.planning.job_plan import Plan, make_plan

TWO_BY_TWO = [2, 2]  # workers of each machine
TWO_MACHINES = Cluster([0, 0, 1, 1], ["server 0", "server 1"])  # the driver's plan's


def _graph(vocab, ids_per_batch, feed=False, zipf=False, device=None):
    """`zipf`: ids as words come in text, a few often and most rarely (else uniform);
    `device`: what the graph is built under (a device function)."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(device):
        if feed:
            ids = tf.compat.v1.placeholder(tf.int64, [None])
        else:
            rng = np.random.RandomState(0)
            size = (64, ids_per_batch)
            drawn = (np.minimum(rng.zipf(1.1, size), vocab) - 1 if zipf
                     else rng.randint(0, vocab, size=size))
            dataset = tf.data.Dataset.from_tensor_slices(drawn.astype(np.int64))
            ids = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        table = tf.compat.v1.get_variable("table", [vocab, 64])
        w = tf.compat.v1.get_variable("w", [64, 1])
        loss = tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(table, ids), w))
        tf.compat.v1.train.AdamOptimizer().minimize(loss)
    return graph


def test_rows_are_measured_on_as_many_batches_as_workers():
    graph = _graph(vocab=100_000, ids_per_batch=500)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    # Nearly every id of a batch distinct: an allgather brings each machine 3 workers' 500
    # rows with ids (396 kB); one server would send 2 workers ~500 rows each (256 kB), and
    # then receive the other machine's ~1000 summed rows (264 kB); the table split in two
    # shards, one a server, each machine's link carries half of both (260 kB).
    assert decision.splits == {"table": 2}
    assert decision.methods["table/part_0"].how == cost.PS
    assert decision.methods["w"].how == cost.ALLREDUCE
    stats = decision.stats["table/part_0"]  # half of the table's, as measured
    assert stats.rows == 250 and stats.row_bytes == 256 and stats.index_bytes == 8
    assert len(stats.unique) == 4 and 245 < stats.unique[0] <= 250
    assert stats.unique[0] < stats.unique[1] < stats.unique[3] <= 1000
    assert contracts.from_text(Decision, contracts.to_text(decision)) == decision  # the wire


def test_a_table_read_as_words_are_read_is_split_over_the_servers():
    # Of 500 ids a batch ~190 distinct, ~340 in two: on one server, pulls of 97 kB, then
    # pushes of 90 kB through its link; split in two shards, half of them through each.
    graph = _graph(vocab=100_000, ids_per_batch=500, zipf=True)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    stats = decision.stats
    assert stats["table/part_0"].unique[0] < 125 and stats["table/part_1"].nbytes == 100_000 * 128
    assert decision.splits == {"table": 2}
    assert decision.methods["table/part_0"] == cost.Method(cost.PS, (0,))
    assert decision.methods["table/part_1"] == cost.Method(cost.PS, (1,))
    assert "split over servers: table in 2 shards" in decision.note
    # The workers split it (passes/split_variables.py): describe() shows each shard.
    plan = make_plan(
        analyze(split_variables(copy_graph(graph), decision.splits)), PlanOptions("AUTO"),
        Cluster(worker_machines=[0, 0, 1, 1], servers=["a:1", "b:1"]), decision=decision)
    lines = describe(plan).splitlines()
    assert [line.split()[:2] for line in lines if line.startswith("table")] == [
        ["table/part_0", "sparse"], ["table/part_1", "sparse"]]


def test_a_table_the_user_partitioned_is_not_split_again():
    graph = tf.Graph()
    with graph.as_default():
        rng = np.random.RandomState(0)
        ids = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.from_tensor_slices(
            (np.minimum(rng.zipf(1.1, (64, 500)), 100_000) - 1).astype(np.int64))).get_next()
        table = tf.compat.v1.get_variable(
            "table", [100_000, 64], partitioner=tf.compat.v1.fixed_size_partitioner(2))
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(
            tf.compat.v1.nn.embedding_lookup(table, ids, partition_strategy="mod")))
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.splits == {}
    assert {decision.methods[f"table/part_{j}"].servers for j in range(2)} == {(0,), (1,)}


def test_a_split_must_be_predicted_faster_by_a_margin(monkeypatch):
    """Splitting costs what the model does not price (a partition and a stitch per lookup):
    with a margin no split can meet, the table stays whole."""
    monkeypatch.setattr(proposal, "SPLIT_MARGIN", 10.0)
    graph = _graph(vocab=100_000, ids_per_batch=500, zipf=True)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.splits == {} and decision.methods["table"].how == cost.PS


def test_split_variables_true_splits_without_measurements_and_false_never():
    fed = _graph(vocab=1000, ids_per_batch=0, feed=True)  # no probe: HYBRID's rule
    decision = measure_and_decide(fed, analyze(fed), TWO_BY_TWO, split_variables=True)
    assert decision.splits == {"table": 2}
    assert decision.methods["table/part_1"] == cost.Method(cost.PS, (1,))
    assert decision.note.endswith("split over servers: table in 2 shards")
    graph = _graph(vocab=100_000, ids_per_batch=500, zipf=True)
    assert measure_and_decide(graph, analyze(graph), TWO_BY_TWO, split_variables=False).splits == {}


def test_split_variables_true_splits_what_a_server_holds_and_keeps_the_others_methods():
    """A small table every batch reads most of: AUTO allreduces it; asked to split the
    variables on servers, it keeps it so, rather than moving it to servers to split it."""
    graph = _graph(vocab=20, ids_per_batch=32)
    links = cost.Links(bandwidth=2.6e9, latency=14e-6)  # loopback, as measured here
    chosen = measure_and_decide(graph, analyze(graph), [1, 1], links)
    split = measure_and_decide(graph, analyze(graph), [1, 1], links, split_variables=True)
    assert chosen.methods["table"].how == split.methods["table"].how == cost.ALLREDUCE
    assert split.splits == {} and "kept whole: table (not on a server: allreduce)" in split.note


def test_a_table_that_cannot_be_split_stays_whole_on_a_server():
    graph = _graph(vocab=100_000, ids_per_batch=500, zipf=True)
    with graph.as_default():  # read in a loop (an evaluation): not split
        table = [v for v in tf.compat.v1.global_variables() if v.op.name == "table"][0]
        tf.while_loop(lambda i: i < 3, lambda i: i + tf.cast(tf.reduce_sum(
            tf.nn.embedding_lookup(table, [i])) > 0, tf.int32), [0])
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.splits == {} and decision.methods["table"].how == cost.PS
    assert "kept whole: table (While 'while' uses 'table'" in decision.note
    split = measure_and_decide(graph, analyze(graph), TWO_BY_TWO, split_variables=True)  # asked: says why not
    assert split.splits == {} and "kept whole: table (While" in split.note


def _copied_tables(feed: bool) -> tf.Graph:
    """Two tables read as words are read, `small` (by a tenth of the batch) copied into
    `large` (of doubles, twice the bytes): either splits alone, not both (a split `large` would
    be assigned `small`'s rows whole)."""
    graph = tf.Graph()
    with graph.as_default():
        if feed:
            ids = tf.compat.v1.placeholder(tf.int64, [None])
        else:
            drawn = np.minimum(np.random.RandomState(0).zipf(1.1, (64, 500)), 50_000) - 1
            ids = tf.compat.v1.data.make_one_shot_iterator(
                tf.data.Dataset.from_tensor_slices(drawn.astype(np.int64))).get_next()
        small = tf.compat.v1.get_variable("small", [50_000, 64])
        large = tf.compat.v1.get_variable("large", [50_000, 64], tf.float64)
        w = tf.compat.v1.get_variable("w", [128, 1])
        features = tf.concat([tf.nn.embedding_lookup(small, ids[:50]),
                              tf.cast(tf.nn.embedding_lookup(large, ids[:50]), tf.float32)], 1)
        loss = tf.reduce_sum(tf.matmul(features, w)) + tf.cast(
            tf.reduce_sum(tf.nn.embedding_lookup(large, ids)), tf.float32)
        tf.compat.v1.train.AdamOptimizer().minimize(loss)
        large.assign(tf.cast(small, tf.float64))
    return graph


@pytest.mark.parametrize("feed,split", [(False, None), (False, True), (True, True)],
                         ids=["measured", "split-measured", "split-by-rule"])
def test_tables_that_split_alone_not_together_split_in_turn_largest_first(feed, split):
    """As a later graph splits them (split_variables.copy_and_split): the driver keeps the
    larger table split and the other whole, saying why, where it kept both whole."""
    graph = _copied_tables(feed)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO, split_variables=split)
    assert decision.splits == {"large": 2}
    assert {decision.methods[f"large/part_{j}"].servers for j in range(2)} == {(0,), (1,)}
    assert decision.methods["small"].how == cost.PS
    assert "kept whole: small (" in decision.note and "uses 'large'" in decision.note
    plan = make_plan(  # as the workers plan it, `large` split in their copy
        analyze(split_variables(copy_graph(graph), decision.splits)), PlanOptions("AUTO"),
        Cluster(worker_machines=[0, 0, 1, 1], servers=["a:1", "b:1"]), decision=decision)
    assert [line.split()[0] for line in describe(plan).splitlines()
            if line.startswith(("small", "large"))] == ["small", "large/part_0", "large/part_1"]


def test_a_table_every_batch_reads_whole_is_allreduced():
    graph = _graph(vocab=1000, ids_per_batch=20_000)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.stats["table"].unique == (1000,) * 4
    assert decision.methods["table"] == cost.Method(cost.ALLREDUCE)


def test_a_graph_written_for_tensorflows_parameter_servers_is_measured():
    """Its variables pinned to '/job:ps' by replica_device_setter, a job the driver's probe
    session does not have: the probe runs a copy whose devices name no job."""
    graph = _graph(vocab=1000, ids_per_batch=20_000,
                   device=tf.compat.v1.train.replica_device_setter(ps_tasks=2))
    assert graph.get_operation_by_name("table").device == "/job:ps/task:0"
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.stats["table"].unique == (1000,) * 4, decision.note
    assert graph.get_operation_by_name("table").device == "/job:ps/task:0"  # left as built


def test_a_fed_graph_gets_hybrids_rule_and_says_why(monkeypatch):
    graph = _graph(vocab=1000, ids_per_batch=0, feed=True)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.methods["table"].how == cost.PS and decision.stats == {}
    assert decision.note == "HYBRID's rule: the input comes through feed_dict ('Placeholder')"

    # DeepFM's graph (issue 69), fed and evaluated between its steps: the driver counts no
    # run's rows, and probes nothing the rule does not need (it spent 28 s before the workers
    # started, where HYBRID spends 5).
    def probed(*args):
        raise AssertionError(f"probed for a plan already fixed: {args}")

    for probe in ("probe_links", "probe_transport", "probe_collectives"):
        monkeypatch.setattr(launch, probe, probed)
    monkeypatch.setattr(measure, "measure_in", probed)
    graph = load_workload("click_through").build()
    options = Config(run_option="AUTO")
    plan = driver.make_job_plans(graph, analyze(graph), "localhost:0,1",
                                 options.plan_options, options.launch_settings)[0]
    assert plan.decision.stats == {} and plan.decision.note == (
        "HYBRID's rule: the input comes through feed_dict ('feat_index')")
    assert plan.decision.methods["feature_embeddings"].how == cost.PS



def _queue_graph(fill_queue=True):
    """Ids from a queue-based pipeline as TF1 tutorials build it (shuffle_batch and its queue
    runners), or from a queue that nothing in the graph fills."""
    graph = tf.Graph()
    with graph.as_default():
        if fill_queue:
            ids = tf.compat.v1.train.shuffle_batch(
                [tf.random.uniform([], 0, 1000, tf.int64, seed=1)], batch_size=64,
                capacity=256, min_after_dequeue=64, seed=1)
        else:
            ids = tf.queue.FIFOQueue(8, [tf.int64], shapes=[[64]]).dequeue()
        table = tf.compat.v1.get_variable("table", [1000, 8])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph


def test_a_queue_based_input_is_read_with_its_queue_runners_started_and_stopped():
    graph = _queue_graph()
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    stats = decision.stats
    assert sum(s.rows for name, s in stats.items() if name.startswith("table")) == 64
    assert decision.compute is not None and "one worker's step alone" in decision.note
    assert not [t for t in threading.enumerate() if t.name.startswith("QueueRunnerThread")]
    # A step this small (well under a millisecond) is not said to take "0 ms".
    alone = re.search(r"step alone ([\d.e-]+) ms", decision.note).group(1)
    assert float(alone) > 0, decision.note


def test_milliseconds_keep_two_digits_below_ten():
    assert [explanation.ms(s) for s in (0.00043, 0.0032, 0.0123, 0.1234)] == [
        "0.43 ms", "3.2 ms", "12 ms", "123 ms"]


def test_input_the_driver_waits_for_too_long_gets_hybrids_rule_and_says_why(monkeypatch):
    monkeypatch.setattr(measure, "PROBE_RUN_SECONDS", 1)
    graph = _queue_graph(fill_queue=False)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.methods["table"].how == cost.PS and decision.stats == {}
    assert decision.note == ("HYBRID's rule: the probe of the input failed: a run waited more "
                             "than 1 s (for input only the workers can read?)")


def test_the_variables_the_probe_would_allocate_count_optimizer_slots():
    graph = _graph(vocab=1000, ids_per_batch=10)
    # the table and w, each with Adam's two slots, and Adam's two beta powers
    assert measure.variables_bytes(graph) == 3 * 4 * (1000 * 64 + 64) + 2 * 4


def test_a_model_larger_than_the_drivers_free_memory_is_not_probed_and_says_why():
    graph = _graph(vocab=10 ** 9, ids_per_batch=10)  # 768 GB with Adam's slots
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.methods["table"].how == cost.PS and decision.stats == {}
    assert decision.note.startswith(
        "HYBRID's rule: the probe would allocate the graph's variables, 768 GB, more than 50% "
        "of the driver's free memory ("), decision.note


def _ema_before_gradients_graph():
    """A table read as words are read, with a moving average of it in UPDATE_OPS, which the
    train op is built to wait for (the gradients then wait for the average's update)."""
    graph = _graph(vocab=100_000, ids_per_batch=500, zipf=True)
    with graph.as_default():
        table = [v for v in tf.compat.v1.global_variables() if v.op.name == "table"][0]
        loss = graph.get_operation_by_name("Sum").outputs[0]
        average = tf.compat.v1.train.ExponentialMovingAverage(0.9).apply([table])
        with tf.control_dependencies([average]):
            tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, name="second_train_op")
    return graph


def test_a_table_whose_moving_average_the_gradients_wait_for_stays_off_the_servers():
    graph = _ema_before_gradients_graph()
    analysis = analyze(graph)
    with pytest.raises(ParallaxError, match="the gradients are computed after it"):
        # in the driver, before any launch
        make_plan(analysis, PlanOptions(run_option="HYBRID"), TWO_MACHINES)
    decision = measure_and_decide(graph, analysis, TWO_BY_TWO)
    assert decision.methods["table"].how != cost.PS
    make_plan(analysis, PlanOptions(run_option="AUTO"), TWO_MACHINES, decision=decision)


def test_an_update_inside_tf_cond_is_not_timed_and_says_why():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices(np.arange(64, dtype=np.int64)).batch(4)).get_next()
        table = tf.compat.v1.get_variable("table", [64, 4])
        step = tf.compat.v1.train.get_or_create_global_step()
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        grads = optimizer.compute_gradients(tf.reduce_sum(tf.nn.embedding_lookup(table, ids)))
        tf.cond(tf.equal(step % 2, 0), lambda: tf.group(optimizer.apply_gradients(grads)),
                tf.no_op)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.compute is None and "compute not measured (the step could not" in decision.note
    assert decision.stats["table"].rows == 4

def test_the_step_of_one_worker_is_timed_and_the_plan_predicted():
    graph = _graph(vocab=100_000, ids_per_batch=500)
    within = cost.Links(bandwidth=2.5e9, latency=20e-6)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO, cost.Links(bandwidth=1e6),
                      within_machine=within)
    assert 0 < decision.compute < 5
    stats = decision.stats
    chosen = decision.methods
    communication = cost.step_time(chosen, stats, cost.Shape(2, 2), cost.Links(bandwidth=1e6),
                                   hierarchical_allreduce=decision.machine_stages)
    # Adam's update of the whole table (100,000 x 64) is most of a step alone; on a server it
    # leaves the workers, and the server does it once.
    shards = [name for name in stats if name.startswith("table")]  # AUTO may split it
    assert sum(stats[name].update for name in shards) > stats["w"].update >= 0
    assert sum(s.update for s in stats.values()) <= 1
    assert all(0 < stats[name].ready <= 1 and chosen[name].how == cost.PS for name in shards)
    off, held = cost.server_updates(chosen, stats, cost.Shape(2, 2))
    assert decision.step == pytest.approx(
        decision.compute * (1 - off) + communication + max(held) * decision.alone)
    assert f"of which the servers' updates take {off:.0%}" in decision.note
    assert "one worker's step alone" in decision.note and "predicted step" in decision.note
    assert "ms of CPU), 2 sharing" in decision.note  # two workers a machine share its cores
    assert "links measured: 8 Mbit/s, 200 us (within a machine 20 Gbit/s, 20 us" in decision.note
    assert decision.link_model() == cost.Links(bandwidth=1e6)


def test_machines_on_one_kernel_share_its_cores():
    """The link probe's two machines on one kernel (network namespaces, containers of one
    host): every machine's workers share those cores; on two kernels each has its own."""
    one, other = {"kernel": "a", "cores": 4}, {"kernel": "b", "cores": 2}
    assert Cores.of([one, dict(one, cores=2)], 3) == Cores(2, 3)
    assert Cores.of([one, other], 3) == Cores(2, 1)
    assert Cores.of([dict(one, kernel=None)] * 2, 3) == Cores(4, 1)  # no kernel to tell
    graph = _graph(vocab=1000, ids_per_batch=50)
    separate, shared = (measure_and_decide(graph, analyze(graph), TWO_BY_TWO, cost.Links(bandwidth=1e6),
                               cores=Cores(2, kernels)) for kernels in (1, 2))
    assert "2 sharing 2 cores" in separate.note and "machines on one kernel" not in separate.note
    assert "4 sharing 2 cores (2 machines on one kernel)" in shared.note
    assert shared.compute >= shared.alone


def test_a_step_that_cannot_run_before_the_job_is_not_timed_and_says_why():
    graph = _graph(vocab=1000, ids_per_batch=20)
    with graph.as_default():  # a second input, fed: the probe reads the ids, the step needs both
        weights = tf.compat.v1.placeholder(tf.float32, [None], name="weights")
        w = [v for v in tf.compat.v1.global_variables() if v.op.name == "w"][0]
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(w) * tf.reduce_sum(weights))
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.compute is None and (
        "compute not measured (the step needs 'weights' fed); predicted communication "
        in decision.note)


def test_a_step_reading_a_reinitializable_iterator_is_timed_with_the_training_one():
    """As the Transformer tutorial writes its input: one iterator for a training and an
    evaluation dataset, each its own initializer (MakeIterator) that the script runs. The probe
    initializes it with the first one, the training set's, as the script does before its step."""
    graph = tf.Graph()
    with graph.as_default():
        train = tf.data.Dataset.from_tensor_slices(np.arange(400, dtype=np.int64) % 40).batch(8)
        evaluation = tf.data.Dataset.from_tensor_slices(np.zeros(16, np.int64)).batch(8)
        iterator = tf.compat.v1.data.Iterator.from_structure(
            tf.compat.v1.data.get_output_types(train), tf.compat.v1.data.get_output_shapes(train))
        iterator.make_initializer(train)
        iterator.make_initializer(evaluation)
        table = tf.compat.v1.get_variable("table", [40, 4])
        tf.compat.v1.train.AdamOptimizer().minimize(
            tf.reduce_sum(tf.nn.embedding_lookup(table, iterator.get_next())))
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.compute is not None and "predicted step" in decision.note, decision.note
    # the training set's 8 distinct ids a batch (the evaluation set's: 1), in AUTO's two shards
    assert sum(s.rows for s in decision.stats.values()) == 8


def test_a_step_with_a_fed_learning_rate_is_timed_with_it_fed():
    """A setting (a placeholder of one value) does not change what the step computes."""
    graph = _graph(vocab=1000, ids_per_batch=20)
    with graph.as_default():
        rate = tf.compat.v1.placeholder(tf.float32, [], name="learning_rate")
        training = tf.compat.v1.placeholder(tf.bool, [], name="is_training")
        w = [v for v in tf.compat.v1.global_variables() if v.op.name == "w"][0]
        tf.compat.v1.train.MomentumOptimizer(rate, 0.9).minimize(
            tf.reduce_sum(w) * tf.cast(training, tf.float32))
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.compute is not None and "predicted step" in decision.note


def test_a_step_sized_by_a_fed_integer_is_not_timed():
    """An integer setting may be the batch size: timed with 1 it would be a batch of one."""
    graph = _graph(vocab=1000, ids_per_batch=20)
    with graph.as_default():
        batch = tf.compat.v1.placeholder(tf.int32, [], name="batch_size")
        w = [v for v in tf.compat.v1.global_variables() if v.op.name == "w"][0]
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.random.normal([batch, 64]) @ w))
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.compute is None
    assert "compute not measured (the step needs 'batch_size' fed)" in decision.note


def test_describe_says_what_hybrid_does_without_one_kind_of_variable():
    dense = tf.Graph()
    with dense.as_default():
        w = tf.compat.v1.get_variable("w", [4, 1])
        tf.compat.v1.train.AdamOptimizer().minimize(tf.reduce_sum(w))
    cluster = Cluster(worker_machines=[0, 0, 1, 1], servers=["a:1", "b:1"])
    header = describe(make_plan(analyze(dense), PlanOptions(run_option="HYBRID"), cluster))
    assert header.startswith("Parallax plan: run_option=HYBRID (no sparse variable: every "
                             "variable allreduced, as AR), 4 workers"), header
    sparse = tf.Graph()
    with sparse.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        table = tf.compat.v1.get_variable("table", [100, 4])
        tf.compat.v1.train.AdamOptimizer().minimize(
            tf.reduce_sum(tf.nn.embedding_lookup(table, ids)))
    header = describe(make_plan(analyze(sparse), PlanOptions(run_option="HYBRID"), cluster))
    assert header.startswith("Parallax plan: run_option=HYBRID (no dense variable: every "
                             "variable on the servers, as PS), 4 workers"), header


def test_describe_shows_each_variables_method_alpha_bytes_and_share_of_the_predicted_step():
    graph = _graph(vocab=100_000, ids_per_batch=500, zipf=True)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO, cost.Links(bandwidth=1e6))
    # The workers' analysis: of their copy, with the table split (passes/split_variables.py)
    analysis = analyze(split_variables(copy_graph(graph), decision.splits))
    cluster = Cluster(worker_machines=[0, 0, 1, 1], servers=["a:1", "b:1"])
    text = describe(make_plan(analysis, PlanOptions(run_option="AUTO"), cluster, decision=decision))
    assert text.startswith("Parallax plan: run_option=AUTO (HYBRID's passes), 4 workers")
    assert text.splitlines()[1].startswith("AUTO: cost model")
    assert "predicted step" in text.splitlines()[1]
    header, table, _, w = text.splitlines()[2:6]
    assert header.endswith("alpha  predicted bytes  share of step")
    table_cells, w_cells = table.split(), w.split()
    assert table_cells[0] == "table/part_0" and "parameter" in table
    assert 0.0 < float(table_cells[-3]) < 0.01  # alpha: ~95 rows of 50,000
    assert w_cells[0] == "w" and "allreduce" in w and w_cells[-3] == "-"
    # w: 2 * 256 bytes * 3/4 each way; the table's pulls and pushes: much of the step
    assert float(w_cells[-2]) == 384
    assert int(table_cells[-1].rstrip("%")) > 25


def test_the_drivers_plan_reaches_the_workers_whole(monkeypatch):
    """The plan is made once, by the driver: a worker reads it from its environment and binds
    it to its own analysis and identity, and has every field the driver's had."""
    graph = _graph(vocab=100_000, ids_per_batch=500, zipf=True)
    analysis = analyze(graph)
    decision = measure_and_decide(graph, analysis, TWO_BY_TWO)
    plan = make_plan(analysis, PlanOptions(run_option="AUTO"), TWO_MACHINES, decision=decision)
    assert isinstance(plan.decision, Decision)
    for name, value in contracts.plan_env([plan.to_text()], [[0, "table", 2]]).items():
        monkeypatch.setenv(name, value)
    assert contracts.read_partition_counts() == {0: 2}
    identity = Cluster([0, 0, 1, 1], ["h1:7", "h2:7"], ["h1:8", "h1:9", "h2:8", "h2:9"], 3)
    sent = contracts.read_plan_texts()[0]
    assert Plan.from_text(sent).to_text() == sent
    received = Plan.from_text(sent).bind(analyze(graph), identity)
    assert received.cluster == identity
    assert dataclasses.replace(received, cluster=plan.cluster) == plan  # every field, typed
    assert received.variables["table"].variable.gradients  # the worker's own analysis


def test_a_worker_whose_graph_is_not_the_planned_one_is_stopped():
    graph = _graph(vocab=1000, ids_per_batch=10)
    plan = make_plan(analyze(graph), PlanOptions(run_option="HYBRID"), TWO_MACHINES)
    other = tf.Graph()
    with other.as_default():
        w = tf.compat.v1.get_variable("other", [3])
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(w))
    with pytest.raises(ParallaxError, match="not the one the driver planned for"):
        Plan.from_text(plan.to_text()).bind(analyze(other), TWO_MACHINES)


def test_describe_shows_a_variable_the_driver_did_not_measure_without_figures():
    """A graph built after the first get_runner has variables the decision does not know."""
    graph = _graph(vocab=100_000, ids_per_batch=500, zipf=True)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    other = _graph(vocab=1000, ids_per_batch=10)  # its table is not the decision's shards
    cluster = Cluster(worker_machines=[0, 0, 1, 1], servers=["a:1", "b:1"])
    text = describe(make_plan(analyze(other), PlanOptions(run_option="AUTO"), cluster,
                              decision=decision))
    table = next(line for line in text.splitlines() if line.startswith("table "))
    assert table.split()[-3:] == ["-", "-", "-"] and "parameter server" in table


def test_a_plan_with_servers_is_timed_against_allgathering_its_tables():
    """AUTO's alternatives (Config.trial_steps): the same splits and shards, the sparse
    variables allgathered (AR's rule), on servers (HYBRID's, when it differs), or every
    variable on servers (PS's rule), each with its predicted step; the workers train on the
    fastest measured (runtime/trials.py)."""
    graph = _graph(vocab=100_000, ids_per_batch=500)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    # HYBRID's is chosen
    assert [a.name for a in decision.alternatives] == ["AR's rule", "PS's rule"]
    allgathered = decision.alternative(0)
    assert allgathered.name == "AR's rule" and allgathered.alternatives == []
    assert set(allgathered.methods) == set(decision.methods)  # table/part_0, table/part_1, w
    assert {m.how for n, m in allgathered.methods.items() if n != "w"} == {cost.ALLGATHER}
    assert allgathered.step > 0 and allgathered.note.startswith("AR's rule, timed against")
    plans = [make_plan(analyze(split_variables(copy_graph(graph), {"table": 2})),
                       PlanOptions(run_option="AUTO"), TWO_MACHINES, decision=d)
             for d in (decision, allgathered)]
    assert [p.run_option for p in plans] == ["HYBRID", "AR"]
    on_servers = decision.alternative(1)
    assert set(on_servers.methods) == set(decision.methods)
    assert {m.how for m in on_servers.methods.values()} == {cost.PS}
    assert on_servers.methods["w"].servers in ((0,), (1,)) and on_servers.step > 0
    plan = make_plan(analyze(split_variables(copy_graph(graph), {"table": 2})),
                     PlanOptions(run_option="AUTO"), TWO_MACHINES, decision=on_servers)
    assert plan.run_option == "PS"


def test_a_rule_that_would_put_a_variable_the_gradients_wait_for_on_a_server_is_not_timed():
    """A moving average updated before the gradients (kept off the servers) rules PS's out."""
    graph = _graph(vocab=100_000, ids_per_batch=500)
    with graph.as_default():
        w = [v for v in tf.compat.v1.global_variables() if v.op.name == "w"][0]
        average = tf.compat.v1.get_variable("average", [], initializer=tf.zeros_initializer())
        with tf.control_dependencies([average.assign(tf.reduce_mean(w))]):
            loss = tf.reduce_sum(w * average)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert "PS's rule" not in [a.name for a in decision.alternatives]


def test_a_plan_allreducing_every_table_is_timed_against_servers():
    """Allgathering every row of every batch (AR's rule) is predicted 7 times the step, beyond
    the model's error: only the servers' plans are timed."""
    graph = _graph(vocab=100, ids_per_batch=500)  # every row in every batch: allreduced
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.methods["table"].how == cost.ALLREDUCE
    assert [a.name for a in decision.alternatives] == ["HYBRID's rule", "PS's rule"]
    assert [a.methods["table"].how for a in decision.alternatives] == [cost.PS, cost.PS]
    assert "AR's rule" in decision.note and "not timed: beyond the model's error" in decision.note


def test_a_dense_model_is_not_timed():
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [64, 64])
        loss = tf.reduce_sum(tf.matmul(tf.ones([8, 64]), w))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.methods["w"].how == cost.ALLREDUCE and decision.alternatives == []


def test_a_step_drawing_random_numbers_is_not_timed_and_says_why():
    """A plan change starts a new session, whose dropout would draw its numbers again."""
    graph = _graph(vocab=100_000, ids_per_batch=500)
    with graph.as_default():
        table = tf.compat.v1.global_variables()[0]
        dropped = tf.nn.dropout(tf.nn.embedding_lookup(table, [1, 2]), rate=0.5)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(dropped))
    decision = measure_and_decide(graph, analyze(graph), TWO_BY_TWO)
    assert decision.alternatives == []
    assert "not timed on the cluster: its step draws random numbers" in decision.note


@pytest.mark.parametrize("steps", [-1, 1, 2, 4.5])
def test_trial_steps_are_none_or_a_warm_up_and_timed_ones(steps):
    with pytest.raises(ValueError, match="trial_steps must be 0"):
        Config(run_option="AUTO", trial_steps=steps)


def test_a_rule_predicted_slower_by_more_than_the_model_errs_is_not_timed(monkeypatch):
    """Of the rules' plans, those predicted slower than the cost model's choice by more than
    its measured error (proposal.TRUSTED_MARGIN) cannot win however the errors fall: not timed,
    and said with each margin; with none left to time, no trials."""
    graph = _graph(vocab=100, ids_per_batch=500)
    analysis = analyze(graph)
    # One measurement decided twice: a step timed again differs by more than a margin's width.
    measured = planner.measure(graph, analysis, TWO_BY_TWO)
    timed = planner.decide(graph, analysis, measured, PlanOptions(run_option="AUTO"))
    margins = {a.name: a.step / timed.step - 1 for a in timed.alternatives}
    assert set(margins) == {"HYBRID's rule", "PS's rule"} and min(margins.values()) > 0
    assert "no trials" not in timed.note
    monkeypatch.setattr(proposal, "TRUSTED_MARGIN", min(margins.values()) / 2)
    untimed = planner.decide(graph, analysis, measured, PlanOptions(run_option="AUTO"))
    assert untimed.alternatives == [] and untimed.methods == timed.methods
    for name, margin in margins.items():
        assert re.search(re.escape(name) + r" [0-9.]+ ms \(\+%d%%, not timed: beyond the "
                         r"model's error\)" % round(100 * margin), untimed.note), untimed.note
    assert untimed.note.endswith(
        "; no trials: every other plan is predicted slower by more than the model errs")


@pytest.mark.parametrize("margin", [-0.1, "0.5", True, float("nan")])
def test_trial_margin_is_a_fraction_or_none(margin):
    with pytest.raises(ValueError, match="trial_margin must be a fraction >= 0"):
        Config(run_option="AUTO", trial_margin=margin)


def test_a_trial_margin_given_times_every_rule_or_fewer(monkeypatch):
    graph = _graph(vocab=100, ids_per_batch=500)
    every = measure_and_decide(graph, analyze(graph), TWO_BY_TWO, trial_margin=float("inf"))
    assert [a.name for a in every.alternatives] == ["AR's rule", "HYBRID's rule",
                                                       "PS's rule"]
    assert measure_and_decide(graph, analyze(graph), TWO_BY_TWO,
                              trial_margin=0.0).alternatives == []
