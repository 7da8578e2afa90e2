"""The PS and HYBRID transformations, read from the rewritten graphs of every worker of a
2-machine x 2-worker cluster (the graphs are built in-process; nothing runs)."""
import pytest
import tensorflow as tf

import parallax
from conftest import COLLECTIVE_OPS, HOROVOD, load_workload, needs_horovod
from parallax import contracts
from parallax.config import PlanOptions
from parallax.planning import analysis, cost
from parallax.planning.analysis import analyze
from parallax.vocabulary import upstream_ops
from parallax.cluster import Cluster
from parallax.graph_copy import copy_graph
from parallax.rewriting.pipeline import transform
from parallax.rewriting.split_variables import split_variables
from parallax.planning.describe import describe
from parallax.planning.job_plan import Sync, make_plan
from parallax.planning.job_plan import Decision

equivalence = load_workload("equivalence")
CLUSTER = dict(worker_machines=[0, 0, 1, 1], servers=["127.0.0.1:1", "127.0.0.2:1"],
               workers=["127.0.0.1:2", "127.0.0.1:3", "127.0.0.2:2", "127.0.0.2:3"])


@pytest.fixture(scope="module", autouse=True)
def horovod():
    if HOROVOD:
        import horovod.tensorflow as hvd
        hvd.init()  # a one-process Horovod job: HYBRID builds allreduce ops


def _transformed(worker_id, config_name="sgd", run_option="PS", **ps_options):
    graph, _, _ = equivalence.build("sparse", config_name, 4, shard=False)
    config = PlanOptions(run_option=run_option, ps_config=parallax.PSConfig(**ps_options))
    plan = make_plan(analyze(graph), config, Cluster(worker_id=worker_id, **CLUSTER))
    return transform(graph, plan), plan


def _machine(device):
    spec = tf.DeviceSpec.from_string(device)
    return spec.task if spec.job == "ps" else CLUSTER["worker_machines"][spec.task]


def _remote_sparse_sends(local_aggregation):
    """(machine, variable) -> how many ops of all workers' graphs enqueue a sparse gradient
    into a queue on another machine's server, i.e. cross machines each step."""
    sends = {}
    for worker_id in range(4):
        graph, plan = _transformed(worker_id, local_aggregation=local_aggregation)
        for op in graph.get_operations():
            if op.type != "QueueEnqueueV2":
                continue
            queue = op.inputs[0].op
            name = queue.get_attr("shared_name").decode()
            if not name.startswith("parallax/grad/"):
                continue
            variable = name[len("parallax/grad/"):].rsplit("/", 2)[0]  # /<index>/from<p>
            if not plan.variables[variable].variable.is_sparse:
                continue
            source = _machine(op.inputs[1].op.device)
            if source != _machine(queue.device):
                sends[(source, variable)] = sends.get((source, variable), 0) + 1
    return sends


def test_local_aggregation_sends_one_sparse_gradient_per_machine():
    with_local = _remote_sparse_sends(local_aggregation=True)
    without = _remote_sparse_sends(local_aggregation=False)
    # The embedding lives on one server; the other machine's two workers must reach it.
    assert list(with_local.values()) == [1], with_local
    assert list(without.values()) == [2], without
    assert with_local.keys() == without.keys()


def test_hybrid_places_dense_on_workers_and_sparse_on_servers():
    graph, plan = _transformed(1, "adam", run_option="HYBRID")
    devices = {op.name: op.device for op in graph.get_operations()}
    assert devices["embedding"].startswith("/job:ps/task:")
    assert devices["embedding/Adam"] == devices["embedding"]  # slots live with the variable
    assert devices["embedding/ExponentialMovingAverage"] == devices["embedding"]
    for dense in ("w1", "hidden_bias", "w2", "w1/Adam", "beta1_power", "global_step"):
        assert devices[dense] == "/job:worker/task:1", dense
    assert COLLECTIVE_OPS["allreduce"] in {op.type for op in graph.get_operations()}
    assert not any(op.type == COLLECTIVE_OPS["allgather"] for op in graph.get_operations())
    text = describe(plan)
    assert "embedding" in text and "server" in text and "every worker (replica)" in text


