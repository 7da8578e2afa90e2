"""Analysis finds each variable's gradient, its update ops and the extra state training writes."""
import dataclasses

import pytest
import tensorflow as tf

import parallax
from conftest import load_workload
from parallax.config import PlanOptions, RuntimeOptions
from parallax.planning.analysis import analyze, gradient_sources, update_ops_by_variable
from parallax.vocabulary import downstream_ops, upstream_ops
from runner.settings import Settings


def _build(optimizer, with_ema=False):
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.constant([0, 2, 2], dtype=tf.int64)
        embedding = tf.compat.v1.get_variable("embedding", [4, 2])
        w = tf.compat.v1.get_variable("w", [2, 1])
        loss = tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(embedding, ids), w))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = optimizer.minimize(loss, global_step=global_step)
        if with_ema:
            with tf.control_dependencies([train_op]):
                tf.compat.v1.train.ExponentialMovingAverage(0.9).apply([embedding, w])
    return graph


def test_variables_gradients_and_update_ops():
    analysis = analyze(_build(tf.compat.v1.train.GradientDescentOptimizer(0.1)))
    assert list(analysis.variables) == ["embedding", "w"]
    embedding, w = analysis.variables["embedding"], analysis.variables["w"]
    assert embedding.is_sparse and not w.is_sparse
    assert embedding.shape == (4, 2) and embedding.nbytes == 32
    assert [v.name for v in analysis.sparse] == ["embedding"]
    assert len(embedding.update_ops) == 1 and len(w.update_ops) == 1
    assert list(analysis.extra_state) == ["global_step"]
    assert analysis.extra_state["global_step"].owner is None


def test_optimizer_slots_and_beta_powers_are_extra_state_with_owners():
    analysis = analyze(_build(tf.compat.v1.train.AdamOptimizer(0.1)))
    state = analysis.extra_state
    assert state["embedding/Adam"].owner == "embedding"
    assert state["w/Adam_1"].owner == "w"
    assert {"beta1_power", "beta2_power", "global_step"} <= set(state)


def test_moving_averages_are_extra_state_of_their_variable():
    analysis = analyze(_build(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), with_ema=True))
    state = analysis.extra_state
    assert state["w/ExponentialMovingAverage"].owner == "w"
    assert state["embedding/ExponentialMovingAverage"].owner == "embedding"
    assert state["w/Momentum"].owner == "w"


@pytest.mark.parametrize("optimizer", ["Momentum", "Adam", "Adagrad", "RMSProp", "Ftrl"])
def test_a_learning_rate_fed_through_a_scalar_placeholder_is_a_setting_not_data(optimizer):
    """Every worker feeds it alike: the slots its updates write are not per-worker state (which
    would be averaged, and a fused update cannot be)."""
    graph = tf.Graph()
    with graph.as_default():
        rate = tf.compat.v1.placeholder(tf.float32, [], name="learning_rate")
        _build_loss_and(getattr(tf.compat.v1.train, f"{optimizer}Optimizer")(
            rate, **({"momentum": 0.9} if optimizer == "Momentum" else {})))
    state = analyze(graph).extra_state
    slots = [name for name in state if name.startswith(("embedding/", "w/"))]
    assert slots and not any(state[name].per_worker for name in slots)


def test_a_variable_assigned_a_setting_is_averaged_as_state_written_from_data():
    """The PTB tutorial's learning rate: a variable assigned from a fed placeholder. An
    assignment can be averaged over workers (the same value when all feed it alike)."""
    graph = tf.Graph()
    with graph.as_default():
        rate = tf.Variable(0.1, trainable=False, name="lr")
        new_rate = tf.compat.v1.placeholder(tf.float32, [], name="new_learning_rate")
        tf.compat.v1.assign(rate, new_rate)
        _build_loss_and(tf.compat.v1.train.MomentumOptimizer(rate, 0.9))
    state = analyze(graph).extra_state
    assert state["lr"].per_worker and not state["w/Momentum"].per_worker


