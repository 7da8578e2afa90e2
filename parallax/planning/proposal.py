"""The planner's proposal: from a Problem, the plan the rating (cost.py) predicts fastest —
each variable's method and servers, the shards of get_partitioner's variables, the variables
the workers split, allreduce in one ring or in machine stages — and the run options' rules'
plans, which AUTO may time against it on the cluster. Without measured rows, the run
option's rule (HYBRID's for AUTO)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from parallax.planning import cost
from parallax.planning.candidates import (RULES, balanced_servers, fixed_hows, methods_for,
                                          rule, rule_methods)
from parallax.planning.cost import PS, Method, Sync, VariableStats
from parallax.planning.problem import Problem, shard_name

BEAM = 16  # partial plans kept while choosing
# A variable the workers split (rewriting/split_variables.py) costs, per lookup, a partition of
# the ids and a stitch of the rows, and per step a message and an update per shard, which the
# model does not price: a plan that splits must be predicted this much faster.
SPLIT_MARGIN = 0.05
# The model does not see when in the step each sparse gradient is ready: a table's shards over
# the servers keep both directions of a link busy as its rows are pushed, which HYBRID's
# placement does (measured on nmt: benchmarks/HISTORY.md).
PLACEMENT_MARGIN = 0.05
# The predicted step's largest shortfall of the measured one in the benchmark's runs
# (docs/benchmarks.md: 0-7% short at 100 Mbit, 13-74% at 1 and 10 Gbit, where the
# synchronization's CPU is not priced). A plan predicted slower than the proposal's by more than
# that allows (its step x 1 / (1 - 0.74), +285%) cannot be the faster one however the errors
# fall: it is not timed on the cluster.
MODEL_SHORTFALL = 0.74
TRUSTED_MARGIN = 1 / (1 - MODEL_SHORTFALL) - 1
SEARCHED = "the search's plan"  # an alternative's name, beside the rules'


class PartitionCount(NamedTuple):
    """The shards the search gave a call of parallax.get_partitioner (a tuple, as the
    partitioner's readers unpack it)."""
    call: int
    variable: str
    shards: int


@dataclasses.dataclass
class Alternative:
    name: str  # a run option's rule
    methods: Dict[str, Method]
    machine_stages: bool
    step: float  # predicted seconds


@dataclasses.dataclass
class Proposal:
    methods: Dict[str, Method]  # per variable of the job's graph (shards apart)
    stats: Dict[str, VariableStats]  # per variable of the job's graph
    machine_stages: Optional[bool]  # None: not decided (no rows measured)
    partitions: List[PartitionCount]
    splits: Dict[str, int]  # variables the workers split, in so many shards
    whole: Dict[str, str]  # why each other sparse variable is kept whole
    step: Optional[float] = None  # predicted seconds (with the compute when measured)
    alternatives: List[Alternative] = dataclasses.field(default_factory=list)  # to time
    # The rules' plans predicted slower by more than the model's error: not timed
    beyond_error: List[Alternative] = dataclasses.field(default_factory=list)
    chosen_rule: Optional[str] = None  # the rule's plan predicted faster than the search's
    searched: Optional[Alternative] = None  # then, the search's plan


def propose(problem: Problem, alternatives: bool = True) -> Proposal:
    """The fastest plan predicted for `problem`; with `alternatives`, under AUTO, the rules'
    plans too, with the same shards, where they differ from it."""
    problem = with_table_ids(problem)
    if problem.unmeasured:
        return by_rule(problem)
    hows = fixed_hows(problem)
    counts = _partition_counts(problem)
    chosen, staged = fastest(problem, counts, hows)
    splits, whole = {}, dict(problem.whole)
    if problem.split is not False:
        (chosen, staged), splits, whole = _choose_splits(problem, counts, hows, (chosen, staged))
    splits.update(table_splits(problem))
    partitions = [PartitionCount(call, p.name, len(chosen[p.name].servers) or p.min_shards)
                  for call, p in enumerate(problem.partitions)]
    shards = {**{name: count for _, name, count in partitions}, **splits}
    methods, stats = apart(chosen, problem.variables, shards)
    proposal = Proposal(methods, stats, staged, partitions, splits, whole,
                        predicted(problem, methods, stats, staged))
    others = None
    if problem.run_option == "AUTO" and problem.whole_step_priced:
        proposal, others = by_whole_step(proposal, _alternatives(problem, proposal, shards))
    if alternatives and unsure(problem, proposal) and not problem.untimed:
        trusted = TRUSTED_MARGIN if problem.trial_margin is None else problem.trial_margin
        for alternative in others if others is not None else _alternatives(
                problem, proposal, shards):
            beyond = alternative.step > proposal.step * (1 + trusted)
            (proposal.beyond_error if beyond else proposal.alternatives).append(alternative)
    return proposal


def by_whole_step(proposal: Proposal, rules: List[Alternative]
                  ) -> Tuple[Proposal, List[Alternative]]:
    """The search compares communication, which misses the CPU a plan's synchronization
    takes on shared cores (inside one machine, communication is nearly free and every table
    allreduced as dense looks fastest): where the whole step is priced, the rules' plan
    predicted fastest in it replaces the search's, which is then one of the others."""
    best = min(rules, key=lambda alternative: alternative.step, default=None)
    if best is None or best.step >= proposal.step:
        return proposal, rules
    searched = Alternative(SEARCHED, proposal.methods, proposal.machine_stages, proposal.step)
    return (dataclasses.replace(proposal, methods=best.methods,
                                machine_stages=best.machine_stages, step=best.step,
                                chosen_rule=best.name, searched=searched),
            [alternative for alternative in rules if alternative is not best] + [searched])


def unsure(problem: Problem, proposal: Proposal) -> bool:
    """Whether AUTO times the rules' plans against its own on the cluster: where a plan has
    servers, or a sparse table is allreduced or allgathered, which servers may serve faster
    where a step is bound by CPU rather than bytes (benchmarks/HISTORY.md: tags). A dense
    model's allreduce is not."""
    return problem.run_option == "AUTO" and (
        any(m.how == PS for m in proposal.methods.values())
        or any(var.sparse for var in problem.variables.values()))


def _partition_counts(problem: Problem) -> Dict[str, range]:
    """The shard counts the search may give each get_partitioner variable: from its least
    to the number of machines."""
    return {p.name: range(p.min_shards, max(p.min_shards, problem.shape.machines) + 1)
            for p in problem.partitions}


def predicted(problem: Problem, methods: Dict[str, Method], stats: Dict[str, VariableStats],
              staged: bool) -> float:
    """Seconds of a step of a whole plan: its communication, and its compute where measured."""
    return sum(terms(problem, methods, stats, staged).values())


def terms(problem: Problem, methods: Dict[str, Method], stats: Dict[str, VariableStats],
          staged: bool) -> Dict[str, float]:
    """The rating's terms of a whole plan's step (cost.step_terms)."""
    compute = problem.worker_compute
    return cost.step_terms(methods, stats, problem.shape, problem.links,
                           compute=compute or 0.0,
                           alone=problem.compute.alone if problem.compute else None,
                           transport=problem.transport, budget=problem.budget,
                           collective=problem.collective,
                           hierarchical_allreduce=staged, **problem.priced)


def fastest(problem: Problem, shard_counts: Dict[str, Sequence[int]], hows: Dict[str, Sync]
            ) -> Tuple[Dict[str, Method], bool]:
    """The plan of least predicted communication, and whether its allreduces go in machine
    stages: as the problem says, or the faster of the best plan with a ring and the best with
    stages (cheaper allreduces may turn a sparse variable to allreduce)."""
    stages = (False, True) if problem.machine_stages is None else (problem.machine_stages,)
    best = None
    for staged in stages:
        choice = search(problem, shard_counts, hows, staged)
        seconds = _step(problem, choice, staged)
        if best is None or seconds < best[0]:
            best = (seconds, choice, staged)
    return best[1], best[2]


def _step(problem: Problem, choice: Dict[str, Method], staged: bool) -> float:
    """What the search compares plans by: their communication. The synchronization's CPU (the
    cores term) prices a whole plan's step, which then chooses among the search's plan and
    the rules' (by_whole_step)."""
    return cost.step_time(choice, problem.variables, problem.shape, problem.links,
                          hierarchical_allreduce=staged, **problem.priced)


def search(problem: Problem, shard_counts: Dict[str, Sequence[int]], hows: Dict[str, Sync],
            staged: bool) -> Dict[str, Method]:
    """A beam search: variables are decided one at a time, dense ones first (their allreduce,
    and its latency, is then paid for), then sparse ones, largest first, keeping the BEAM
    partial plans of least predicted communication. A variable's best method depends on the
    others' (two tables balance on two servers where either alone would rather be
    allgathered), so the greedy choice of one would miss them. Of plans equally fast: the
    fewest shards, then the servers holding the most even bytes. The rule's plan replaces the
    beam's where it is faster, and HYBRID's placement for the variables on one server each
    replaces the plan's unless it is predicted more than PLACEMENT_MARGIN slower."""
    shape, options = problem.shape, {"hierarchical_allreduce": staged, **problem.priced}
    # A partial plan: (its methods, their traffic, the longest chain of messages, the bytes
    # each machine serves).
    beam = [((), cost.no_traffic(shape), 0, (0.0,) * shape.machines)]
    for var in sorted(problem.variables.values(), key=lambda v: (v.sparse, -v.nbytes)):
        extended = []
        for method in methods_for(var, problem, shard_counts, hows):
            traffic = cost.link_phases(var, method, shape, **options)
            chain = cost.messages(var, method, shape)
            for choice, phases, rounds, held in beam:
                serving = list(held)
                for server in method.servers:
                    serving[server] += var.nbytes / len(method.servers)
                extended.append((choice + ((var.name, method),), cost.added(phases, traffic),
                                 max(rounds, chain), tuple(serving)))
        extended.sort(key=lambda plan: (
            round(cost.communication(plan[1], plan[2], problem.links) * 1e9),  # ns: any order
            sum(len(method.servers) for _, method in plan[0]), max(plan[3]),
            [method.servers for _, method in plan[0]]))
        beam = extended[:BEAM]
    best = dict(beam[0][0])
    # The beam keeps partial plans that look fast alone: it can drop the tables that balance
    # only together (4 shards on 4 servers, each alone predicted slower than an allgather),
    # or every table allgathered.
    rules = [rule_methods(problem, shard_counts, hows)]
    if not hows:
        rules.append({name: Method(rule("AR", var.sparse)) for name, var in
                      problem.variables.items()})
    for by_rule in rules:
        if _step(problem, by_rule, staged) < _step(problem, best, staged):
            best = by_rule
    balanced = balanced_servers(best, problem.variables, shape)
    if _step(problem, balanced, staged) <= (1 + PLACEMENT_MARGIN) * _step(problem, best, staged):
        return balanced
    return best


def _split_step(problem: Problem, choice: Dict[str, Method], staged: bool) -> float:
    """What a split is weighed by: where the transport was probed, the whole predicted step,
    as a split multiplies a table's messages, which only the transport's terms price; else
    communication, as the search."""
    if problem.transport is None:
        return _step(problem, choice, staged)
    return predicted(problem, choice, problem.variables, staged)


def _choose_splits(problem: Problem, counts, hows, whole_plan):
    """The plan (methods, machine stages) with the variables the user did not partition split
    where the rating predicts it pays (with problem.split True, every one a server holds, over
    every machine), those splits, and why each other sparse variable is kept whole.
    `whole_plan` is the plan without splits."""
    machines = problem.shape.machines
    whole = dict(problem.whole)
    if problem.split:  # those the plan puts on a server; the others keep their method
        elsewhere = {name: whole_plan[0][name].how for name in problem.splittable
                     if whole_plan[0][name].how != PS}
        whole.update({name: f"not on a server: {how}" for name, how in elsewhere.items()})
        more = {name: range(machines, machines + 1) for name in problem.splittable
                if name not in elsewhere}
    else:
        more = {name: range(1, machines + 1) for name in problem.splittable}
    if not more:
        return whole_plan, {}, whole
    with_splits = fastest(problem, {**counts, **more}, hows)
    splits = {name: len(with_splits[0][name].servers) for name in more
              if len(with_splits[0][name].servers) > 1}
    pays = splits and _split_step(problem, *with_splits) * (1 + SPLIT_MARGIN) < _split_step(
        problem, *whole_plan)
    if splits and (problem.split or pays):
        return with_splits, splits, whole
    return whole_plan, {}, whole


def with_table_ids(problem: Problem) -> Problem:
    """`problem` with its dynamic embeddings' ids priced: the measurement sees a table's
    variable as any sparse one, whose rows the workers know (cost.VariableStats.id_bytes)."""
    return dataclasses.replace(problem, variables={
        name: dataclasses.replace(var, id_bytes=cost.ID_BYTES) if name in problem.tables
        else var for name, var in problem.variables.items()})


def table_splits(problem: Problem) -> Dict[str, int]:
    """Dynamic embeddings' variables, split over every machine (one machine: whole)."""
    machines = problem.shape.machines
    return dict.fromkeys(problem.tables, machines) if machines > 1 else {}


def apart(chosen: Dict[str, Method], variables: Dict[str, VariableStats],
          shards: Dict[str, int]) -> Tuple[Dict[str, Method], Dict[str, VariableStats]]:
    """Methods and statistics per shard of the variables in `shards` (partitioned, or split
    by the workers): k shards, the jth on the jth server chosen; each 1/k of the variable."""
    methods, stats = dict(chosen), dict(variables)
    for name, count in shards.items():
        method, whole = methods.pop(name), stats.pop(name)
        for j in range(count):
            shard = shard_name(name, j)
            methods[shard] = Method(method.how, method.servers[j:j + 1])
            stats[shard] = dataclasses.replace(
                whole, name=shard, nbytes=whole.nbytes // count,
                rows=None if not whole.sparse else whole.rows // count,
                unique=tuple(u // count for u in whole.unique), update=whole.update / count,
                table_rows=whole.table_rows // count)
    return methods, stats


def _alternatives(problem: Problem, proposal: Proposal, shards: Dict[str, int]
                  ) -> List[Alternative]:
    """The rules' plans with the proposal's shards, where they differ from it: a rule that
    would put on a server a variable the gradients wait for is none."""
    fixed = {name: range(count, count + 1) for name, count in shards.items()}
    counts = _partition_counts(problem)
    found = []
    for run_option in RULES:
        hows = {name: rule(run_option, var.sparse) for name, var in problem.variables.items()}
        if problem.off_servers & {name for name, how in hows.items() if how == PS} or any(
                hows[name] != PS for name in problem.tables):
            continue
        choice, staged = fastest(problem, {**counts, **fixed}, hows)
        methods = apart(choice, problem.variables, shards)[0]
        if methods != proposal.methods:
            found.append(Alternative(f"{run_option}'s rule", methods, staged,
                                     predicted(problem, methods, proposal.stats, staged)))
    return found


def by_rule(problem: Problem) -> Proposal:
    """The run option's rule, HYBRID's for AUTO, as a job runs it without a search: servers
    placed by bytes, the splittable variables it puts on servers split over every machine
    where problem.split asks, and where the rows were measured, the predicted step (machine
    stages as the plan chooses them without a search)."""
    problem = with_table_ids(problem)
    methods = {name: Method(how, (0,) if how == PS else ())  # placed below, by bytes
               for name, var in problem.variables.items()
               for how in [rule(problem.run_option, var.sparse)]}
    for name in problem.tables:
        methods[name] = Method(PS, tuple(range(problem.shape.machines)))
    splits, whole = table_splits(problem), dict(problem.whole)
    if problem.split:
        on_servers = [name for name in problem.splittable
                      if methods[name].how == PS and name not in problem.tables]
        if problem.shape.machines < 2:
            whole.update(dict.fromkeys(on_servers, "the job has one machine"))
        else:
            splits.update(dict.fromkeys(on_servers, problem.shape.machines))
    for name, count in splits.items():
        methods[name] = Method(PS, tuple(range(count)))
    methods = balanced_servers(methods, problem.variables, problem.shape)
    methods, stats = apart(methods, problem.variables, splits)
    if problem.unmeasured:
        return Proposal(methods, stats, None, [], splits, whole)
    staged = problem.machine_stages
    if staged is None:
        staged = cost.machine_stages_pay(
            sum(stats[name].nbytes for name, m in methods.items() if m.how == cost.ALLREDUCE),
            problem.shape, problem.links)
    return Proposal(methods, stats, staged, [], splits, whole,
                    predicted(problem, methods, stats, staged))
