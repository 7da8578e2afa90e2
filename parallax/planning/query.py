"""What each run option's plan would cost on a cluster: the answer `python -m parallax.plan`
prints, made from the script's graph and what the driver measured (on this machine, for a
cluster that need not exist) by the planner's own parts. A typed `Answer`, which the script
writes and the command reads through contracts.to_wire/from_wire (its JSON is the command's
--json)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import tensorflow as tf

from parallax.config import PlanOptions
from parallax.errors import ParallaxError
from parallax.planning import cost, explanation
from parallax.planning.analysis import GraphAnalysis
from parallax.planning.measure import Measurements
from parallax.planning.planner import pose
from parallax.planning.problem import Compute, Cores, Problem
from parallax.planning.proposal import Proposal, by_rule, propose
from parallax.planning.proposal import terms as rated

RUN_OPTIONS = ("AR", "PS", "HYBRID", "AUTO")


@dataclasses.dataclass(frozen=True)
class ClusterAsked:
    machines: int
    workers_per_machine: int
    link: cost.Links  # between machines
    link_measured: bool
    inside_link: Optional[cost.Links]  # within a machine, where given or measured
    cores: Cores


@dataclasses.dataclass(frozen=True)
class Terms:
    """The measured terms every plan's prediction rests on; only `unmeasured` where the
    variables' rows were not measured."""
    unmeasured: Optional[str] = None  # why not
    compute: Optional[str] = None  # where one worker's step comes from, or why it does not
    step_alone_ms: Optional[float] = None
    step_cpu_ms: Optional[float] = None
    worker_compute_ms: Optional[float] = None  # the machine's cores shared
    workers_sharing_cores: Optional[int] = None
    transport: Optional[cost.Transport] = None  # as probed
    collectives: Optional[cost.Collective] = None


@dataclasses.dataclass(frozen=True)
class Batch:
    per_worker: Optional[int] = None  # examples
    combined: Optional[int] = None
    unknown: Optional[str] = None  # why the batch is not known


@dataclasses.dataclass(frozen=True)
class FedSteps:
    """Whose feeds were measured, for a graph the script feeds (runtime/query_runner.py): the
    script's first `training_steps` (reused in turn where fewer than the cluster's
    `workers`), and how many of its runs before them were not steps."""
    training_steps: int
    other_runs: int
    workers: int


@dataclasses.dataclass(frozen=True)
class VariableShown:
    name: str
    kind: str  # "sparse" or "dense"
    bytes: int
    rows_per_worker: Optional[int] = None  # a sparse gradient's, where measured
    alpha: Optional[float] = None  # the share of the table one worker's batch touches
    shape: Optional[List[int]] = None


@dataclasses.dataclass(frozen=True)
class LinkBytes:
    sent: float
    received: float


@dataclasses.dataclass(frozen=True)
class RuleShown:
    """A rule's plan AUTO weighs against the cost model's choice."""
    step_ms: float
    margin: float  # over the cost model's choice's predicted step
    timed: bool  # on the cluster: not predicted slower by more than the model errs


@dataclasses.dataclass(frozen=True)
class PlanShown:
    """A run option's plan: each variable's method (its shards' servers), and where the step
    was predicted, the bytes on the busiest link direction, the step, its terms and the
    largest."""
    methods: Dict[str, cost.Method]
    machine_stages: Optional[bool]
    note: str
    busiest_link_bytes: Optional[LinkBytes] = None
    step_ms: Optional[float] = None
    terms_ms: Optional[Dict[str, float]] = None
    bound_by: Optional[str] = None
    examples_per_second: Optional[float] = None
    rules: Optional[Dict[str, RuleShown]] = None  # AUTO's, against its own choice
    refused: Optional[str] = None  # why the run option cannot run the graph (then no methods)


@dataclasses.dataclass(frozen=True)
class Answer:
    cluster: ClusterAsked
    terms: Terms
    batch: Batch
    variables: List[VariableShown]
    plans: Dict[str, PlanShown]  # by run option, in RUN_OPTIONS' order
    fed: Optional[FedSteps] = None


