"""What one run of the runner is to the job, and what it must add so that every worker stays in
step.

- A training step reaches a write of a variable (an update, a slot, an accumulator, a moving
  average), looking no further back than the aggregated gradients. Every worker runs the same
  steps. The step's aggregates are those behind its writes; the chief adds the release of the
  step when server-side updates or aggregates are part of it (passes/sync.py), and each worker
  keeps the values of the step's aggregates that monitoring ops read (a gradient histogram).
- Any other aggregate a run needs — in a run that writes nothing (a summary that only the chief
  fetches now and then), or beside another train op's step — is fed the last value this worker
  took part in, so it communicates with no one: a collective run by one worker alone would pair
  with another worker's training step.
- A Saver's restore (`saver.restore(runner, path)`) is a step of its own (passes/sync.py): the
  chief restores everything and releases the others, who restore their own replicas only and
  wait for the release. In every mode the runner reports a restore to the driver, which stops a
  job where one worker restored and another trained on without.
- Anything else (the loss of a batch, a variable) runs as it is; but in a worker other than the
  chief, a fetched read of a server variable that the step does not need (global_step fetched
  with the train op) is read before the step, as one device reads it: read during the step,
  it would race with the chief's update.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List

import tensorflow as tf

from parallax import contracts, tf_private
from parallax.errors import ParallaxError
from parallax.vocabulary import (ENQUEUE_OP_TYPES, RESTORE_OP_TYPES, VARIABLE_OP_TYPES,
                                 data_consumers, upstream_ops, walk)
from parallax.rewriting.passes.sync import release_step


@dataclasses.dataclass
class _RunPlan:
    extra: List  # ops run beside the user's fetches (the release of a step)
    keep: List[tf.Tensor]  # aggregates whose values are kept for monitoring runs
    feed: List[tf.Tensor]  # aggregates fed with their kept values
    early: List[tf.Tensor] = dataclasses.field(default_factory=list)  # read before the step
    training: bool = False  # the run is a training step
    restore: bool = False  # the run restores variables from a checkpoint
    # fetched op -> what runs in its place (a restore of this worker's replicas only)
    replace: Dict[tf.Operation, tf.Operation] = dataclasses.field(default_factory=dict)


class Steps:
    def __init__(self, graph: tf.Graph, is_chief: bool, training_writes: Iterable[str]):
        self._graph = graph
        self._is_chief = is_chief
        self._triggers = {graph.get_tensor_by_name(name): graph.get_operation_by_name(trigger)
                          for name, trigger in contracts.read_triggers(graph).items()}
        self._aggregates_of: Dict[tf.Operation, List[tf.Tensor]] = {}
        for aggregate in self._triggers:
            self._aggregates_of.setdefault(aggregate.op, []).append(aggregate)
        self._on_server = {graph.get_tensor_by_name(n)
                           for n in contracts.read_server_aggregates(graph)}
        cuts = contracts.read_server_writes(graph)
        self._server_writes = set(cuts)
        self._writes = {graph.get_operation_by_name(name) for name in training_writes} | {
            graph.get_operation_by_name(cut) for cut in cuts.values() if cut}
        self._computed_from_aggregates = self._aggregates_computed_from_others()
        # An aggregate some consumer of which leads to no write feeds a monitor (a summary).
        lead_to_writes = upstream_ops(self._writes) | self._writes
        self._monitored = {a for a in self._triggers
                           if any(c not in lead_to_writes for c in a.consumers())}
        self._server_variables = set() if is_chief else {
            op for op in graph.get_operations()
            if op.type in VARIABLE_OP_TYPES and op.device.startswith("/job:ps")}
        self._restore_wait = contracts.read_restore_wait(graph)
        self._releases_restores = is_chief and contracts.read_step_queues(graph) is not None
        self._plans: Dict[tuple, _RunPlan] = {}
        self._kept: Dict[str, object] = {}

    def run(self, session, fetches, feed_dict, options=None, run_metadata=None):
        """The fetched values, whether the run was a training step, and whether it restored
        variables from a checkpoint."""
        plan = self._plan_of(fetches, feed_dict)
        feeds = dict(feed_dict or {})
        if plan.early:
            feeds.update(zip(plan.early, session.run(plan.early, feed_dict=feeds)))
        for aggregate in plan.feed:
            if aggregate.name not in self._kept:
                raise ParallaxError(self._not_kept(aggregate))
            feeds[aggregate] = self._kept[aggregate.name]
        if plan.replace:
            fetches = tf.nest.map_structure(
                lambda e: plan.replace.get(e, e) if isinstance(e, tf.Operation) else e, fetches)
        result, extra = session.run((fetches, plan.extra + plan.keep), feed_dict=feeds,
                                    options=options, run_metadata=run_metadata)
        for aggregate, value in zip(plan.keep, extra[len(plan.extra):]):
            self._kept[aggregate.name] = value
        return result, plan.training, plan.restore

    def is_training(self, fetches, feed_dict) -> bool:
        """Whether a run of these fetches and feeds is a training step."""
        return self._plan_of(fetches, feed_dict).training

    def _plan_of(self, fetches, feed_dict) -> _RunPlan:
        fed = set(feed_dict or {})
        elements = [e for e in tf.nest.flatten(fetches) if e is not None]
        key = (tuple(e.name for e in elements), tuple(sorted(t.name for t in fed)))
        if key not in self._plans:
            self._plans[key] = self._plan(elements, fed)
        return self._plans[key]

    def _not_kept(self, aggregate) -> str:
        why = (f"this run needs the aggregated gradient {aggregate.name!r} but applies nothing "
               "with it: Parallax then gives it the last aggregate (aggregating it here would "
               "be a collective of this worker alone)")
        if aggregate not in self._monitored:
            # Kept are aggregates one of whose consumers leads to no update (a summary of the
            # gradient); a summary of a global norm shares its consumer with the clipping.
            return (f"{why}, and training steps keep only those read by ops that lead to no "
                    "update; this one reaches the run through ops that also lead to an update "
                    "(a global norm that clips the gradients, say). Fetch what needs it "
                    "together with the train op, in the same run")
        return (f"{why}, and no training step has produced one yet. Fetch it together with "
                "the train op that applies it, or after such a step")

    def _plan(self, elements, fed) -> _RunPlan:
        reached, aggregates = self._reached([getattr(e, "op", e) for e in elements], fed)
        writes = reached & self._writes
        restores = {}
        if self._releases_restores or self._restore_wait is not None:  # steps synchronized
            restores = {e: _restore_writes(e) for e in elements if isinstance(e, tf.Operation)}
            restores = {op: ops for op, ops in restores.items() if ops}
        if restores:
            if writes:
                raise ParallaxError(
                    f"this run restores a checkpoint ({next(iter(restores)).name!r}) and trains "
                    "in the same step: run the restore on its own (saver.restore(runner, path))")
            return self._restore_plan(restores)
        # The step's own aggregates are those behind its writes (or, read from a server, whose
        # push is); any other one the run needs (a monitor) gets its last value.
        behind, behind_aggregates = self._reached(writes, fed)
        part = {a for a, trigger in self._triggers.items()
                if a in behind_aggregates or trigger in behind}
        feed = sorted(aggregates - part, key=lambda t: t.name)
        if not writes:
            return _RunPlan([], [], feed, restore=any(op.type in RESTORE_OP_TYPES
                                                      for op in reached))
        extra = []
        if self._is_chief:
            released = [w for w in writes if w.name in self._server_writes]
            released += [a.op for a in part if a in self._on_server]
            if released:
                extra.append(release_step(self._graph, sorted(set(released),
                                                              key=lambda op: op.name)))
        keep = sorted((a for a in part if a in self._monitored), key=lambda t: t.name)
        early = [e for e in elements if self._reads_a_server_variable(e) and e.op not in behind
                 and e not in fed and e not in aggregates]  # a mirror's read is the step's
        return _RunPlan(extra, keep, feed, early, training=True)

    def _restore_plan(self, restores: Dict[tf.Operation, List[tf.Operation]]) -> _RunPlan:
        """The chief restores everything, then releases the others; they restore their
        replicas and wait for the release, so none writes a server variable."""
        if self._releases_restores:
            return _RunPlan([release_step(self._graph, list(restores), "restore_queues")], [],
                            [], restore=True)
        replace = {}
        with self._graph.as_default(), tf.name_scope("parallax_sync/restore"):
            for op, writes in restores.items():
                own = [w for w in writes
                       if not any(t.op in self._server_variables for t in w.inputs)]
                # Not tf.group: it marks the ops it waits for, ops a session may have run.
                done, waits = tf.no_op(), own + [self._restore_wait]
                tf_private.add_control_inputs(done, waits)
                replace[op] = done
        return _RunPlan([], [], [], replace=replace, restore=True)

    def _reads_a_server_variable(self, element) -> bool:
        """Whether `element` is a plain read of a server variable (not a value computed from
        one: that would compute the forward pass, and take a batch, a second time; nor a read
        ordered after something, as the value an assign returns is read after the assign)."""
        return (isinstance(element, tf.Tensor) and element.op.type == "ReadVariableOp"
                and element.op.inputs[0].op in self._server_variables
                and not element.op.control_inputs)

    def _reached(self, start_ops, fed):
        """Ops a run of `start_ops` runs, up to and including the aggregates; those aggregates."""
        aggregates = set()

        def ahead(op):
            if op in self._aggregates_of:
                aggregates.update(self._aggregates_of[op])
                if op not in self._computed_from_aggregates:
                    return []
            return [t.op for t in op.inputs if t not in fed] + list(op.control_inputs)

        return set(walk(start_ops, ahead)), aggregates

    def _aggregates_computed_from_others(self) -> set:
        """Aggregate ops computed from another aggregate, as a penalty on the gradients is
        differentiated again (analysis.differentiated): what is behind them reaches on to the
        aggregates they need, which a step computes with them."""
        after_aggregates = [c for op in self._aggregates_of for c in data_consumers(op)]

        def handed_on(op):
            # A queue's enqueue hands its values on to what waits for it: the step's side of
            # a collective run apart from the steps (collectives/tensorflow.py) dequeues the
            # results after it, by control.
            waiting = tf_private.control_outputs(op) if op.type in ENQUEUE_OP_TYPES else []
            return [c for c in data_consumers(op) + waiting if c not in self._writes]

        computed = walk([op for op in after_aggregates if op not in self._writes], handed_on)
        return {op for op in computed if op in self._aggregates_of}


def _restore_writes(op: tf.Operation) -> List[tf.Operation]:
    """The ops a Saver's restore op groups (through tf.group's NoOps) when one of them writes a
    value read from a checkpoint; else none."""
    grouped, stack = [], [op]
    while stack:
        member = stack.pop()
        if member.type == "NoOp":
            stack.extend(member.control_inputs)
        else:
            grouped.append(member)
    restored = any(source.type in RESTORE_OP_TYPES for source in upstream_ops(grouped))
    return grouped if restored else []
