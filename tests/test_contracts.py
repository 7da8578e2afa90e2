"""parallax/contracts.py: each hand-off's writer and reader agree, and no other module touches
the environment's variables or the graph collections behind them."""
import ast
import pathlib
import threading

import pytest
import tensorflow as tf

from parallax import contracts
from parallax.cluster import Cluster
from parallax.contracts import AggregateRecord, GradientRecord, PartitionerCall, StepQueues
from parallax.errors import ParallaxError

PARALLAX = pathlib.Path(__file__).resolve().parent.parent / "parallax"


def _through_meta_graph(graph: tf.Graph) -> tf.Graph:
    """`graph` exported to a MetaGraphDef and imported into a new graph, as graph_copy.py
    copies a graph."""
    meta_graph = tf.compat.v1.train.export_meta_graph(graph=graph)
    imported = tf.Graph()
    with imported.as_default():
        tf.compat.v1.train.import_meta_graph(meta_graph)
    return imported


# ---- the environment ----------------------------------------------------------------------

@pytest.fixture
def env(monkeypatch):
    def write(values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)
    for name in (contracts.ROLE_ENV, contracts.CLUSTER_ENV, contracts.SERVER_INDEX_ENV,
                 contracts.PLAN_ENV, contracts.PARTITIONS_ENV):
        monkeypatch.delenv(name, raising=False)
    return write


def test_role_and_cluster_round_trip(env):
    assert contracts.role() == "driver"
    cluster = Cluster([0, 0, 1], ["h1:7", "h2:7"], ["h1:8", "h1:9", "h2:8"], worker_id=2)
    env(contracts.process_env("worker", cluster))
    assert contracts.role() == "worker"
    assert contracts.read_cluster() == cluster


def test_server_index_round_trips(env):
    env(contracts.server_env(3))
    assert contracts.read_server_index() == 3


def test_plan_text_and_partition_counts_round_trip(env):
    assert contracts.read_partition_counts() == {}
    with pytest.raises(ParallaxError, match="no plan from the driver"):
        contracts.read_plan_texts()
    env(contracts.plan_env(['{"plan": 1}', 'b'], [[0, "emb", 4], [2, "softmax", 2]]))
    assert contracts.read_plan_texts() == ['{"plan": 1}', 'b']
    assert contracts.read_partition_counts() == {0: 4, 2: 2}


def test_an_environment_given_to_a_thread_is_read_there_alone(env):
    """contracts.environment: each of a job's workers run as threads of one process
    (tests/in_process.py) reads its own identity; the process's own is unchanged."""
    env({contracts.PARTITIONS_ENV: '{"0": 3}'})
    read = {}

    def worker(worker_id):
        cluster = Cluster([0, 1], workers=["h1:8", "h2:8"], worker_id=worker_id)
        with contracts.environment(contracts.process_env("worker", cluster)):
            barrier.wait()  # both inside at once
            read[worker_id] = (contracts.role(), contracts.read_cluster().worker_id,
                               contracts.read_partition_counts())

    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert read == {0: ("worker", 0, {0: 3}), 1: ("worker", 1, {0: 3})}
    assert contracts.role() == "driver"

# ---- the graph collections whose records are JSON: they survive a MetaGraphDef copy ---------

def test_gradients_round_trip_through_a_meta_graph():
    dense = GradientRecord("w", dense="grad_w:0")
    sparse = GradientRecord("emb", values="v:0", indices="i:0", dense_shape="s:0")
    graph = tf.Graph()
    for record in (dense, sparse, dense):
        contracts.record_gradient(graph, record)
    assert contracts.read_gradients(graph) == [dense, sparse]
    assert contracts.read_gradients(graph, unique=False) == [dense, sparse, dense]
    assert contracts.read_gradients(_through_meta_graph(graph), unique=False) == [
        dense, sparse, dense]
    assert contracts.read_gradients(tf.Graph()) == []


def test_replaced_gradients_are_read_back_and_survive_a_meta_graph():
    graph = tf.Graph()
    contracts.record_gradient(graph, GradientRecord("emb", values="v:0", indices="i:0"))
    shards = [GradientRecord(f"emb/part_{j}", values=f"v{j}:0", indices=f"i{j}:0")
              for j in range(2)]
    contracts.replace_gradients(graph, shards)
    assert contracts.read_gradients(graph) == shards
    assert contracts.read_gradients(_through_meta_graph(graph)) == shards


def test_statistic_gradients_round_trip_through_a_meta_graph():
    graph = tf.Graph()
    contracts.record_statistic_gradient(graph, "bn/mean", "grad_of_mean:0")
    contracts.record_statistic_gradient(graph, "bn/variance", "grad_of_variance:0")
    expected = {"bn/mean": "grad_of_mean:0", "bn/variance": "grad_of_variance:0"}
    assert contracts.read_statistic_gradients(graph) == expected
    assert contracts.read_statistic_gradients(_through_meta_graph(graph)) == expected


def test_aggregates_round_trip_through_a_meta_graph():
    graph = tf.Graph()
    with graph.as_default():
        grad, dense_sum = tf.constant(1.0, name="grad"), tf.constant(2.0, name="dense_sum")
        rows, pulled = tf.constant(3.0, name="rows"), tf.constant(4.0, name="pulled")
        push = tf.no_op(name="push")
    contracts.record_aggregated(grad, dense_sum)
    contracts.record_aggregated(rows, pulled, trigger=push, on_server=True)
    expected = [AggregateRecord("grad:0", "dense_sum:0", "dense_sum", False),
                AggregateRecord("rows:0", "pulled:0", "push", True)]
    for read in (graph, _through_meta_graph(graph)):
        assert contracts.read_aggregates(read) == expected
        assert contracts.read_aggregated(read) == {"grad:0": "dense_sum:0",
                                                   "rows:0": "pulled:0"}
        assert contracts.read_triggers(read) == {"dense_sum:0": "dense_sum",
                                                 "pulled:0": "push"}
        assert contracts.read_server_aggregates(read) == {"pulled:0"}