@pytest.mark.parametrize("config_name", ["sgd+clip", "adam+clip"])  # Adam: through its slots
def test_post_aggregation_ops_follow_their_inputs(config_name):
    """clip_by_global_norm in HYBRID: norms of sparse gradients beside them on their server,
    the global norm (inputs from several processes) on the first server, each clip with its
    own gradient (paper Figure 9). Without local aggregation: with it, each worker computes its
    share of the sparse norm before pushing (next test)."""
    graph, plan = _transformed(0, config_name, run_option="HYBRID", local_aggregation=False)
    server = plan.cluster.server_device(plan.variables["embedding"].server)
    ops = graph.get_operations()
    global_norm = [op for op in ops if op.name.endswith("global_norm/global_norm")]
    assert [op.device for op in global_norm] == [plan.cluster.server_device(0)]
    clips = {op.name: op.device for op in ops
             if "clip_by_global_norm" in op.name and op.name.endswith("_0")}
    sparse_clip = [d for n, d in clips.items() if "clip_by_global_norm/clip_by_global_norm/_0" in n]
    assert sparse_clip == [server], clips
    norms = [op for op in ops if op.type == "L2Loss"]
    assert {op.device for op in norms} == {server, "/job:worker/task:0"}


@pytest.mark.parametrize("config_name", ["adagrad+clip", "adam+clip"])
def test_the_shards_of_a_split_table_are_clipped_and_updated_on_their_servers(config_name):
    """The embedding split over both servers (passes/split_variables.py): each shard's clip,
    deduplication and update run on the shard's server, whatever computed the global norm
    (a scalar, which crosses machines for nothing)."""
    graph, _, _ = equivalence.build("sparse", config_name, 4, shard=False)
    graph = split_variables(copy_graph(graph), {"embedding": 2})
    plan = make_plan(analyze(graph), PlanOptions(run_option="HYBRID"),
                     Cluster(worker_id=0, **CLUSTER))
    assert [plan.variables[f"embedding/part_{j}"].server for j in range(2)] == [0, 1]
    graph = transform(graph, plan)
    for op in graph.get_operations():
        if "/part_" in op.name and op.name.startswith(("clip_by_global_norm", "Adam/update",
                                                        "Adagrad/update")):
            shard = int(op.name.rsplit("/part_", 1)[1])
            assert op.device == plan.cluster.server_device(shard), op.name


def test_local_aggregation_sums_rows_by_id_and_carries_the_norm():
    """Worker 2 (machine 1) pushes its rows summed by id with its norm share; its machine's
    first worker sums the machine's rows again on the machine's server; the model's L2Loss of
    the sparse gradient is replaced by the carried norm."""
    graph, plan = _transformed(2, "sgd+clip", run_option="HYBRID")
    ops = graph.get_operations()
    pushes = [op for op in ops if op.type == "QueueEnqueueV2"
              and "machine1" in op.inputs[0].op.get_attr("shared_name").decode()]
    assert pushes and all(len(op.inputs) == 4 for op in pushes)  # queue, values, ids, norm
    assert {op.inputs[1].op.type for op in pushes} == {"UnsortedSegmentSum"}
    machine_sums = [op for op in ops if op.type == "UnsortedSegmentSum"
                    and op.device == plan.cluster.server_device(1)]
    assert machine_sums
    stack = next(op for op in ops if op.name.endswith("global_norm/stack"))
    assert "L2Loss" not in {t.op.type for t in stack.inputs if t.op.device.startswith("/job:ps")}


def test_rows_are_not_summed_when_the_model_needs_each_row():
    graph = tf.Graph()
    with graph.as_default():
        table = tf.compat.v1.get_variable("table", [10, 2])
        rows = tf.nn.embedding_lookup(table, tf.constant([1, 1, 3]))
        loss = tf.reduce_sum(rows)
        grad, = tf.compat.v1.gradients(loss, [table])
        tf.compat.v1.scatter_sub(table, grad.indices, tf.nn.softmax(grad.values))  # row-wise
    plan = make_plan(analyze(graph), PlanOptions(run_option="PS"),
                     Cluster(worker_id=2, **CLUSTER))
    graph = transform(graph, plan)
    pushes = [op for op in graph.get_operations() if op.type == "QueueEnqueueV2"
              and "grad/table" in op.inputs[0].op.get_attr("shared_name").decode()]
    assert pushes and all(len(op.inputs) == 3 for op in pushes)  # queue, values, ids


