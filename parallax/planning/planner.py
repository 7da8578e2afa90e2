"""The planner of run_option='AUTO' (and of search_partitions, split_variables), in its parts:
`pose` makes the Problem (problem.py) from the graph's analysis and what the driver measured
(measure.py); the proposal (proposal.py) searches the candidates (candidates.py) by their
rating (cost.py); the explanation (explanation.py) says why. `decide` gives the result as the
Decision the plan (job_plan.py) carries to every worker."""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from parallax import tf_private
from parallax.cluster import Cluster
from parallax.config import PlanOptions
from parallax.contracts import read_tables
from parallax.errors import ParallaxError
from parallax.partitioner import partitioned_variables
from parallax.planning import cost, explanation, split_rules
from parallax.planning.analysis import GraphAnalysis
from parallax.planning.measure import Measurements, measure
from parallax.planning.job_plan import Decision
from parallax.planning.problem import Compute, Cores, Partition, Problem
from parallax.planning.proposal import Proposal, propose
from parallax.planning.rows import rows_can_be_summed
from parallax.vocabulary import STATEFUL_RANDOM_OP_TYPES, upstream_ops


def decide(graph: tf.Graph, analysis: GraphAnalysis, measured: Measurements,
           options: PlanOptions) -> Decision:
    """The proposal for what was `measured`, as the plan's Decision."""
    problem = pose(graph, analysis, measured, options)
    return decision(problem, propose(problem))


def measure_and_decide(graph: tf.Graph, analysis: GraphAnalysis,
                       workers_per_machine: List[int], links: Optional[cost.Links] = None,
                       within_machine: Optional[cost.Links] = None,
                       cores: Optional[Cores] = None, **options) -> Decision:
    """The driver's measurement and decision in one call, on this machine. `options`:
    PlanOptions' (run_option AUTO unless given)."""
    return decide(graph, analysis, measure(graph, analysis, workers_per_machine, links,
                                           within_machine, cores),
                  PlanOptions(**{"run_option": "AUTO", **options}))


def pose(graph: tf.Graph, analysis: GraphAnalysis, measured: Measurements,
         options: PlanOptions) -> Problem:
    """The problem of planning `graph` for the measured cluster under `options`."""
    shape, auto = measured.shape, options.run_option == "AUTO"
    machines = [m for m, count in enumerate(measured.workers_per_machine) for _ in range(count)]
    stages = options.hierarchical_allreduce if Cluster(machines).machine_groups() else False
    fixed = dict(
        shape=shape, run_option=options.run_option, split=options.split_variables,
        machine_stages=stages, inside=measured.within_machine,
        links=measured.links or cost.Links(), links_measured=measured.links is not None,
        transport=measured.transport, collective=measured.collective,
        trial_margin=options.trial_margin, tables=_tables(graph, options),
        # Not measured: the workers' machines taken to be like this one, each its own.
        cores=measured.cores or Cores(os.cpu_count() or 1),
        **cost.ps_options(options.ps_config))
    if measured.problem:
        variables = {name: cost.VariableStats(name, info.nbytes,
                                              rows=0 if info.is_sparse else None,
                                              table_rows=info.shape[0] if info.is_sparse else 0)
                     for name, info in analysis.variables.items()}
        splittable, whole = _splittable(graph, analysis, [], set(), variables)
        return Problem(variables, unmeasured=measured.problem, splittable=splittable,
                       whole=whole, **fixed)
    summable = {v.name for v in analysis.sparse if all(
        rows_can_be_summed(graph.get_tensor_by_name(r.values), graph.get_tensor_by_name(r.indices))
        for r in v.gradients if r.is_sparse)}
    partitions = [Partition(p.name, tuple(p.shards), p.min_partitions)
                  for p in (partitioned_variables(graph) if options.search_partitions else [])]
    off_servers = _kept_off_servers(analysis) if auto else set()
    variables = _merge_shards(measured.stats, partitions, summable, off_servers)
    splittable, whole = _splittable(graph, analysis, partitions, off_servers, variables)
    timing = measured.timing
    return Problem(
        variables, summable=frozenset(summable), off_servers=frozenset(off_servers),
        partitions=tuple(partitions), splittable=splittable, whole=whole,
        compute=Compute(timing.alone, timing.cpu) if timing else None,
        compute_problem=measured.compute_problem,
        untimed=_why_untimed(graph, analysis) if auto else None, **fixed)


def _tables(graph: tf.Graph, options: PlanOptions) -> frozenset:
    """The variables of the graph's dynamic embeddings, which only servers hold."""
    tables = read_tables(graph)
    if tables and options.run_option == "AR":
        raise ParallaxError(
            f"dynamic embedding '{tables[0].name}': run option AR keeps every variable on the "
            "workers, and a dynamic embedding's rows and keys live on parameter servers; run "
            "it with run_option PS, HYBRID or AUTO")
    return frozenset(record.variable for record in tables)