def test_the_chiefs_step_records_round_trip_through_a_meta_graph():
    graph = tf.Graph()
    with graph.as_default():
        write = tf.no_op(name="update")
    queues = StepQueues(("tokens_1:0", "tokens_2:0"), ("restores_1:0", "restores_2:0"))
    contracts.record_step_queues(graph, queues)
    contracts.record_server_write(graph, write)
    for read in (graph, _through_meta_graph(graph)):
        assert contracts.read_step_queues(read) == queues
        assert contracts.read_server_writes(read) == {"update": None}
        assert contracts.read_restore_wait(read) is None


def test_another_workers_step_records_round_trip_through_a_meta_graph():
    graph = tf.Graph()
    with graph.as_default():
        write, cut = tf.no_op(name="update"), tf.no_op(name="cut")
        wait = tf.no_op(name="wait_for_restore")
    contracts.record_restore_wait(graph, wait)
    contracts.record_server_write(graph, write, cut)
    assert contracts.read_restore_wait(graph) is wait
    imported = _through_meta_graph(graph)
    assert contracts.read_restore_wait(imported) is imported.get_operation_by_name(
        "wait_for_restore")
    for read in (graph, imported):
        assert contracts.read_step_queues(read) is None
        assert contracts.read_server_writes(read) == {"update": "cut"}


def test_a_graph_without_step_records_reads_none():
    graph = tf.Graph()
    assert contracts.read_step_queues(graph) is None
    assert contracts.read_restore_wait(graph) is None
    assert contracts.read_server_writes(graph) == {}


# ---- the graph collections of a worker's own copy: ops, variables, Python objects -----------

def test_broadcasts_round_trip():
    graph = tf.Graph()
    with graph.as_default():
        broadcast = tf.no_op(name="broadcast")
    assert contracts.read_broadcasts(graph) == []
    contracts.record_broadcast(graph, broadcast)
    assert contracts.read_broadcasts(graph) == [broadcast]


def test_mirror_reads_round_trip():
    graph = tf.Graph()
    with graph.as_default():
        reads = [tf.no_op(name=f"read_{i}") for i in range(2)]
    for read in reads:
        contracts.record_mirror_read(graph, read)
    assert contracts.read_mirror_reads(graph) == reads


def test_server_state_round_trips_and_stays_out_of_the_global_variables():
    graph = tf.Graph()
    with graph.as_default():
        mirror = tf.compat.v1.Variable(0.0, use_resource=True, trainable=False, collections=[],
                                       name="mirror")
        contracts.record_server_state(graph, mirror)
        assert contracts.read_server_state(graph) == [mirror]
        assert tf.compat.v1.global_variables() == []


def test_partitioner_calls_round_trip():
    graph = tf.Graph()
    calls = [PartitionerCall(0, 2), PartitionerCall(3, 1)]
    for call in calls:
        contracts.record_partitioner_call(graph, call)
    assert contracts.read_partitioner_calls(graph) == calls


def test_split_state_round_trips_and_stays_out_of_a_meta_graph():
    graph = tf.Graph()
    assert contracts.read_split_state(graph) is None
    first, second = object(), object()
    contracts.record_split_state(graph, first)
    assert contracts.read_split_state(graph) is first
    contracts.record_split_state(graph, second)
    assert contracts.read_split_state(graph) is second
    # A Saver's meta graph of the split copy exports every collection it can list.
    assert graph.get_all_collection_keys() == []
    with graph.as_default():
        tf.constant(0.0)
    assert not tf.compat.v1.train.export_meta_graph(graph=graph).collection_def


# ---- nobody else touches a collection -----------------------------------------------------

_COLLECTION_CALLS = {"add_to_collection", "add_to_collections", "get_collection",
                     "get_collection_ref", "clear_collection"}


def _violations(source: str):
    """Where `source` names one of Parallax's collections, or uses or defines a key of one,
    outside contracts.py's writers and readers."""
    found = []
    for node in ast.walk(ast.parse(source)):
        text = None
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _COLLECTION_CALLS:
                text = ast.get_source_segment(source, node)
        elif isinstance(node, ast.keyword) and node.arg == "collections":
            text = ast.get_source_segment(source, node.value)
        if text is not None and ('"parallax_' in text or "'parallax_" in text):
            found.append((node.lineno, text))
        if isinstance(node, ast.Name) and node.id.endswith("_COLLECTION"):
            found.append((node.lineno, node.id))
        if isinstance(node, ast.Attribute) and node.attr.endswith("_COLLECTION"):
            found.append((node.lineno, node.attr))
    return found


@pytest.mark.parametrize("source", [
    'graph.add_to_collection("parallax_x", 1)',
    "tf.compat.v1.get_collection('parallax_x')",
    'v = tf.Variable(1, collections=["parallax_x"])',
    'MINE_COLLECTION = "x"',
    "graph.get_collection(contracts.STEP_COLLECTION)",
])
def test_the_check_finds_a_collection_touched_outside_contracts(source):
    assert _violations(source)


def test_only_contracts_touches_parallax_collections():
    problems = [f"{path.relative_to(PARALLAX.parent)}:{line}: {text}"
                for path in sorted(PARALLAX.rglob("*.py")) if path != PARALLAX / "contracts.py"
                for line, text in _violations(path.read_text())]
    assert not problems, "use parallax/contracts.py's writers and readers:\n" + "\n".join(
        problems)