def _build_loss_and(optimizer):
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")  # data: a batch of ids
    embedding = tf.compat.v1.get_variable("embedding", [4, 2])
    w = tf.compat.v1.get_variable("w", [2, 1])
    optimizer.minimize(tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(embedding, ids), w)))


def test_downstream_ops_follow_data_and_control_edges_inside_and_until():
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant(1.0, name="a")
        b = tf.identity(a, name="b")
        c = tf.square(b, name="c")
        with tf.control_dependencies([b]):
            d = tf.no_op(name="d")
        e = tf.add(c, 1.0, name="e")
    after_a = downstream_ops([a.op])
    assert {op.name for op in after_a} >= {"b", "c", "d", "e"} and a.op not in after_a
    assert downstream_ops([b.op], inside={c.op, d}) == {c.op, d}
    assert e.op not in downstream_ops([b.op], until={c.op})
    assert a.op in upstream_ops([e.op]) and d not in upstream_ops([e.op])


def test_graph_without_gradients_is_refused_with_advice():
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.get_variable("w", [2])
    with pytest.raises(parallax.ParallaxError, match="no recorded gradients.*import parallax"):
        analyze(graph)
    with pytest.raises(parallax.ParallaxError, match="no recorded gradients"):
        parallax.get_runner(graph, "localhost:0,1")


def test_get_runner_refuses_what_is_not_a_graph():
    with pytest.raises(parallax.ParallaxError, match="needs a tf.Graph"):
        parallax.get_runner("graph.pbtxt", "localhost:0,1")


def test_unknown_run_option_names_the_choices():
    with pytest.raises(ValueError, match="unknown run_option .ALLREDUCE.*.AR.*.HYBRID.*.MPI.*.PS."):
        parallax.Config(run_option="ALLREDUCE")
    assert parallax.Config(run_option="mpi").run_option == "AR"


def test_each_config_option_belongs_to_one_stage_and_reaches_it():
    """Config is the user's one object; planning, the workers and runner/ each receive their
    own part of it, and every keyword belongs to exactly one part."""
    parts = [PlanOptions, RuntimeOptions, Settings]
    owned = [field.name for part in parts for field in dataclasses.fields(part)]
    assert sorted(owned) == sorted(field.name for field in dataclasses.fields(parallax.Config))
    assert len(owned) == len(set(owned))
    defaults, config_defaults = [part() for part in parts], parallax.Config()
    for part in defaults:  # the user's object has each part's defaults
        for field in dataclasses.fields(part):
            assert getattr(config_defaults, field.name) == getattr(part, field.name), field.name
    config = parallax.Config(run_option="mpi", ps_config=parallax.PSConfig(local_aggregation=False),
                             export_graph_path="/tmp/graphs", base_port=4000, max_restarts=1,
                             ckpt_config=parallax.CheckpointConfig(ckpt_dir="/tmp/ckpt"))
    assert config.plan_options.run_option == "AR"
    assert config.plan_options.ps_config.local_aggregation is False
    assert config.runtime_options.export_graph_path == "/tmp/graphs"
    assert (config.launch_settings.base_port, config.launch_settings.max_restarts) == (4000, 1)
    with pytest.raises(ValueError, match="max_restarts=1 needs ckpt_config"):
        parallax.Config(max_restarts=1)
    with pytest.raises(ValueError, match="heartbeat_timeout_secs .* must be positive"):
        parallax.Config(heartbeat_timeout_secs=0)
    with pytest.raises(TypeError, match="verify_steps"):  # parallax.verify's own option
        parallax.Config(verify_steps=3)  # pylint: disable=unexpected-keyword-arg


def test_asynchronous_training_needs_a_run_option_with_servers():
    """Refused before any measurement: under AUTO it would otherwise depend on whether the
    links the driver measures make the model choose a server."""
    for option in ("AUTO", "AR", "mpi"):
        with pytest.raises(ValueError, match=r"sync=False .*use run_option='HYBRID' or 'PS'"):
            parallax.Config(run_option=option, sync=False)
    assert not parallax.Config(run_option="HYBRID", sync=False).sync