def test_without_post_aggregation_placement_the_chief_computes_after_aggregation():
    graph, _ = _transformed(0, "sgd+clip", run_option="HYBRID", post_aggregation_placement=False)
    ops = graph.get_operations()
    after_aggregation = [op for op in ops if op.type == "L2Loss" or op.name.endswith(
        "global_norm/global_norm")]
    assert after_aggregation
    assert {op.device for op in after_aggregation} == {"/job:worker/task:0"}


def test_non_chief_never_runs_server_updates():
    graph, plan = _transformed(2, "adam+clip", run_option="HYBRID")
    train = graph.get_operation_by_name(
        [op.name for op in graph.get_operations() if op.name.endswith("ExponentialMovingAverage")
         and op.type == "NoOp"][0])
    reachable, stack = set(), [train]
    while stack:
        op = stack.pop()
        if op not in reachable:
            reachable.add(op)
            stack.extend([t.op for t in op.inputs] + list(op.control_inputs))
    server_writes = {graph.get_operation_by_name(name) for name in plan.server_writes}
    assert server_writes and not server_writes & reachable
    assert any(op.type == "QueueDequeueV2" and "step_tokens" in op.inputs[0].op.name
               for op in reachable)


def _boundary_graph(worker_id, boundary):
    """PS mode; the table lives on server 0 (machine 0) and the forward pass uses only a slice
    of it, in half precision."""
    graph = tf.Graph()
    with graph.as_default():
        table = tf.compat.v1.get_variable("table", [1000, 16])
        part = tf.cast(tf.slice(table, [0, 0], [10, 16]), tf.float16)
        loss = tf.reduce_sum(tf.cast(part, tf.float32) ** 2)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    config = PlanOptions(run_option="PS", ps_config=parallax.PSConfig(
        boundary_between_workers_and_servers=boundary))
    plan = make_plan(analyze(graph), config, Cluster(worker_id=worker_id, **CLUSTER))
    return transform(graph, plan), plan


def _bytes_between_machines(graph, plan):
    from parallax.rewriting.passes.boundary import machine_of, tensor_bytes
    total = 0
    for op in graph.get_operations():
        for tensor in op.inputs:
            if machine_of(tensor.op.device, plan) != machine_of(op.device, plan):
                total += tensor_bytes(tensor) or 0
    return total


def test_boundary_ops_move_to_the_server_when_fewer_bytes_cross():
    before, plan = _boundary_graph(worker_id=2, boundary=False)
    after, _ = _boundary_graph(worker_id=2, boundary=True)
    server = plan.cluster.server_device(plan.variables["table"].server)
    moved = {op.name: op.device for op in after.get_operations() if op.type in ("Slice", "Cast")
             and op.name in ("Slice", "Cast")}
    assert moved == {"Slice": server, "Cast": server}
    assert before.get_operation_by_name("Slice").device == "/job:worker/task:2"
    # The forward read: 1000x16 float32 crossed before; a 10x16 float16 slice (and the
    # slice's few bytes of begin/size constants) after.
    saved = _bytes_between_machines(before, plan) - _bytes_between_machines(after, plan)
    assert 1000 * 16 * 4 - 10 * 16 * 2 - 64 <= saved <= 1000 * 16 * 4
    # A gather of gradients on the worker would grow what is sent: nothing heavy moves.
    assert {op.type for op in after.get_operations()
            if op.device == server and op.type in ("MatMul", "Conv2D")} == set()


def test_boundary_leaves_ops_on_the_servers_machine_alone():
    graph, plan = _boundary_graph(worker_id=0, boundary=True)  # worker 0 shares machine 0
    assert graph.get_operation_by_name("Slice").device == "/job:worker/task:0"


def test_a_loop_reading_server_variables_stays_on_the_worker():
    """A Keras LSTM is a While op that takes the kernels' handles: in PS mode the kernels go to
    a server, the loop (the model's compute) stays on the worker and reads a copy of them made
    on the worker once a step, not the server's variables at every iteration."""
    import keras

    graph = tf.Graph()
    with graph.as_default():
        inputs = tf.random.normal([4, 5, 3])
        loss = tf.reduce_sum(keras.layers.LSTM(8)(inputs))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    plan = make_plan(analyze(graph), PlanOptions(run_option="PS"),
                     Cluster(worker_id=2, **CLUSTER))
    graph = transform(graph, plan)
    loops = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
    assert loops and {op.device for op in loops} == {"/job:worker/task:2"}
    # The model's variables (Keras numbers the layer's name when a process made others).
    kernels = [op for op in graph.get_operations() if op.type == "VarHandleOp"
               and op.name.startswith("lstm") and "kernel" in op.name]
    assert kernels and all(op.device.startswith("/job:ps/") for op in kernels)
    handles = [t.op for loop in loops for t in loop.inputs if t.dtype == tf.resource]
    assert handles and {op.device for op in handles} == {"/job:worker/task:2"}
    refreshes = {c.type for loop in loops for c in loop.control_inputs}
    assert refreshes == {"AssignVariableOp"}


