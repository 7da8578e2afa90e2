"""The driver: the process the user started. It makes the plan once — analysis, measurement
(AUTO, search_partitions, split_variables), the search, the split decisions, the method and
place of every variable — and launches the job with it (launch.py); it does not return."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
from typing import List, NoReturn, Optional

import tensorflow as tf

from parallax import collectives, contracts, launch
from parallax.cluster import Cluster
from parallax.config import Config, PlanOptions
from parallax.errors import ParallaxError
from parallax.planning import cost, server_memory
from parallax.planning.analysis import GraphAnalysis
from parallax.planning.measure import Measurements, input_batch, measure, unmeasurable
from parallax.partitioner import partitioned_variables
from parallax.planning.job_plan import (Decision, Plan, check_plan, effective_run_option,
                                    make_plan)
from parallax.planning.planner import decide
from parallax.planning.problem import Cores
from parallax.planning.query import FedSteps, report
from parallax.rewriting.split_variables import copy_and_split
from parallax.runtime import input_position
from parallax.runtime.query_runner import QueryRunner
from runner.settings import Settings


def run(graph: tf.Graph, analysis: GraphAnalysis, resources: str, config: Config
        ) -> NoReturn:
    settings = config.launch_settings
    plans = make_job_plans(graph, analysis, resources, config.plan_options, settings)
    server_memory.check_server_memory(graph, plans[0],
                                      config.plan_options.ps_config.server_memory_bytes)
    if config.ckpt_config.ckpt_dir:
        server_memory.check_checkpoint(
            graph, input_position.resume_point(config.ckpt_config.ckpt_dir)[0])
    for warning in warnings(plans[0], analysis):
        launch.say(f"warning: {warning}")
    cluster = plans[0].cluster
    launch.run_driver(resources, settings, config.runtime_options, cluster.has_servers,
                      cluster.collectives, contracts.plan_env([plan.to_text() for plan in plans],
                                         plans[0].decision.partitions if plans[0].decision
                                         else []))


def answer(graph: tf.Graph, analysis: GraphAnalysis, config: Config,
           query: contracts.PlanQuery) -> QueryRunner:
    """`python -m parallax.plan`'s question: what each run option's plan would cost on the
    query's cluster, measured on this machine (or on the query's resources, probed), written
    to query.out; then the script ends, having launched nothing. A graph the script feeds is
    measured on its first steps' feeds: the script trains them with the runner returned."""
    if query.resources:
        measured = measure_job(graph, analysis, query.resources, config.launch_settings,
                               collectives.choose(config.plan_options.collectives))
    else:
        inside = (cost.Links(query.inside_bandwidth, query.inside_latency or 0.0)
                  if query.inside_bandwidth else None)
        measured = _measured_with_transport(
            graph, analysis, "localhost", config.launch_settings,  # the transport of this machine
            collectives.choose(config.plan_options.collectives),
            [query.workers_per_machine] * query.machines,
            cost.Links(query.bandwidth, query.latency), inside,
            Cores(query.cores or os.cpu_count() or 1))
    if measured.fed:
        return QueryRunner(graph, analysis, measured,
                           functools.partial(write_answer, graph, analysis, config, query))
    write_answer(graph, analysis, config, query, measured)
    raise SystemExit(0)  # the script's work is done: its answer


def write_answer(graph: tf.Graph, analysis: GraphAnalysis, config: Config,
                 query: contracts.PlanQuery, measured: Measurements,
                 fed_batch: Optional[int] = None, fed: Optional[FedSteps] = None) -> None:
    """The answer to `query` for what was `measured`, in the file query.out, whole or not at
    all (the command reads a file that is there as the answer); `fed_batch` and `fed`: what
    the measured feeds of a fed graph gave."""
    batch, unknown = ((query.batch or fed_batch, None) if query.batch or fed_batch
                      else input_batch(graph))
    answered = report(graph, analysis, measured, config.plan_options, query.step, batch,
                      unknown, links_given=not query.resources, fed=fed)
    written = f"{query.out}.part"
    with open(written, "w", encoding="utf-8") as out:
        json.dump(contracts.to_wire(answered), out, indent=1)
    os.replace(written, query.out)


def warnings(plan: Plan, analysis: GraphAnalysis) -> List[str]:
    """What the driver warns of before the job starts: where the job will not train as one
    device would, or may not."""
    said = []
    unsynchronized = plan.unsynchronized_batch_norms
    if unsynchronized:
        said.append(
            f"sync_batch_norm=False: {len(unsynchronized)} batch norm(s) "
            f"({_first_three(map(repr, unsynchronized))}) normalize "
            f"each worker's own batch, 1/{plan.num_workers} of the combined one, so the model "
            "does not train as on one device; leave sync_batch_norm unset to combine their "
            "statistics")
    unclear = analysis.unclear_counters
    if unclear:
        named = _first_three(f"{variable!r} ({write!r})" for write, variable in unclear)
        said.append(
            f"{len(unclear)} assign_add(s) add to {named} "
            "a value of each worker's own data that is neither a sum over the batch (summed "
            "over workers, as one device counts) nor a per-step value: averaged over workers. "
            "If one counts the batch's examples, compute it with tf.reduce_sum or tf.size over "
            "the batch")
    divisions = analysis.unclear_denominators
    if divisions:
        said.append(
            f"{len(divisions)} loss(es) divide a sum over the batch by a value of each "
            f"worker's own data ({_first_three(map(repr, divisions))}) "
            "that is neither a sum over the batch (which Parallax takes over the combined batch, "
            "as one device does) nor a per-step value: each worker divides by its own, so the "
            "job may not train as one device would. If it counts the batch's tokens or weights, "
            "compute it with tf.reduce_sum over the batch")
    return said


