"""The planner's candidates: the ways a variable may be synchronized and placed, and the run
options' rules, written once here. The plan (job_plan.py) applies a rule where nothing was
measured, the proposal (proposal.py) searches over `methods_for` and times the rules' plans
against its own on the cluster (`RULES`)."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from parallax.planning.cost import ALLGATHER, ALLREDUCE, PS, Method, Shape, Sync, VariableStats
from parallax.planning.problem import Problem

# How each run option synchronizes (a dense variable, a sparse one). AUTO, where it decides
# nothing, follows HYBRID's. PS's rule wins where a step is bound by CPU rather than bytes
# (nmt on shared cores: benchmarks/HISTORY.md), which is why AUTO times the rules too.
RULES: Dict[str, Tuple[Sync, Sync]] = {"AR": (ALLREDUCE, ALLGATHER),
                                      "HYBRID": (ALLREDUCE, PS),
                                      "PS": (PS, PS)}


def rule(run_option: str, sparse: bool) -> Sync:
    """How `run_option` synchronizes a variable (AUTO: when it decided nothing, as HYBRID)."""
    dense_how, sparse_how = RULES["HYBRID" if run_option == "AUTO" else run_option]
    return sparse_how if sparse else dense_how


def rule_name(run_option: str) -> str:
    return f"{'HYBRID' if run_option == 'AUTO' else run_option}'s rule"


def fixed_hows(problem: Problem, run_option: Optional[str] = None) -> Dict[str, Sync]:
    """Each variable's method under `run_option`'s rule (the problem's own by default); none
    under AUTO, which chooses them."""
    run_option = run_option or problem.run_option
    if run_option == "AUTO":
        return {}
    return {name: PS if name in problem.tables else rule(run_option, var.sparse)
            for name, var in problem.variables.items()}


def methods_for(var: VariableStats, problem: Problem, shard_counts: Dict[str, Sequence[int]],
                hows: Dict[str, Sync]) -> List[Method]:
    """What the search may choose for `var`: allreduce for a dense gradient; for a sparse one
    allreduce (as dense, where its rows may be summed by id), allgather, or parameter servers
    in each of `shard_counts[var]` row shards (1 when not given) from each first machine; no
    server where the gradients wait for its updates; only `hows[var]` where given."""
    machines = problem.shape.machines
    if var.name in problem.tables:
        return [Method(PS, tuple(range(machines)))]
    candidates = []
    if not var.sparse or var.name in problem.summable:
        candidates.append(Method(ALLREDUCE))
    if var.sparse:
        candidates.append(Method(ALLGATHER))
    if (var.sparse and var.name not in problem.off_servers) or hows.get(var.name) == PS:
        for k in shard_counts.get(var.name, (1,)):
            candidates += [Method(PS, tuple((first + i) % machines for i in range(k)))
                           for first in range(machines)]
    if var.name in hows:
        candidates = [m for m in candidates if m.how == hows[var.name]]
    return candidates


def rule_methods(problem: Problem, shard_counts: Dict[str, Sequence[int]],
                 hows: Dict[str, Sync]) -> Dict[str, Method]:
    """HYBRID's rule as a plan (`hows` where given): dense variables allreduced, sparse ones on
    servers in their fewest shards (allgathered where no server may hold them), placed by
    `balanced_servers`."""
    plan = {}
    for var in problem.variables.values():
        how = hows.get(var.name) or (
            ALLREDUCE if not var.sparse else ALLGATHER if var.name in problem.off_servers
            else PS)
        shards = min(shard_counts.get(var.name, (1,))) if how == PS else 0
        if var.name in problem.tables:
            how, shards = PS, problem.shape.machines
        plan[var.name] = Method(how, tuple(j % problem.shape.machines for j in range(shards)))
    return balanced_servers(plan, problem.variables, problem.shape)


def balance_by_bytes(sizes: Sequence[Tuple[str, int]], servers: int,
                     held: Optional[Sequence[float]] = None) -> Dict[str, int]:
    """HYBRID's rule of placement for variables of (name, bytes) on `servers` servers that
    already hold `held` bytes (none): largest first onto the server holding the fewest bytes
    so far (of equals, the first), which balances the bytes each server moves; equal shards
    of a table with nothing else between them alternate."""
    load = list(held) if held is not None else [0] * max(servers, 1)
    placed = {}
    for name, nbytes in sorted(sizes, key=lambda item: -item[1]):
        placed[name] = load.index(min(load))
        load[placed[name]] += nbytes
    return placed


def balanced_servers(choice: Dict[str, Method], stats: Dict[str, VariableStats],
                     shape: Shape) -> Dict[str, Method]:
    """`choice` with its variables on one server each placed by balance_by_bytes, beside the
    shards of those split over several servers."""
    single = [name for name, method in choice.items()
              if method.how == PS and len(method.servers) == 1]
    held = [0.0] * shape.machines
    for name, method in choice.items():
        if method.how == PS and len(method.servers) > 1:
            for server in method.servers:
                held[server] += stats[name].nbytes / len(method.servers)
    servers = balance_by_bytes([(name, stats[name].nbytes) for name in single],
                               shape.machines, held)
    return {**choice, **{name: Method(PS, (servers[name],)) for name in single}}