@pytest.mark.parametrize("boundary", [True, False])
def test_lookups_into_server_variables_ask_for_unique_rows(boundary):
    graph, _ = _transformed(2, "sgd", boundary_between_workers_and_servers=boundary)
    gathers = [op for op in graph.get_operations() if op.type == "ResourceGather"
               and op.device.startswith("/job:ps/") and op.outputs[0].consumers()]
    assert gathers
    unique = {op.inputs[1].op.type == "Unique" for op in gathers}
    assert unique == ({True} if boundary else {False})
    if boundary:  # the rows are expanded to the lookup's result on the worker
        consumers = [c for op in gathers for c in op.outputs[0].consumers()]
        assert {c.device for c in consumers} == {"/job:worker/task:2"}
        assert "GatherV2" in {c.type for c in consumers}


@pytest.mark.parametrize("deferred", [True, False])
def test_adams_slot_decays_on_a_server_wait_for_the_aggregated_gradient(deferred):
    """Adam's sparse update reads its slots to decay them over the whole table, which needs no
    gradient: in the chief's graph those reads wait for the embedding's aggregate on its server
    (so the decay runs while the workers communicate, not while they compute); the forward
    pass's lookup does not wait, nor does any other worker's graph."""
    graph, plan = _transformed(0, "adam+clip", run_option="HYBRID",
                               defer_gradient_free_server_work=deferred)
    slot_reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp"
                  and op.inputs[0].op.name in ("embedding/Adam", "embedding/Adam_1")
                  and op.name.startswith("Adam/update_embedding/")]
    assert slot_reads and all(op.device.startswith("/job:ps") for op in slot_reads)
    waits = [op for op in slot_reads if any(
        c.name.startswith("parallax_deferred/") for c in op.control_inputs)]
    # The decays' reads of both slots (m *= beta1, v *= beta2); the others follow the gradient.
    assert sorted(op.inputs[0].op.name for op in waits) == (
        ["embedding/Adam", "embedding/Adam_1"] if deferred else [])
    for op in waits:
        assert any(u.type == "QueueDequeueV2" for u in upstream_ops([op]))
    lookups = [op for op in graph.get_operations() if op.type == "ResourceGather"]
    assert lookups and not any(o.name.startswith("parallax_deferred/")
                               for o in upstream_ops(lookups))
    other, _ = _transformed(1, "adam+clip", run_option="HYBRID")
    assert not [op for op in other.get_operations() if op.name.startswith("parallax_deferred/")]


def _model_with_update_inside(control_flow):
    """An embedding and a dense layer whose gradients are applied inside `control_flow`
    ('cond': one tf.cond for both; 'loop': the embedding's, twice, in a while loop)."""
    graph = tf.Graph()
    with graph.as_default():
        embedding = tf.compat.v1.get_variable("embedding", [10, 2])
        dense = tf.compat.v1.get_variable("dense", [2, 1])
        loss = tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(embedding, [1, 3]), dense))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        grads_and_vars = optimizer.compute_gradients(loss)
        if control_flow == "cond":
            tf.cond(tf.constant(True), lambda: tf.group(optimizer.apply_gradients(grads_and_vars)),
                    tf.no_op)
        else:
            def body(i):
                with tf.control_dependencies([optimizer.apply_gradients(grads_and_vars[:1])]):
                    return i + 1
            tf.compat.v1.while_loop(lambda i: i < 2, body, [tf.constant(0)])
            optimizer.apply_gradients(grads_and_vars[1:])
    return graph