def test_a_variables_update_is_its_optimizers_ops_after_its_gradient_and_its_slots():
    """Adam after a clipping by the global norm: a variable's update is its own and its
    slots' ops and its gradient's scaling, not the global norm (every variable's) nor the
    powers of beta (written after every update)."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [4, 2])
        b = tf.compat.v1.get_variable("b", [2])
        loss = tf.reduce_sum(tf.matmul(tf.ones([1, 4]), w) + b)
        optimizer = tf.compat.v1.train.AdamOptimizer(0.1)
        gradients, variables = zip(*optimizer.compute_gradients(loss))
        clipped, _ = tf.clip_by_global_norm(gradients, 1.0)
        optimizer.apply_gradients(zip(clipped, variables))
    analysis = analyze(graph)
    updates = update_ops_by_variable(graph, analysis)
    assert sorted(updates) == ["b", "w"]
    assert "Adam/update_w/ResourceApplyAdam" in updates["w"]
    assert not any("update_b" in name for name in updates["w"])
    assert "clip_by_global_norm/mul_1" in updates["w"]
    latest = gradient_sources(graph, analysis).latest
    assert latest({"gradients/MatMul_grad/MatMul_1": 5.0})["w"] == 5.0
    assert latest({"w": 7.0})["b"] is None
    assert not any("/global_norm/" in name or name.startswith(("beta", "Adam/mul", "Adam/Assign"))
                   for name in updates["w"] | updates["b"])


def test_gradient_sources_are_the_ops_upstream_of_the_gradients_loops_included():
    """A tf.compat.v1 while loop (a cycle in the graph) in the forward pass, and so in the
    backward one: one walk over the graph's components gives, for any values of the ops, the
    largest upstream of each variable's gradients, as a walk from each would."""
    enabled = tf.compat.v1.control_flow_v2_enabled()
    tf.compat.v1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            w = tf.compat.v1.get_variable("w", [2, 2])
            b = tf.compat.v1.get_variable("b", [2])
            _, h = tf.compat.v1.while_loop(lambda i, h: i < 3,
                                           lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                                           [tf.constant(0), tf.ones([1, 2])])
            loss = tf.reduce_sum(h + b)
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    finally:
        if enabled:
            tf.compat.v1.enable_control_flow_v2()
    assert any(op.type == "NextIteration" for op in graph.get_operations())
    analysis = analyze(graph)
    operations = graph.get_operations()
    values = {op.name: float((7919 * i) % len(operations)) for i, op in enumerate(operations)}
    latest = gradient_sources(graph, analysis).latest(values)
    for name, info in analysis.variables.items():
        heads = {graph.get_tensor_by_name(t).op for r in info.gradients for t in r.tensor_names()}
        assert latest[name] == max(values[op.name] for op in heads | upstream_ops(heads)), name


def test_an_update_the_gradients_wait_for_comes_before_them_and_is_no_variables_update():
    """Two optimizers in one run, the second's loss after the first's update: d's update is
    part of what comes before the gradients, w's is its own."""
    graph = tf.Graph()
    with graph.as_default():
        d = tf.compat.v1.get_variable("d", [4, 2])
        w = tf.compat.v1.get_variable("w", [2])
        x = tf.ones([1, 4])
        train_d = tf.compat.v1.train.AdamOptimizer(0.1, name="AdamD").minimize(
            tf.reduce_sum(tf.matmul(x, d)), var_list=[d])
        with tf.control_dependencies([train_d]):
            loss = tf.reduce_sum(tf.matmul(x, tf.stop_gradient(d.read_value())) * w)
        tf.compat.v1.train.AdamOptimizer(0.1, name="AdamW").minimize(loss, var_list=[w])
    updates = update_ops_by_variable(graph, analyze(graph))
    assert updates["d"] == set()
    assert "AdamW/update_w/ResourceApplyAdam" in updates["w"]
    assert {"w/AdamW", "w/AdamW_1"} <= updates["w"]
    assert not any(name.startswith(("AdamD", "d/")) for name in updates["w"])


