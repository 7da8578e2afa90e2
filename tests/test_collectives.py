"""Which collectives library a job runs, and where one is missing (TensorFlow 2.19 and later,
where Horovod does not build). Their results are one device's: test_equivalence.py's jobs of
each library (AR-tensorflow-*, AR-machine-stages-tensorflow)."""
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import parallax  # noqa: F401  (records gradients)
from parallax import collectives, driver
from parallax.config import PlanOptions
from parallax.errors import ParallaxError
from parallax.planning.analysis import analyze
from parallax.vocabulary import reached
from runner.settings import Settings
from conftest import HOROVOD

pytestmark = pytest.mark.collectives
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITHOUT_HOROVOD = os.path.join(ROOT, "tests", "without_horovod")


@pytest.mark.job
def test_without_horovod_parallax_imports_and_chooses_tensorflows_collectives():
    code = ("import sys, parallax, parallax.launch, parallax.driver, parallax.worker\n"
            "from parallax import collectives\n"
            "from parallax.errors import ParallaxError\n"
            "print(collectives.choose(None), any(m.startswith('horovod') for m in sys.modules))\n"
            "try:\n    collectives.choose('horovod')\n"
            "except ParallaxError as error:\n    print(error)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=WITHOUT_HOROVOD))
    assert out.returncode == 0, out.stderr[-3000:]
    chosen, _, refusal = out.stdout.partition("\n")
    assert chosen == "tensorflow False"
    assert "collectives='horovod', and Horovod is not installed here" in refusal
    assert "collectives='tensorflow'" in refusal


def test_the_default_is_horovod_where_it_is_installed_and_a_choice_is_checked():
    assert collectives.horovod_installed() == HOROVOD
    assert collectives.choose(None) == ("horovod" if HOROVOD else "tensorflow")
    assert collectives.choose("tensorflow") == "tensorflow"
    with pytest.raises(ValueError, match="unknown collectives 'nccl'"):
        PlanOptions(collectives="nccl")


def _hybrid_graph():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.constant([[1, 2], [3, 4]], tf.int64)
        table = tf.compat.v1.get_variable("table", [10, 4])
        w = tf.compat.v1.get_variable("w", [4, 1])
        loss = tf.reduce_sum(tf.matmul(tf.reduce_sum(tf.nn.embedding_lookup(table, ids), 1), w))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph


def test_the_driver_lays_out_the_cluster_of_the_chosen_collectives():
    """The workers learn the library from the cluster the driver launches them with."""
    graph = _hybrid_graph()
    analysis = analyze(graph)
    for options, servers in ((PlanOptions(collectives="tensorflow"), True),
                             (PlanOptions(run_option="AR", collectives="tensorflow"), False),
                             (PlanOptions(), True)):
        cluster = driver.make_job_plans(graph, analysis, "localhost:0,1", options,
                                        Settings())[0].cluster
        assert cluster.has_servers == servers
        assert cluster.collectives == collectives.choose(options.collectives)


def test_a_step_beside_servers_holds_no_collective_op_and_its_loops_do():
    """TensorFlow's collectives beside parameter servers: each collective of a step runs in a
    loop of its own (a run holding collectives takes a step id every worker shares, which the
    servers would mix up: tensorflow/tensorflow#33920)."""
    from parallax.cluster import Cluster
    from parallax import contracts
    from parallax.collectives.tensorflow import TensorFlowCollectives

    cluster = Cluster([0, 0], ["h:1"], ["h:2", "h:3"], collectives="tensorflow")
    steps = TensorFlowCollectives(cluster, server=None).for_steps()
    graph = tf.Graph()
    with graph.as_default():
        gradient = tf.compat.v1.placeholder(tf.float32, [3])
        slices = tf.IndexedSlices(tf.compat.v1.placeholder(tf.float32, [None, 4]),
                                  tf.compat.v1.placeholder(tf.int64, [None]))
        fetched = [steps.allreduce(gradient, average=True),
                   steps.allgather_slices(slices, average=True).values]
    loops = contracts.read_apart_loops(graph)
    assert len(loops) == 2
    assert not any(op.type.startswith("Collective")
                   for op in reached([t.op for t in fetched], fed=()))
    for loop in loops:
        assert any(op.type.startswith("Collective")
                   for op in reached([loop.op], fed=()))
