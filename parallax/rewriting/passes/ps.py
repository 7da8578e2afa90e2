"""Parameter-server pass: variables on the servers, gradients aggregated where they live.

Each step every worker pushes its gradient into a queue on the variable's server; the chief
takes all of them there, so the user's post-processing and update ops (placed with the variable)
see the aggregate and run exactly once. A sparse gradient is aggregated by concatenating the
workers' slices; with local aggregation, rows of one id are summed first where the model allows
(row_sums.py), the norm of every row carried beside them. Other workers get the aggregate, when
their graph needs it (for a global norm, say), from a mirror variable the chief fills before it
releases the step.
"""
from __future__ import annotations

import tensorflow as tf

from parallax import contracts, tf_private
from parallax.vocabulary import FUNCTION_CALL_OPS, VARIABLE_OP_TYPES
from parallax.contracts import GradientRecord
from parallax.rewriting import local_aggregation, row_sums
from parallax.rewriting.queues import concat_slices, producer_queues
from parallax.rewriting.rewire import reroute
from parallax.planning.rows import rows_can_be_summed, rows_unique_per_batch
from parallax.planning.job_plan import Plan, Sync
from parallax.rewriting.passes import graph_pass, with_servers


@graph_pass(produces=["server variables placed"], runs_if=with_servers)
def place_variables_on_servers(graph: tf.Graph, plan: Plan) -> tf.Graph:
    """Each server-resident variable, and every op that touches its handle or is colocated
    with it (reads, gathers, updates, initializer, slots), goes to its server. A replicated
    variable TF colocated with one on a server (Adam's beta powers go with the first variable)
    stays with the replica, and so do the ops that touch it."""
    for op in graph.get_operations():
        if op.type in FUNCTION_CALL_OPS:
            # The model's compute (a while loop reading kernels, a cond applying an update)
            # stays on the worker; what the function does with a handle goes to its device.
            continue
        touched = [t.op.name for t in op.inputs if t.op.type in VARIABLE_OP_TYPES]
        if op.type in VARIABLE_OP_TYPES:
            touched.append(op.name)
        groups = [g.decode()[len("loc:@"):] for g in op.colocation_groups()]
        names = touched or groups
        servers = {plan.server_of(name) for name in names} - {None}
        if servers:
            tf_private.set_device(op, plan.cluster.server_device(min(servers)))
        elif any(plan.server_of(name) is not None for name in groups):
            _colocate_with_itself(op)
    return graph


def _colocate_with_itself(op) -> None:
    own = tf.compat.v1.AttrValue(list=tf.compat.v1.AttrValue.ListValue(s=[
        f"loc:@{op.name}".encode()]))
    tf_private.set_attr(op, "_class", own)


@graph_pass(needs=["server variables placed"], produces=["servers ready signal"])
def mark_servers_ready(graph: tf.Graph, plan: Plan) -> tf.Graph:
    """Asynchronous training has no mirror variables, whose initialization by the chief (after
    the servers' variables, and their restore from a checkpoint) tells the other workers they
    may start: one flag variable on the first server stands for them."""
    with graph.as_default(), tf.device(plan.cluster.server_device(0)):
        ready = tf.compat.v1.Variable(True, trainable=False, use_resource=True,
                                      name="parallax_servers_ready", collections=[])
    contracts.record_server_state(graph, ready)
    return graph


@graph_pass(needs=["server variables placed"], produces=["aggregated on servers"])
def aggregate_on_servers(graph: tf.Graph, plan: Plan) -> tf.Graph:
    cluster = plan.cluster
    with graph.as_default(), tf.name_scope("parallax_ps"):
        for var_plan in plan.with_sync(Sync.PS):
            device = cluster.server_device(var_plan.server)
            for index, record in enumerate(var_plan.variable.gradients):
                key = f"{var_plan.variable.name}/{index}"
                parts = _gradient_parts(graph, record)
                consumers = [list(t.consumers()) for t in parts]
                pushed = _outgoing(parts, plan)
                # One item a machine reaches the server (local aggregation), else a worker.
                by_machine = (record.is_sparse and plan.ps_config.local_aggregation
                              and cluster.num_machines > 1)
                queues = producer_queues(pushed, f"grad/{key}", device,
                                         cluster.num_machines if by_machine
                                         else cluster.num_workers)
                if by_machine:
                    push = local_aggregation.push_through_machine(pushed, key, plan,
                                                                  queues[cluster.machine])
                else:
                    push = queues[cluster.worker_id].enqueue(pushed)
                one_row_per_id = (record.is_sparse
                                  and rows_unique_per_batch(parts[1]))
                with tf.device(device):
                    aggregated = _aggregate(queues, pushed, push, var_plan.average,
                                            one_row_per_id, key, cluster)
                for old, new, old_consumers in zip(parts, aggregated, consumers):
                    reroute(old, new, old_consumers)
                    contracts.record_aggregated(
                        old, new, trigger=None if cluster.is_chief else push, on_server=True)
                if row_sums.carries_norm(aggregated):
                    row_sums.use_carried_norm(
                        consumers[0], aggregated[2], on_server=True,
                        trigger=aggregated[0].op if cluster.is_chief else push)
    return graph