def test_a_loss_divided_by_a_sum_over_the_batch_has_its_denominator_found():
    """The token-normalized losses of sequence models, by hand and by tf.compat.v1.losses with
    weights (SUM_BY_NONZERO_WEIGHTS); a batch mean, a constant and the model's own divisor are
    none; a division by another value of the batch's data is unclear."""
    graph = tf.Graph()
    with graph.as_default():
        tokens = tf.compat.v1.placeholder(tf.int64, [None, None])
        embedding = tf.compat.v1.get_variable("embedding", [10, 4])
        w = tf.compat.v1.get_variable("w", [4, 10])
        logits = tf.einsum("btd,dv->btv", tf.nn.embedding_lookup(embedding, tokens), w)
        mask = tf.cast(tf.not_equal(tokens, 0), tf.float32)
        cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tokens,
                                                                       logits=logits)
        by_hand = tf.reduce_sum(cross_entropy * mask) / tf.reduce_sum(mask)
        by_losses = tf.compat.v1.losses.sparse_softmax_cross_entropy(tokens, logits, weights=mask)
        kept = (tf.reduce_mean(cross_entropy) / 3.0
                + tf.reduce_sum(cross_entropy) / tf.reduce_sum(tf.abs(w)))
        unclear = tf.reduce_sum(cross_entropy) / tf.reduce_max(mask + 1.0)
        tf.compat.v1.train.AdamOptimizer().minimize(by_hand + by_losses + kept + unclear)
        tf.compat.v1.summary.scalar("tokens", tf.reduce_sum(mask) / 2.0)  # not differentiated
    analysis = analyze(graph)
    assert analysis.loss_denominators == ["sparse_softmax_cross_entropy_loss/num_present:0",
                                          by_hand.op.inputs[1].name]
    assert analysis.unclear_denominators == [unclear.op.name]


def test_updates_in_a_v1_cond_are_found_under_tf1_behaviour():
    """tf.compat.v1.disable_v2_behavior(): reference variables reach their updates inside a
    tf.cond through Switch ops, and the cond is one of v1 control flow."""
    with load_workload("tf1").behaviour(True):
        graph = tf.Graph()
        with graph.as_default():
            w = tf.compat.v1.get_variable("w", [2, 1])
            step = tf.compat.v1.train.get_or_create_global_step()
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
            grads = optimizer.compute_gradients(tf.reduce_sum(w))
            tf.cond(tf.equal(step % 2, 0), lambda: tf.group(optimizer.apply_gradients(grads)),
                    tf.no_op)
        analysis = analyze(graph)
    (update,) = analysis.variables["w"].update_ops
    assert graph.get_operation_by_name(update).type == "ApplyGradientDescent"
    assert analysis.in_v1_cond == {update: "cond/cond_text"}


@pytest.mark.parametrize("resource", [True, False], ids=["resource", "reference"])
def test_what_makes_a_gathered_variables_gradient_dense_is_named(resource):
    """An l2_loss of a table, or a tied output layer's matmul (BERT's), reads it whole beside
    its lookups: autodiff sums their dense terms with the rows, and the table is dense. Under
    TF1 behaviour a reference variable is read through its Identity, `table/read`."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.constant([0, 2, 2], dtype=tf.int64)
        table = tf.compat.v1.get_variable("table", [4, 2], use_resource=resource)
        penalized = tf.compat.v1.get_variable("penalized", [4, 2], use_resource=resource)
        rows = tf.nn.embedding_lookup(table, ids) + tf.nn.embedding_lookup(penalized, ids)
        logits = tf.matmul(rows, table, transpose_b=True, name="tied_output")
        loss = tf.reduce_sum(logits) + tf.nn.l2_loss(penalized, name="decay")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    variables = analyze(graph).variables
    assert not variables["table"].is_sparse and not variables["penalized"].is_sparse
    assert variables["table"].whole_reads == [("MatMul", "tied_output")]
    assert variables["penalized"].whole_reads == [("L2Loss", "decay")]
    sparse = analyze(_build(tf.compat.v1.train.GradientDescentOptimizer(0.1))).variables
    assert sparse["embedding"].whole_reads == [] and sparse["w"].whole_reads == []
