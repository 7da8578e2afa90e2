"""What each run option's plan would cost on a cluster: the answer `python -m parallax.plan`
prints, made from the script's graph and what the driver measured (on this machine, for a
cluster that need not exist) by the planner's own parts. One JSON-ready dict."""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import tensorflow as tf

from parallax.config import PlanOptions
from parallax.planning import cost, explanation
from parallax.planning.analysis import GraphAnalysis
from parallax.planning.measure import Measurements
from parallax.planning.planner import pose
from parallax.planning.problem import Compute, Problem
from parallax.planning.proposal import Proposal, by_rule, propose
from parallax.planning.proposal import terms as rated

RUN_OPTIONS = ("AR", "PS", "HYBRID", "AUTO")


def report(graph: tf.Graph, analysis: GraphAnalysis, measured: Measurements,
           options: PlanOptions, step: Optional[float], batch: Optional[int],
           batch_problem: Optional[str], links_given: bool = False,
           fed: Optional[dict] = None) -> dict:
    """Each run option's plan for what was `measured`; `step`: one worker's step alone in
    seconds, in place of the measured one (another machine's, an accelerator's); `batch`: the
    examples of one worker's batch (None: `batch_problem` says why it is not known);
    `links_given`: the links are the user's, not measured; `fed`: whose feeds were measured,
    for a graph the script feeds (runtime.query_runner.FedSteps)."""
    problems, searched = {}, {}
    for run_option in RUN_OPTIONS:
        asked = dataclasses.replace(options, run_option=run_option)
        searched[run_option] = asked.decides  # else the job runs the rule as it is
        problem = pose(graph, analysis, measured, asked)
        if step is not None:  # each worker alone on its device: its cores' sharing is not priced
            problem = dataclasses.replace(problem, compute=Compute(step, 0.0))
        if links_given:
            problem = dataclasses.replace(problem, links_measured=False)
        problems[run_option] = problem
    first = problems["AUTO"]
    plans = {name: _plan(problem, propose(problem) if searched[name] else by_rule(problem),
                         batch, auto=name == "AUTO") for name, problem in problems.items()}
    answer = {
        "cluster": {"machines": first.shape.machines,
                    "workers_per_machine": first.shape.workers_per_machine,
                    "link": dataclasses.asdict(first.links),
                    "link_measured": not links_given,
                    "inside_link": dataclasses.asdict(first.inside) if first.inside else None,
                    "cores": dataclasses.asdict(first.cores)},
        "terms": _terms(first, step),
        "batch": {"per_worker": batch, "combined": batch * first.shape.workers}
        if batch else {"unknown": batch_problem},
        "variables": [_variable(var, analysis) for var in first.variables.values()],
        "plans": plans,
    }
    if fed:
        answer["fed"] = {**fed, "workers": first.shape.workers}
    return answer


def _terms(problem: Problem, step: Optional[float]) -> Dict[str, object]:
    """The measured terms every plan's prediction rests on."""
    if problem.unmeasured:
        return {"unmeasured": problem.unmeasured}
    probed = {name: dataclasses.asdict(terms) if terms else None
              for name, terms in (("transport", problem.transport),
                                  ("collectives", problem.collective))}
    terms = {"compute": "given (--step-ms)" if step is not None else "measured on this machine"}
    if problem.compute is None:
        terms["compute"] = f"not measured: {problem.compute_problem}"
    else:
        terms.update(step_alone_ms=problem.compute.alone * 1e3,
                     step_cpu_ms=problem.compute.cpu * 1e3,
                     worker_compute_ms=problem.worker_compute * 1e3,
                     workers_sharing_cores=problem.sharing)
    return {**terms, **probed}


def _variable(var: cost.VariableStats, analysis: GraphAnalysis) -> dict:
    shown = {"name": var.name, "kind": "sparse" if var.sparse else "dense",
             "bytes": var.nbytes}
    if var.sparse and var.rows:
        shown.update(rows_per_worker=var.rows,
                     alpha=var.distinct(1) / var.table_rows if var.table_rows else None)
    info = analysis.variables.get(var.name)
    if info is not None:
        shown["shape"] = list(info.shape)
    return shown


def _plan(problem: Problem, proposal: Proposal, batch: Optional[int], auto: bool = False
          ) -> dict:
    """A proposal as the report shows it: each variable's method (its shards' servers), the
    bytes on the busiest link direction, the predicted step, its terms and the largest. AUTO
    keeps the plan whose steps were fastest in its trials: shown, the one predicted fastest of
    its own and those it times."""
    note, chosen = explanation.note(problem, proposal), proposal
    faster = [a for a in proposal.alternatives if auto and a.step < proposal.step]
    if faster:
        kept = min(faster, key=lambda a: a.step)
        note += f"; predicted the fastest of the plans AUTO times: {kept.name}"
        proposal = dataclasses.replace(proposal, methods=kept.methods, step=kept.step,
                                       machine_stages=kept.machine_stages)
    shape = problem.shape
    traffic = [[0.0, 0.0] for _ in range(shape.machines)]
    for name, method in proposal.methods.items():
        sent = cost.link_bytes(proposal.stats[name], method, shape,
                               hierarchical_allreduce=bool(proposal.machine_stages),
                               **problem.priced)
        traffic = [[a[0] + b[0], a[1] + b[1]] for a, b in zip(traffic, sent)]
    shown = {
        "methods": {name: {"how": method.how.value, "servers": list(method.servers)}
                    for name, method in proposal.methods.items()},
        "machine_stages": proposal.machine_stages,
        "note": note,
    }
    if proposal.step is None:
        return shown
    shown["busiest_link_bytes"] = {"sent": max(t[0] for t in traffic),
                                   "received": max(t[1] for t in traffic)}
    terms = rated(problem, proposal.methods, proposal.stats, bool(proposal.machine_stages))
    shown.update(step_ms=proposal.step * 1e3,
                 terms_ms={term: seconds * 1e3 for term, seconds in terms.items()},
                 bound_by=max(terms, key=terms.get))
    if batch:
        shown["examples_per_second"] = batch * shape.workers / proposal.step
    if chosen.alternatives or chosen.beyond_error:  # against the cost model's own choice
        shown["rules"] = {a.name: {"step_ms": a.step * 1e3,
                                   "margin": explanation.margin(chosen, a.step),
                                   "timed": a in chosen.alternatives}
                          for a in chosen.alternatives + chosen.beyond_error}
    return shown
