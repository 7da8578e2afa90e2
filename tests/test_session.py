"""The session wrapper takes the original graph's fetches and feeds, as Session.run does."""
import collections

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.passes.rewire import record_aggregated
from parallax.session import ParallaxRunner


@pytest.fixture
def runner():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_sum(x * w, name="loss")
        (grad,) = tf.compat.v1.gradients(loss, [w])
        # Stands for the aggregate: a real op built from the gradient, as the passes build one.
        aggregated = tf.multiply(grad, 3.0, name="aggregated")
        record_aggregated(grad, aggregated)
        train = w.assign_sub(0.1 * aggregated, name="train").op
        tf.compat.v1.summary.histogram("gradient", aggregated)  # a monitor of the aggregate
        init = tf.compat.v1.global_variables_initializer()
    session = tf.compat.v1.Session(graph=graph)
    session.run(init)
    runner = ParallaxRunner(graph, session, num_workers=2, worker_id=1, description="",
                            training_writes=[train.name])
    runner.tensors = {"x": x, "w": w, "loss": loss, "grad": grad, "train": train}
    yield runner
    runner.close()


def test_nested_fetches_by_object_and_name(runner):
    t = runner.tensors
    Pair = collections.namedtuple("Pair", "loss w")
    result = runner.run({"pair": Pair("loss:0", t["w"]), "list": [t["loss"], "loss"]},
                        feed_dict={"x:0": [1.0, 2.0]})
    assert result["pair"].loss == 3.0
    np.testing.assert_array_equal(result["pair"].w, [1.0, 1.0])
    assert result["list"][1] is None  # an op name fetches the op, as in Session.run
    assert not runner.is_chief and runner.num_workers == 2


def test_fetching_a_gradient_gives_the_aggregated_gradient(runner):
    t = runner.tensors
    _, grad = runner.run([t["train"], t["grad"]], {t["x"]: [1.0, 2.0]})
    np.testing.assert_array_equal(grad, [3.0, 6.0])


def test_a_gradient_fetched_without_a_train_op_is_the_last_aggregate(runner):
    """Computing it would mean an aggregation only this worker takes part in."""
    t = runner.tensors
    with pytest.raises(parallax.ParallaxError, match="applies nothing with it"):
        runner.run(t["grad"], {t["x"]: [1.0, 2.0]})
    runner.run(t["train"], {t["x"]: [1.0, 2.0]})
    np.testing.assert_array_equal(runner.run(t["grad"], {t["x"]: [5.0, 5.0]}), [3.0, 6.0])
    np.testing.assert_allclose(runner.run(t["w"]), [0.7, 0.4])  # it applied nothing


def test_running_an_initializer_is_skipped_with_a_warning(runner, caplog):
    t = runner.tensors
    runner.run(t["train"], {t["x"]: [1.0, 2.0]})
    with runner.graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    runner.run([init, t["w"].initializer])
    np.testing.assert_allclose(runner.run(t["w"]), [0.7, 0.4])
    assert "skipped: Parallax initializes the variables" in caplog.text


def test_fetch_not_in_graph_is_named(runner):
    with pytest.raises(parallax.ParallaxError, match="fetch 'missing:0' is not in the graph"):
        runner.run(["loss:0", "missing:0"])
    other = tf.Graph()
    with other.as_default():
        stranger = tf.constant(1.0, name="stranger")
    with pytest.raises(parallax.ParallaxError, match="does not belong to the graph"):
        runner.run({"a": stranger})
    with pytest.raises(parallax.ParallaxError, match="feed key 'nope:0' is not in the graph"):
        runner.run("loss:0", feed_dict={"nope:0": 1.0})