def _outgoing(parts, plan: Plan):
    """What a worker pushes: with local aggregation, a sparse gradient's rows summed by id and
    its norm share, where the model allows it (row_sums.py); otherwise the gradient."""
    if (len(parts) == 2 and plan.ps_config.local_aggregation
            and rows_can_be_summed(*parts)):
        return row_sums.sum_rows(*parts) + [row_sums.norm_share(parts[0])]
    return parts


def _aggregate(queues, pushed, own_push, average, one_row_per_id, key, cluster):
    """The step's aggregate: taken from the queue by the chief, which also stores it in mirror
    variables; read from those by the other workers. `one_row_per_id`: summed by id, as
    single-device training sees a gradient of unique ids (rows_unique_per_batch)."""
    mirrors = _mirror_variables(pushed, key)
    if cluster.is_chief:
        aggregated = _take(queues, pushed, own_push, average, cluster.num_workers)
        if one_row_per_id:
            aggregated = row_sums.one_row_per_id(aggregated)
        # Whatever follows the aggregate follows its mirror's write: the release of the step.
        mirrored = []
        for mirror, value in zip(mirrors, aggregated):
            with tf.control_dependencies([mirror.assign(value, read_value=False)]):
                mirrored.append(tf.identity(value))
        return mirrored
    # Read after this worker's own push; the step token will be made to precede the read op.
    with tf.control_dependencies([own_push]):
        reads = [tf.raw_ops.ReadVariableOp(resource=m.handle, dtype=m.dtype) for m in mirrors]
    for read in reads:
        contracts.record_mirror_read(read.graph, read.op)
    return reads


def _gradient_parts(graph, record: GradientRecord):
    names = [record.values, record.indices] if record.is_sparse else [record.dense]
    return [graph.get_tensor_by_name(name) for name in names]


def _take(queues, parts, own_push, average, num_workers):
    """The chief's aggregate of every producer's item, in the producers' order: summed (dense)
    or concatenated (sparse)."""
    with tf.control_dependencies([own_push]):
        if len(parts) == 1:
            aggregated = [tf.reduce_sum(tf.stack([queue.dequeue() for queue in queues]),
                                        axis=0)]
        else:
            aggregated = concat_slices([queue.dequeue() for queue in queues])
    if average:
        aggregated[0] = aggregated[0] / tf.cast(num_workers, aggregated[0].dtype)
        if row_sums.carries_norm(aggregated):  # the norm share of rows scaled by 1/N
            aggregated[2] = aggregated[2] / tf.cast(num_workers ** 2, aggregated[2].dtype)
    return aggregated


def _mirror_variables(parts, key):
    """Variables holding the step's aggregate for the workers other than the chief. A sparse
    gradient's row count changes every step, hence its first dimension is left open (its
    values and indices; not a carried norm)."""
    mirrors = []
    for index, part in enumerate(parts):
        sparse = len(parts) > 1 and index < 2
        shape = tf.TensorShape([None]).concatenate(part.shape[1:]) if sparse else part.shape
        initial = tf.zeros([0] + shape[1:].as_list() if sparse else shape, dtype=part.dtype)
        mirror = tf.compat.v1.Variable(
            initial, trainable=False, shape=shape, validate_shape=not sparse, use_resource=True,
            name=f"mirror_{key.replace('/', '_')}_{index}", collections=[])
        contracts.record_server_state(mirror.graph, mirror)
        mirrors.append(mirror)
    return mirrors