def decision(problem: Problem, proposal: Proposal) -> Decision:
    """The proposal as the plan carries it."""
    measured = not problem.unmeasured
    return Decision(
        methods=proposal.methods, stats=proposal.stats if measured else {},
        note=explanation.note(problem, proposal), compute=problem.worker_compute,
        alone=problem.compute.alone if problem.compute else None,
        links=problem.links if measured else None, step=proposal.step,
        partitions=list(proposal.partitions), machine_stages=proposal.machine_stages,
        splits=dict(proposal.splits), run_option=problem.run_option,
        alternatives=list(proposal.alternatives))


def _why_untimed(graph: tf.Graph, analysis: GraphAnalysis) -> Optional[str]:
    """Why the plans cannot take turns on the training steps, or None: a plan change starts a
    new session, which carries the variables and a tf.data iterator's position over, but
    starts a queue-based input pipeline or a random op of the step over (its numbers drawn
    again from the start). A candidate sampler (sampled softmax, nce_loss) would start over
    too, but it does not count: each worker draws its own candidates, so such a step equals
    one device's in no plan, and the trials lose nothing of it."""
    if graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
        return "its input comes from queue runners, which a new session would start over"
    tables = read_tables(graph)
    if tables:
        return (f"a plan's dynamic embedding ('{tables[0].name}') keeps its keys on that "
                "plan's servers, which the next plan would start without")
    step = upstream_ops([graph.get_operation_by_name(name)
                         for name in dict.fromkeys(analysis.training_writes)])
    drawn = sorted(op.name for op in step if op.type in STATEFUL_RANDOM_OP_TYPES)
    if drawn:
        return (f"its step draws random numbers ({drawn[0]!r}), which a new session would "
                "draw again from the start")
    return None


def _kept_off_servers(analysis: GraphAnalysis) -> set:
    """Variables whose updates, or their extra state's (a moving average), the gradients wait
    for: make_plan refuses them on a server, where they would wait for the step's end."""
    writes = {name: set(info.update_ops) for name, info in analysis.variables.items()}
    for state in analysis.extra_state.values():
        if state.owner in writes:
            writes[state.owner].update(state.update_ops)
    return {name for name, ops in writes.items() if ops & analysis.before_gradients}


def _splittable(graph, analysis, partitions, off_servers, variables
                ) -> Tuple[Tuple[str, ...], Dict[str, str]]:
    """The sparse variables the user did not partition (neither with parallax.get_partitioner
    nor with TensorFlow's partitioners) that the workers can split together, where a server
    may hold them, largest first (split_rules.splittable_in_turn); and why each other one is
    kept whole."""
    partitioned = {name for p in partitions for name in p.shards} | {
        v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        if tf_private.save_slice_info(v) is not None}
    candidates, whole = [], {}
    for info in analysis.sparse:
        if info.name in partitioned:
            continue  # the user's own shards
        if info.name in off_servers:
            why = "the gradients wait for its updates, which keeps it off the servers"
        elif info.shape[0] <= 1:
            why = "it has one row"
        else:
            why = split_rules.splittable(graph, [info.name])
        if why is None:
            candidates.append(info.name)
        else:
            whole[info.name] = why
    kept, apart = split_rules.splittable_in_turn(
        graph, sorted(candidates, key=lambda name: -variables[name].nbytes))
    whole.update(apart)
    for table in read_tables(graph):
        if table.variable in whole:
            raise ParallaxError(f"dynamic embedding '{table.name}': its rows cannot be split "
                                f"over the servers: {whole[table.variable]}")
    return tuple(kept), whole


def _merge_shards(stats, partitions, summable, off_servers) -> Dict[str, cost.VariableStats]:
    """The statistics with each partitioned variable whole: the proposal chooses its method
    and number of shards (of the same rows, 1/k to each)."""
    merged = dict(stats)
    for partition in partitions:
        shards = [merged.pop(name) for name in partition.shards]
        first = shards[0]
        merged[partition.name] = dataclasses.replace(
            first, name=partition.name, nbytes=sum(s.nbytes for s in shards),
            rows=None if not first.sparse else sum(s.rows for s in shards),
            unique=tuple(map(sum, zip(*(s.unique for s in shards)))),
            ready=max(s.ready for s in shards), update=sum(s.update for s in shards),
            table_rows=sum(s.table_rows for s in shards))
        if all(name in summable for name in partition.shards):
            summable.add(partition.name)
        if off_servers.intersection(partition.shards):
            off_servers.add(partition.name)
    return merged
