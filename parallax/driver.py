"""The driver: the process the user started. It makes the plan once — analysis, measurement
(AUTO, search_partitions, split_variables), the search, the split decisions, the method and
place of every variable — and launches the job with it (launch.py); it does not return."""
from __future__ import annotations

from typing import NoReturn

import tensorflow as tf

from parallax import contracts, launch
from parallax.cluster import Cluster
from parallax.config import Config
from parallax.planning import cost
from parallax.planning.analysis import GraphAnalysis
from parallax.planning.measure import Measurements, measure
from parallax.planning.plan import Plan, check_plan, effective_run_option, make_plan
from parallax.planning.search import choose
from parallax.rewriting.split_variables import copy_and_split


def run(graph: tf.Graph, analysis: GraphAnalysis, resources: str, config: Config) -> NoReturn:
    plan = make_job_plan(graph, analysis, resources, config)
    launch.run_driver(resources, config, bool(plan.cluster.servers), plan.uses_horovod,
                      contracts.plan_env(plan.to_text(),
                                         plan.decision.partitions if plan.decision else []))


def make_job_plan(graph: tf.Graph, analysis: GraphAnalysis, resources: str,
                  config: Config) -> Plan:
    """The job's one plan, for the cluster of `resources` (its shape: the workers find the
    servers' addresses in their own environment)."""
    if decides(config):
        decision = choose(graph, analysis, measure_job(graph, analysis, resources, config),
                          config.run_option, config.search_partitions,
                          config.hierarchical_allreduce, config.split_variables)
    else:
        check_plan(analysis, config)  # a graph it refuses fails before the resources are read
        decision = None
    workers_per_machine = launch.workers_per_machine(resources)
    planned = copy_and_split(graph, analysis, decision.splits if decision else [])[1]
    run_option = effective_run_option(config.run_option, planned, decision)
    machines = [m for m, count in enumerate(workers_per_machine) for _ in range(count)]
    servers = ([f"server {m}" for m in range(len(workers_per_machine))]
               if run_option in ("PS", "HYBRID") else [])
    return make_plan(planned, config, Cluster(machines, servers), decision=decision)


def measure_job(graph: tf.Graph, analysis: GraphAnalysis, resources: str,
                config: Config) -> Measurements:
    """The measurement stage: the links between the machines of `resources`, and the probe of
    the graph on the driver (planning/measure.py)."""
    links, within = launch.probe_links(resources, config)
    return measure(graph, analysis, launch.workers_per_machine(resources),
                   cost.Links(**links) if links else None,
                   cost.Links(**within) if within else None)


def decides(config: Config) -> bool:
    """Whether the driver measures and searches before planning (planning/search.py)."""
    return config.run_option == "AUTO" or config.search_partitions or bool(
        config.split_variables)
