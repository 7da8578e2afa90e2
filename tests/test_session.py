"""The session wrapper takes the original graph's fetches and feeds, as Session.run does."""
import collections

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.contracts import record_aggregated
from parallax.rewriting.graph_map import GraphMap
from parallax.runtime.session import ParallaxRunner, install_chief_only_saves


@pytest.fixture
def runner():
    runner = _runner(worker_id=1)
    yield runner
    runner.close()


def _runner(worker_id):
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
        seen = tf.compat.v1.get_local_variable("seen", [], initializer=tf.zeros_initializer())
        count = seen.assign_add(tf.reduce_sum(x), name="count")
        init = tf.group(tf.compat.v1.global_variables_initializer(),
                        tf.compat.v1.local_variables_initializer())
    session = tf.compat.v1.Session(graph=graph)
    session.run(init)
    install_chief_only_saves()  # as a worker's get_runner does
    runner = ParallaxRunner(GraphMap(graph, graph), session, num_workers=2, worker_id=worker_id,
                            description="", training_writes=[train.name])
    runner.tensors = {"x": x, "w": w, "loss": loss, "grad": grad, "train": train,
                      "seen": seen, "count": count, "init": init}
    return runner


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


def test_local_variables_are_reset_as_the_script_asks(runner, caplog):
    """A metric's local variables, reset between evaluations: their initializers run, alone or
    in a group with the global variables' (which are skipped, with a warning)."""
    t = runner.tensors
    runner.run(t["train"], {t["x"]: [1.0, 2.0]})
    assert runner.run(t["count"], {t["x"]: [1.0, 2.0]}) == 3.0
    runner.run(tf.compat.v1.variables_initializer([t["seen"]]))
    assert runner.run(t["seen"]) == 0.0 and "skipped" not in caplog.text
    runner.run(t["count"], {t["x"]: [1.0, 2.0]})
    runner.run(t["init"])
    assert runner.run(t["seen"]) == 0.0
    np.testing.assert_allclose(runner.run(t["w"]), [0.7, 0.4])
    # named by the script's line, the same on every worker, not by the op's name
    line = [frame.lineno for frame in t["init"].traceback if frame.filename == __file__][-1]
    made_at = f"the initializer made at {__file__}:{line}"
    assert f"runner.run({made_at}) skipped but for the local variables" in caplog.text


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


def test_a_saver_saves_through_the_chief_only_and_restores_on_every_worker(runner, tmp_path):
    chief = _runner(worker_id=0)
    t = chief.tensors
    with chief.graph.as_default():
        chief_saver = tf.compat.v1.train.Saver()
    with runner.graph.as_default():
        saver = tf.compat.v1.train.Saver()
    # The other worker's save returns the path and writes no file: no data, no state file, no
    # meta graph (on its own machine the folder need not exist; a shared one is the chief's)...
    assert saver.save(runner, str(tmp_path / "model"), global_step=1) == str(
        tmp_path / "model-1")
    assert saver.save(runner, str(tmp_path / "new" / "model.ckpt")) == str(
        tmp_path / "new" / "model.ckpt")
    assert not list(tmp_path.iterdir())
    # ...the chief's writes it, and every worker restores it.
    chief.run(t["train"], {t["x"]: [1.0, 2.0]})
    path = chief_saver.save(chief, str(tmp_path / "model"), global_step=1)
    assert list(tmp_path.glob("model-1.data*"))
    assert (tmp_path / "checkpoint").exists() and (tmp_path / "model-1.meta").exists()
    saver.restore(runner, path)
    np.testing.assert_allclose(runner.run(runner.tensors["w"]), [0.7, 0.4])
    chief.close()


def test_eval_and_run_use_the_runner_as_the_default_session(runner):
    t = runner.tensors
    assert isinstance(runner, tf.compat.v1.Session.__mro__[2])  # SessionInterface
    with runner.as_default():
        assert tf.compat.v1.get_default_session() is runner
        assert t["loss"].eval(feed_dict={t["x"]: [1.0, 2.0]}) == 3.0
        t["train"].run(feed_dict={t["x"]: [1.0, 2.0]})
        np.testing.assert_allclose(t["w"].eval(), [0.7, 0.4])  # the aggregate was applied
    assert tf.compat.v1.get_default_session() is None
    with pytest.raises(parallax.ParallaxError, match="partial runs are not supported"):
        runner.partial_run_setup([t["loss"]])


def test_a_monitor_behind_an_op_that_also_leads_to_the_update_is_refused_saying_why():
    """A summary of clip_by_global_norm's norm, run alone: the norm also scales the update, so
    training steps do not keep the aggregate for it (keeping every aggregate would copy each
    gradient out of every step)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
        (grad,) = tf.compat.v1.gradients(tf.reduce_sum(x * w), [w])
        aggregated = tf.multiply(grad, 3.0, name="aggregated")
        record_aggregated(grad, aggregated)
        (clipped,), norm = tf.clip_by_global_norm([aggregated], 1.0)
        train = w.assign_sub(0.1 * clipped).op
        summary = tf.compat.v1.summary.scalar("gradient_norm", norm)
        init = tf.compat.v1.global_variables_initializer()
    session = tf.compat.v1.Session(graph=graph)
    session.run(init)
    runner = ParallaxRunner(GraphMap(graph, graph), session, num_workers=2, worker_id=0,
                            description="", training_writes=[train.name])
    try:
        runner.run(train, {x: [1.0, 2.0]})
        with pytest.raises(parallax.ParallaxError,
                           match="through ops that also lead to an update"):
            runner.run(summary, {x: [1.0, 2.0]})
    finally:
        runner.close()