def test_updates_of_server_variables_in_a_loop_or_beside_replicas_in_a_cond_are_refused():
    """tf.cond applying server variables' updates trains (test_user_graphs' cond shapes); a
    while loop's would apply them a varying number of times, and a cond updating replicas too
    would leave the other workers' replicas behind: each refused, saying what to change."""
    loop = _model_with_update_inside("loop")
    with pytest.raises(parallax.ParallaxError, match=r"'while.*' \(a TensorFlow While op\) "
                                                     r"updates variables that live on parameter "
                                                     r"servers.*Apply the update after the loop"):
        make_plan(analyze(loop), PlanOptions(run_option="PS"), Cluster([0, 1]))
    cond = _model_with_update_inside("cond")
    make_plan(analyze(cond), PlanOptions(run_option="PS"), Cluster([0, 1]))
    with pytest.raises(parallax.ParallaxError, match=r"'cond' updates variables on parameter "
                                                     r"servers \['embedding'\] and replicated "
                                                     r"ones \['dense'\] at once.*one applying"):
        make_plan(analyze(cond), PlanOptions(run_option="HYBRID"), Cluster([0, 1]))


@pytest.mark.collectives
@pytest.mark.parametrize("run_option,in_steps", [("PS", False), ("HYBRID", True)])
def test_a_plan_whose_steps_need_no_horovod_uses_it_for_the_first_broadcast_only(run_option,
                                                                                 in_steps):
    """Under PS's rule Keras's LSTM keeps a replica (its seed generator's state): Horovod
    broadcasts it once, and no step runs a Horovod op, so the workers leave Horovod then."""
    graph, _, _ = equivalence.build("lstm", "adam", 4, shard=False)
    plan = make_plan(analyze(graph), PlanOptions(run_option=run_option),
                     Cluster(worker_id=1, **CLUSTER))
    assert plan.uses_collectives and plan.steps_use_collectives is in_steps
    graph = transform(graph, plan)
    broadcasts = contracts.read_broadcasts(graph)
    first_broadcast = upstream_ops(broadcasts) | set(broadcasts)
    in_the_steps = [op.name for op in graph.get_operations()
                    if op.type.startswith(COLLECTIVE_OPS["prefix"])
                    and op not in first_broadcast]
    assert broadcasts and bool(in_the_steps) is in_steps, in_the_steps


def _allreduce_everything(graph):
    """Worker 1's plan of AUTO deciding allreduce for every variable, tables too."""
    analysis = analyze(graph)
    methods = {name: cost.Method(cost.ALLREDUCE) for name in analysis.variables}
    return make_plan(analysis, PlanOptions(run_option="AUTO"), Cluster(worker_id=1, **CLUSTER),
                     decision=Decision(methods=methods, stats={}, note="",
                                       machine_stages=False))


@pytest.mark.collectives
@needs_horovod
@pytest.mark.parametrize("config_name, norm_row", [("adam", False), ("momentum+clip", True)])
def test_a_table_allreduced_as_dense_carries_its_norm_only_where_the_model_clips(config_name,
                                                                                 norm_row):
    """AUTO's choice for a table every batch reads whole: its slices summed into the table's
    shape with a column of counts; one more row for the L2 norm clip_by_global_norm takes
    (every allreduced element costs CPU on the tags benchmark's 15 ms steps). It is averaged
    as the dense gradients are: Horovod fuses allreduces of one reduce op only."""
    graph, _, _ = equivalence.build("sparse", config_name, 4, shard=False)
    plan = _allreduce_everything(graph)
    assert plan.variables["embedding"].sync is Sync.ALLREDUCE
    allreduces = [op for op in transform(graph, plan).get_operations()
                  if op.type == "HorovodAllreduce" and op.name.startswith("parallax_allreduce/")]
    rows = [op.inputs[0].shape[0] for op in allreduces
            if op.inputs[0].name.startswith("parallax_")]
    assert rows == [equivalence.VOCAB + norm_row]  # the other allreduces, the dense gradients
    assert len(allreduces) > 1 and len({op.get_attr("reduce_op") for op in allreduces}) == 1


def test_a_table_of_scalars_allreduced_as_dense_keeps_its_rows_scalars():
    """A bias gathered by ids (lm's softmax bias): its rows have no shape of their own."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.constant([[1, 3], [3, 0]], tf.int64)
        bias = tf.compat.v1.get_variable("bias", [10], initializer=tf.zeros_initializer())
        loss = tf.reduce_sum(tf.square(tf.gather(bias, ids) - 1.0))
        tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
    plan = _allreduce_everything(graph)
    assert plan.variables["bias"].sync is Sync.ALLREDUCE
    transformed = transform(graph, plan)
    aggregated = [transformed.get_tensor_by_name(record.aggregated)
                  for record in contracts.read_aggregates(transformed)]
    assert [t.shape.as_list() for t in aggregated if t.dtype == tf.float32] == [[None]]
