"""Step synchronization pass: the updates of server-resident state run once per step, by the
chief, and no worker starts its next step before the chief applied this one (paper §6).

A step is what one run fetches. Each worker other than the chief has its own queue of step
tokens on the first server, so no worker can take another's token. In its graph every
server-side update is replaced by a cut: an op that waits until the worker has pushed the
gradients the update needs and has taken its token. The chief's runner, in each run that
reaches server-side updates or aggregates, also runs a release: one token per other worker,
after those updates and aggregates (`release_step`). A graph with several train ops (a GAN's two
optimizers, an accumulate op and a separate apply op) thus applies each run's own updates only.

A restore from a checkpoint (`saver.restore(runner, path)`) is a step of its own: the chief
restores the servers' variables, then releases one token per other worker on a second set of
queues; the others restore their own replicas only and wait for that token, so no worker's next
step reads (or, restoring late, overwrites) a server variable the chief is restoring or has
updated since (steps.py builds both runs).
"""
from __future__ import annotations

from typing import Iterable

import tensorflow as tf

from parallax import contracts, tf_private
from parallax.errors import ParallaxError
from parallax.rewriting.rewire import reroute
from parallax.planning.job_plan import Plan
from parallax.rewriting.passes import graph_pass, with_servers
from parallax.vocabulary import computed_from, data_consumers, parents, walk


@graph_pass(needs=["aggregated on servers", "worker ops pinned"], produces=["steps synchronized"],
            runs_if=with_servers)
def synchronize_steps(graph: tf.Graph, plan: Plan) -> tf.Graph:
    cluster = plan.cluster
    # plan.make_plan refused server writes the gradients wait for: they would wait for a token.
    writes = [graph.get_operation_by_name(name) for name in plan.server_writes]
    with graph.as_default(), tf.name_scope("parallax_sync"):
        with tf.device(cluster.server_device(0)):
            queues = {worker: tf.queue.FIFOQueue(
                1, [tf.int64], shapes=[[]], shared_name=f"parallax/step_tokens/{worker}",
                name=f"step_tokens_{worker}") for worker in range(1, cluster.num_workers)}
            # Unbounded: a chief that restores alone leaves tokens, never waits for a worker.
            restored = {worker: tf.queue.FIFOQueue(
                -1, [tf.int64], shapes=[[]], shared_name=f"parallax/restore_tokens/{worker}",
                name=f"restore_tokens_{worker}") for worker in range(1, cluster.num_workers)}
        if cluster.is_chief:
            contracts.record_step_queues(graph, contracts.StepQueues(
                tuple(q.queue_ref.name for q in queues.values()),
                tuple(q.queue_ref.name for q in restored.values())))
            for write in writes:
                contracts.record_server_write(graph, write)
            return graph
        wait = queues[cluster.worker_id].dequeue(name="wait_for_step").op
        restore_wait = restored[cluster.worker_id].dequeue(name="wait_for_restore").op
        contracts.record_restore_wait(graph, restore_wait)
        for read in contracts.read_mirror_reads(graph):
            tf_private.add_control_inputs(read, [wait])
        pushes_behind = _pushes_behind(graph)
        for write in writes:
            # What the update was ordered after still runs (other updates' cuts, say).
            cut = tf.group(wait, *pushes_behind(write), *write.control_inputs, name="cut")
            for consumer in tf_private.control_outputs(write):
                _replace_control_input(consumer, write, cut)
            for output in write.outputs:
                _stand_in_after(cut, output, set(writes))
            contracts.record_server_write(graph, write, cut)
    return graph


def release_step(graph: tf.Graph, reached: Iterable[tf.Operation],
                 queues: str = "token_queues") -> tf.Operation:
    """The chief's release of one step: a token for every other worker, after `reached` (the
    run's server-side updates and aggregates), on the step's queues or, with `queues`
    "restore_queues", those of restores. Built by the runner per kind of run, after the
    session started: new ops only, the graph it runs keeps its other ops."""
    handles = getattr(contracts.read_step_queues(graph), queues)
    with graph.as_default(), tf.name_scope("parallax_sync/release"):
        token = tf.constant(0, tf.int64)
        releases = [tf.raw_ops.QueueEnqueueV2(handle=graph.get_tensor_by_name(h),
                                              components=[token]) for h in handles]
        releases = releases or [tf.no_op()]
        # Not tf.control_dependencies: it marks the ops it waits for with an attribute, a
        # mutation of ops a session has run (TensorFlow warns about each).
        for release in releases:
            tf_private.add_control_inputs(release, reached)
        return tf.group(*releases)


def _pushes_behind(graph):
    """write -> this worker's pushes of the aggregates the write is computed from."""
    push_of = {graph.get_tensor_by_name(name).op: graph.get_operation_by_name(trigger)
               for name, trigger in contracts.read_triggers(graph).items()}
    all_pushes = set(push_of.values())

    def is_push(op):
        return op in push_of or op in all_pushes

    def pushes(write):
        found = {push_of.get(op, op) for op in walk([write], lambda op: [] if is_push(op)
                                                   else parents(op)) if is_push(op)}
        return sorted(found, key=lambda o: o.name)
    return pushes


def _stand_in_after(cut, output, writes) -> None:
    """A cut update's result read for ordering only (tf.cond's result, which
    tf.control_dependencies turns into a wait for its Identity): a constant after the cut. One
    that only other server-side updates compute from (a reference variable's scatter_add in
    Adam's update) is read by nothing this worker runs: those updates are cut too."""
    consumers = list(output.consumers())
    if not consumers or _feeds_only(output, writes):
        return
    orders_only = all(c.type == "Identity" and not any(o.consumers() for o in c.outputs)
                      for c in consumers)
    if not (orders_only and output.shape.is_fully_defined()):
        raise ParallaxError(
            f"{output.name!r}, the result of {output.op.name!r}, which updates variables on "
            "parameter servers, is used as a value: only the chief runs such updates. Use it "
            "for ordering only (tf.control_dependencies), or use run_option='AR'")
    with tf.control_dependencies([cut]):
        stand_in = tf.zeros(output.shape, output.dtype)
    reroute(output, stand_in, consumers)


def _feeds_only(tensor, ends) -> bool:
    """Whether every data path from `tensor` ends at one of the ops `ends`."""
    # An op no other takes from is a value some run may fetch.
    return all(data_consumers(op) for op in computed_from(tensor.consumers(), ends))


def _replace_control_input(op, old, new) -> None:
    kept = [c for c in op.control_inputs if c is not old and c is not new]
    tf_private.set_control_inputs(op, kept + [new])