def report(graph: tf.Graph, analysis: GraphAnalysis, measured: Measurements,
           options: PlanOptions, step: Optional[float], batch: Optional[int],
           batch_problem: Optional[str], links_given: bool = False,
           fed: Optional[FedSteps] = None) -> Answer:
    """Each run option's plan for what was `measured`; `step`: one worker's step alone in
    seconds, in place of the measured one (another machine's, an accelerator's); `batch`: the
    examples of one worker's batch (None: `batch_problem` says why it is not known);
    `links_given`: the links are the user's, not measured; `fed`: whose feeds were measured,
    for a graph the script feeds."""
    problems, plans = {}, {}
    for name in RUN_OPTIONS:
        try:
            problem = problems[name] = _problem(graph, analysis, measured, options, name, step,
                                                links_given)
        except ParallaxError as refused:  # AR, of a dynamic embedding, which servers hold
            plans[name] = PlanShown({}, None, "", refused=str(refused))
            continue
        plans[name] = _plan(problem, propose(problem) if _searched(options, name)
                            else by_rule(problem), batch, auto=name == "AUTO")
    first = problems["AUTO"]  # AUTO plans any graph
    return Answer(
        cluster=ClusterAsked(first.shape.machines, first.shape.workers_per_machine,
                             first.links, not links_given, first.inside, first.cores),
        terms=_terms(first, step),
        batch=Batch(batch, batch * first.shape.workers) if batch else Batch(
            unknown=batch_problem),
        variables=[_variable(var, analysis) for var in first.variables.values()],
        plans=plans, fed=fed)


def _searched(options: PlanOptions, run_option: str) -> bool:
    """Whether the job searches the plan of `run_option`, else it runs the rule as it is."""
    return dataclasses.replace(options, run_option=run_option).decides


def _problem(graph: tf.Graph, analysis: GraphAnalysis, measured: Measurements,
             options: PlanOptions, run_option: str, step: Optional[float],
             links_given: bool) -> Problem:
    problem = pose(graph, analysis, measured, dataclasses.replace(options, run_option=run_option))
    if step is not None:  # each worker alone on its device: its cores' sharing is not priced
        problem = dataclasses.replace(problem, compute=Compute(step, 0.0))
    if links_given:
        problem = dataclasses.replace(problem, links_measured=False)
    return problem


def _terms(problem: Problem, step: Optional[float]) -> Terms:
    if problem.unmeasured:
        return Terms(unmeasured=problem.unmeasured)
    probed = dict(transport=problem.transport, collectives=problem.collective)
    if problem.compute is None:
        return Terms(compute=f"not measured: {problem.compute_problem}", **probed)
    return Terms(compute="given (--step-ms)" if step is not None else "measured on this machine",
                 step_alone_ms=problem.compute.alone * 1e3,
                 step_cpu_ms=problem.compute.cpu * 1e3,
                 worker_compute_ms=problem.worker_compute * 1e3,
                 workers_sharing_cores=problem.sharing, **probed)


def _variable(var: cost.VariableStats, analysis: GraphAnalysis) -> VariableShown:
    measured = {}
    if var.sparse and var.rows:
        measured = dict(rows_per_worker=var.rows,
                        alpha=var.distinct(1) / var.table_rows if var.table_rows else None)
    info = analysis.variables.get(var.name)
    return VariableShown(var.name, "sparse" if var.sparse else "dense", var.nbytes,
                         shape=list(info.shape) if info is not None else None, **measured)


def _plan(problem: Problem, proposal: Proposal, batch: Optional[int], auto: bool = False
          ) -> PlanShown:
    """A proposal as the report shows it. AUTO keeps the plan whose steps were fastest in its
    trials: shown, the one predicted fastest of its own and those it times."""
    note, chosen = explanation.note(problem, proposal), proposal
    faster = [a for a in proposal.alternatives if auto and a.step < proposal.step]
    if faster:
        kept = min(faster, key=lambda a: a.step)
        note += f"; predicted the fastest of the plans AUTO times: {kept.name}"
        proposal = dataclasses.replace(proposal, methods=kept.methods, step=kept.step,
                                       machine_stages=kept.machine_stages)
    shown = PlanShown(proposal.methods, proposal.machine_stages, note)
    if proposal.step is None:
        return shown
    terms = rated(problem, proposal.methods, proposal.stats, bool(proposal.machine_stages))
    rules = {a.name: RuleShown(a.step * 1e3, explanation.margin(chosen, a.step),
                               a in chosen.alternatives)
             for a in chosen.alternatives + chosen.beyond_error}
    return dataclasses.replace(
        shown, busiest_link_bytes=_busiest_link(problem, proposal),
        step_ms=proposal.step * 1e3,
        terms_ms={term: seconds * 1e3 for term, seconds in terms.items()},
        bound_by=max(terms, key=terms.get),
        examples_per_second=batch * problem.shape.workers / proposal.step if batch else None,
        rules=rules or None)  # against the cost model's own choice


def _busiest_link(problem: Problem, proposal: Proposal) -> LinkBytes:
    """The most bytes a step of `proposal` sends on one machine's link, and receives."""
    traffic = [[0.0, 0.0] for _ in range(problem.shape.machines)]
    for name, method in proposal.methods.items():
        sent = cost.link_bytes(proposal.stats[name], method, problem.shape,
                               hierarchical_allreduce=bool(proposal.machine_stages),
                               **problem.priced)
        traffic = [[a[0] + b[0], a[1] + b[1]] for a, b in zip(traffic, sent)]
    return LinkBytes(max(t[0] for t in traffic), max(t[1] for t in traffic))
