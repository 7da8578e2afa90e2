"""The phases of a traced run, from hand-made step stats of a worker and a server."""
import os
import subprocess
import sys

import pytest
import tensorflow as tf
from tensorflow.core.framework import step_stats_pb2

from parallax.planning.analysis import GradientSources
from parallax.planning.traces import step_shares
from parallax.runtime.profile import phase_seconds

WORKER = "/job:worker/replica:0/task:0/device:CPU:0"
SERVER = "/job:ps/replica:0/task:0/device:CPU:0"


def _graph() -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        queue = tf.queue.FIFOQueue(4, tf.float32, shapes=[[]], name="parallax_ps/grad_w_0")
        queue.enqueue(1.0, name="parallax_ps/grad_w_0_Enqueue")
        taken = queue.dequeue(name="parallax_ps/grad_w_0_Dequeue")
        tf.add(taken, 1.0, name="update_w")
        tf.multiply(2.0, 3.0, name="forward")
    return graph


def _ran(stats: step_stats_pb2.DeviceStepStats, name: str, start_ms: int, end_ms: int):
    node = stats.node_stats.add()
    node.node_name = name
    node.all_start_micros = 1000 * start_ms
    node.all_end_rel_micros = 1000 * (end_ms - start_ms)


def test_a_server_receiving_and_waiting_for_pushes_is_push_time_not_server_work():
    """A server's RecvTensor lasts from its request until the worker's gradient has arrived,
    and its dequeue waits for every worker's: both are the pushes. Only the servers' own ops
    (aggregation, the update) are their work."""
    step_stats = step_stats_pb2.StepStats()
    worker, server = step_stats.dev_stats.add(), step_stats.dev_stats.add()
    worker.device, server.device = WORKER, SERVER
    _ran(worker, "forward", 0, 50)
    _ran(worker, "RecvTensor", 50, 60)  # rows pulled from a server
    _ran(server, "RecvTensor", 20, 70)  # a worker's gradient, asked for early
    _ran(server, "parallax_ps/grad_w_0_Enqueue", 70, 72)
    _ran(server, "parallax_ps/grad_w_0_Dequeue", 60, 75)
    _ran(server, "update_w", 75, 80)
    phases = phase_seconds(step_stats, _graph())
    assert phases["compute"] == pytest.approx(0.050)
    assert phases["pull"] == pytest.approx(0.010)
    assert phases["push"] == pytest.approx(0.055)  # 20 to 75 ms
    assert phases["server"] == pytest.approx(0.005)


def test_a_traced_step_gives_when_each_gradient_is_ready_and_each_updates_share():
    """Two updates side by side share the 20 ms during which some update ran, in proportion
    to their own 20 and 10 ms."""
    step_stats = step_stats_pb2.StepStats()
    worker = step_stats.dev_stats.add()
    worker.device = WORKER
    for name, start, end in [("forward", 0, 40), ("grad_w", 40, 60), ("grad_b", 60, 80),
                             ("update_w", 80, 100), ("update_b", 90, 100)]:
        _ran(worker, name, start, end)
    # w's gradient comes from the forward pass; b's does not; `unused`'s never ran.
    sources = GradientSources([(["forward"], []), (["grad_w"], [0]), (["grad_b"], []),
                               (["never_ran"], [])], {"w": [1], "b": [2], "unused": [3]})
    ready, update = step_shares(step_stats, sources, {"w": {"update_w"}, "b": {"update_b"}})
    assert ready == pytest.approx({"w": 0.6, "b": 0.8, "unused": 1.0})
    assert update == pytest.approx({"w": 0.2 * 2 / 3, "b": 0.2 / 3})


_TRACED_TWICE = """
import sys
import tensorflow as tf
from parallax.planning.traces import profiler_log_dropped

tf.compat.v1.disable_eager_execution()
doubled = tf.constant(1.0) * 2
with tf.compat.v1.Session() as session:
    session.run(doubled)
    def traced():
        session.run(doubled, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
            run_metadata=tf.compat.v1.RunMetadata())
    print("[probe begins]", file=sys.stderr, flush=True)
    with profiler_log_dropped():
        print("the user's line", file=sys.stderr)
        traced()
    print("[probe ended]", file=sys.stderr, flush=True)
    traced()
"""


@pytest.mark.job
def test_a_traced_run_parallax_makes_for_itself_keeps_stderr_but_the_profilers_lines():
    # A process of its own: TensorFlow reads its C++ log level once, at load.
    result = subprocess.run([sys.executable, "-c", _TRACED_TWICE], capture_output=True,
                            text=True, timeout=120,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0"))
    assert result.returncode == 0, result.stderr
    inside = result.stderr.split("[probe begins]")[1].split("[probe ended]")[0]
    after = result.stderr.split("[probe ended]")[1]
    assert "the user's line" in inside
    assert "Profiler session" not in inside and "GPU trace" not in inside
    assert "Profiler session" in after  # TensorFlow does log them outside of it