def make_job_plans(graph: tf.Graph, analysis: GraphAnalysis, resources: str,
                   options: PlanOptions, settings: Settings) -> List[Plan]:
    """The job's plan, for the cluster of `resources` (its shape: the workers find the
    servers' addresses in their own environment), then the plans AUTO times against it on the
    cluster (options.trial_steps), if any. `settings`: how the links' probe reaches the
    hosts."""
    if options.decides:
        measured = _driver_measurement(graph, analysis, resources, settings,
                                       collectives.choose(options.collectives))
        decision = decide(graph, analysis, measured, options)
    elif contracts.read_tables(graph):  # split over every machine (planning/proposal.py: table_splits)
        decision = decide(graph, analysis, Measurements(
            launch.workers_per_machine(resources),
            problem="nothing measured; dynamic embeddings split over every machine"),
            options)
    else:
        check_plan(analysis, options)  # a graph it refuses fails before the resources are read
        decision = None
    workers_per_machine = launch.workers_per_machine(resources)
    planned = copy_and_split(graph, analysis, decision.splits if decision else {})[1]
    decisions = [decision]
    if decision is not None and options.trial_steps:
        decisions += [decision.alternative(i) for i in range(len(decision.alternatives))]
    with_servers = any(effective_run_option(options.run_option, planned, d) in ("PS", "HYBRID")
                       for d in decisions)
    machines = [m for m, count in enumerate(workers_per_machine) for _ in range(count)]
    servers = [f"server {m}" for m in range(len(workers_per_machine))] if with_servers else []
    cluster = Cluster(machines, servers, collectives=collectives.choose(options.collectives))
    plans = [make_plan(planned, options, cluster, decision=decision)]
    for alternative in decisions[1:]:
        try:
            plans.append(make_plan(planned, options, cluster, decision=alternative))
        except ParallaxError:  # a rule's plan this graph cannot train: not an alternative
            continue
    if decision is not None and _shards_change(graph, decision):
        plans = [dataclasses.replace(plan, replan_in_workers=True) for plan in plans]
    return plans


def _shards_change(graph: tf.Graph, decision: Decision) -> bool:
    """Whether the decision gives parallax.get_partitioner's calls other shard counts than
    they made in the driver's graph (the workers' graph code reads the decision's)."""
    made = partitioned_variables(graph)
    return any(count != len(made[call].shards) for call, _, count in decision.partitions)


def _first_three(names) -> str:
    names = list(names)
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _driver_measurement(graph: tf.Graph, analysis: GraphAnalysis, resources: str,
                        settings: Settings, library: str) -> Measurements:
    """measure_job's, said as it starts, as it takes seconds; none where the graph cannot be
    measured: the plan is then a rule's, which no link, transport or step changes."""
    unmeasured = unmeasurable(graph, analysis)
    if unmeasured:
        return Measurements(launch.workers_per_machine(resources), problem=unmeasured)
    launch.say("planning: measuring the graph's input and step, the links, TensorFlow's "
               "transport and the collectives before the workers start")
    return measure_job(graph, analysis, resources, settings, library)


def measure_job(graph: tf.Graph, analysis: GraphAnalysis, resources: str,
                settings: Settings, library: str) -> Measurements:
    """The measurement stage: the links between the machines of `resources`, and the probe of
    the graph on the driver (planning/measure.py), with the transport and the collectives
    `library` probed."""
    links, within = launch.probe_links(resources, settings)
    workers_per_machine = launch.workers_per_machine(resources)
    # Whether machines share a kernel, the link between two tells; within one, only its cores.
    machines = links["machines"] if links else within["machines"][:1] if within else None
    return _measured_with_transport(
        graph, analysis, resources, settings, library, workers_per_machine, _links(links),
        _links(within), Cores.of(machines, len(workers_per_machine)) if machines else None)


def _measured_with_transport(graph: tf.Graph, analysis: GraphAnalysis, resources: str,
                             settings: Settings, library: str, *shape) -> Measurements:
    """measure(graph, analysis, *shape), with the transport of `resources` and its collectives
    `library` probed meanwhile, one after the other, while the graph's rows are counted; the
    step is timed once they are done, as beside their processes it takes longer."""
    with concurrent.futures.ThreadPoolExecutor(1) as background:
        transport = background.submit(launch.probe_transport, resources, settings)
        collective = background.submit(launch.probe_collectives, resources, settings, library)
        measured = measure(graph, analysis, *shape,
                           before_timing=lambda: concurrent.futures.wait([transport, collective]))
        measured.transport, measured.collective = transport.result(), collective.result()
    return measured


def _links(probed: Optional[dict]) -> Optional[cost.Links]:
    return (cost.Links(bandwidth=probed["bandwidth"], latency=probed["latency"]) if probed
            else None)
