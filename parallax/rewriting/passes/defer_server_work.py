"""Server work that does not need the step's gradient waits for it (the chief's graph). Adam's
sparse update decays its slots over the whole table (m *= beta1, v *= beta2) before it adds the
gradient's rows: TensorFlow runs that at the start of the step, while the workers compute, on
the cores a server shares with its machine's workers. Here a read of a server variable's state
that only updates use, and only after an aggregate, waits for the aggregates on its server that
all it leads to waits for anyway (its own variable's gradient's, where that is one of them): the
decay runs while the workers communicate. Values and the order of writes are unchanged, and a
run that does not apply that gradient (a separate train op, a monitor) reaches no delayed read.

Runs after aggregate_on_servers (the aggregates) and the placement passes (the devices)."""
from __future__ import annotations

from typing import Dict, List, Set

import tensorflow as tf

from parallax import contracts, tf_private
from parallax.vocabulary import consumers, downstream_ops, upstream_ops
from parallax.planning.job_plan import Plan, Sync
from parallax.rewriting.passes import graph_pass


@graph_pass(needs=["aggregated on servers", "post-aggregation ops placed", "boundary ops placed"],
            produces=["gradient-free server work deferred"],
            runs_if=lambda plan: (plan.cluster.is_chief
                                  and plan.ps_config.defer_gradient_free_server_work))
def defer_gradient_free_server_work(graph: tf.Graph, plan: Plan) -> tf.Graph:
    gates = _aggregates_by_variable(graph, plan)
    writes = {graph.get_operation_by_name(name) for name in plan.server_writes}
    aggregates = sorted({op for ops in gates.values() for op in ops}, key=lambda op: op.name)
    if not aggregates or not writes:
        return graph
    update = upstream_ops(writes) | writes
    after = downstream_ops(aggregates)
    only_for_updates = _used_only_by(update - upstream_ops(aggregates) - set(aggregates) - after,
                                     after, writes)
    needs = _Upstream()
    with graph.as_default(), tf.name_scope("parallax_deferred"):
        for read in sorted(only_for_updates, key=lambda op: op.name):
            if read.type != "ReadVariableOp" or not read.device.startswith("/job:ps"):
                continue
            # What everything the read leads to waits for anyway; its own variable's first.
            leads_to = {read} | downstream_ops([read], inside=only_for_updates)
            boundary = [c for op in leads_to for c in consumers(op) if c in after]
            common = [g for g in aggregates if g.device == read.device
                      and all(g in needs(b) for b in boundary)]
            own = [g for g in gates.get(_owner(read.inputs[0].op), []) if g in common]
            waits = own or common
            if boundary and waits:
                with tf.device(read.device):  # reads the aggregate's value: a run that feeds
                    # it (steps.py, a monitor's kept aggregate) needs no other
                    gate = tf.group(*[tf.identity(g.outputs[0]) for g in waits])
                tf_private.add_control_inputs(read, [gate])
    return graph


class _Upstream:
    """upstream_ops of one op, remembered."""

    def __init__(self):
        self._found: Dict[tf.Operation, Set[tf.Operation]] = {}

    def __call__(self, op) -> Set[tf.Operation]:
        if op not in self._found:
            self._found[op] = upstream_ops([op])
        return self._found[op]


def _aggregates_by_variable(graph, plan: Plan) -> Dict[str, List[tf.Operation]]:
    """Each server variable's aggregated gradients, the ops that make them on its server."""
    aggregated = contracts.read_aggregated(graph)
    gates = {}
    for var_plan in plan.with_sync(Sync.PS):
        names = [r.values if r.is_sparse else r.dense for r in var_plan.variable.gradients]
        ops = [graph.get_tensor_by_name(aggregated[n]).op for n in names if n in aggregated]
        gates[var_plan.variable.name] = [op for op in ops if op.device.startswith("/job:ps")]
    return {name: ops for name, ops in gates.items() if ops}


def _used_only_by(candidates: Set[tf.Operation], after: Set[tf.Operation],
                  writes: Set[tf.Operation]) -> Set[tf.Operation]:
    """The candidates whose every consumer, by data or control, is another such candidate,
    comes after the aggregates (an update's rest), or is a value read after a write and used by
    nothing (what a resource assign returns): a run that reaches a delayed op trains."""
    kept, changed = set(candidates), True
    while changed:
        changed = False
        for op in list(kept):
            if any(c not in kept and c not in after and not _read_after(c, writes)
                   for c in consumers(op)):
                kept.discard(op)
                changed = True
    return kept


def _read_after(op, writes: Set[tf.Operation]) -> bool:
    return (op.type == "ReadVariableOp" and not consumers(op)
            and any(c in writes for c in op.control_inputs))


def _owner(variable) -> str:
    """The variable `variable` is colocated with (an optimizer's slot's), or its own name."""
    groups = [g.decode()[len("loc:@"):] for g in variable.colocation_groups()]
    return next((g for g in groups if g != variable.name), variable.name)
